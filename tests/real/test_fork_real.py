"""Fork safety and the exec-only child on the real vLLM 0.29.0 under -O (issue
20 items 2 and 11; the stand-in matrix, plain, -O and -OO, is
tests/unit/test_fork_safety.py).

One healthy child of the fault tier's real -O driver (tests/real/fault_child.py,
``fork_safety``: the shim on PYTHONPATH, vLLM imported) forks while another
thread holds wrapt's import hook lock (a lock a fork hung on), then -O
parity's (tests/standins/forks.py; every lock: the unit test). Each forked
child must finish in bounded time, import the KDA target nobody imported (its
hook and settle run; -O parity's finder loads it), construct a VllmConfig,
get the inner-DP getter refusing as plain Python does (parity loaded its
module with plain bytecode), and read every state as the parent does. A Popen with a
preexec_fn logs nothing; a plain fork child logs its own line.
"""

from __future__ import annotations

import pytest
from test_fault_tier import driver

from helpers import summaries

pytestmark = pytest.mark.releases("0.29.0")


def test_fork_while_each_lock_is_held_on_real_vllm(release):
    case = driver("real", "O", release)["fork"]
    assert case["import_error"] is None, case["import_traceback"]
    out = case["fork"]
    parent = out["parent"]
    assert parent["late_imported"] is False
    refused = ["AssertionError", "inner dp world group is not initialized"]
    assert parent["getter"] == refused  # under -O: parity's plain bytecode
    assert parent["states"]["kda_overlong_rows"] == "applied"
    assert [r["lock"] for r in out["results"]] == ["wrapt.importer._post_import_hooks_lock",
                                                   "kimi_hotfix.runtime.parity._lock"]
    for result in out["results"]:
        assert result.get("error") is None, result
        assert result["hung"] is False, f"the child blocked on {result['lock']}"
        assert result["exit"] == 0, result
        child = result["child"]
        assert child["ok"] is True, (result["lock"], child)
        assert child["first_call"] == ["ok", "'VllmConfig'"], (result["lock"], child)
        assert child["getter"] == refused, (result["lock"], child)
        assert child["states"] == parent["states"], result["lock"]


def test_popen_preexec_child_logs_nothing_on_real_vllm(release):
    case = driver("real", "O", release)["fork"]
    out = case["fork"]
    by_pid = summaries(case["stderr"])
    assert out["pid"] in by_pid and out["fork_pid"] in by_pid, sorted(by_pid)
    assert {r["pid"] for r in out["results"]} <= set(by_pid)  # each forked child: its own line
    assert out["popen_pid"] not in by_pid, by_pid[out["popen_pid"]]

"""Fork safety for every lock the shim can hold (issue 20 item 2), and no line
from a child that only execs (issue 20 item 11). Stand-ins: the stand-in vLLM
(shim mechanics); the real-vLLM twin is tests/real/test_fork_real.py.

For each lock (tests/standins/forks.py: the shim's own, found in its source
here, and those of other code it takes), a thread holds it, stopped there by
an event, and the main thread forks. The child must finish in bounded time
(an alarm: a blocked child reads ``hung``) with true states: it imports a
vLLM module nobody imported yet (-O parity's finder loads it; a guarded
getter in it raises as plain Python does, -O and -OO alike) and every patch
reads what it reads in the parent.

A ``subprocess.Popen(preexec_fn=...)`` child runs the at-fork handlers and
then execs: it logs nothing, while a plain fork child logs its own line.
"""

from __future__ import annotations

import ast
import os

import pytest

from helpers import (
    OPT_FLAGS,
    REPO,
    STANDINS,
    TARGETS,
    VLLM_COMPLETE,
    hermetic_env,
    json_lines,
    run_python,
    summaries,
)

PACKAGE = REPO / "kimi_hotfix"
LOCK_TYPES = {"Lock", "RLock", "Condition", "Semaphore", "BoundedSemaphore"}
# locks of other code that the shim takes (not created in its source)
EXTERNAL = {"wrapt.importer._post_import_hooks_lock", "logging.Handler.lock (kimi_hotfix's handler)"}
LATE = "vllm.distributed.parallel_state"  # imported by the forked children only

CHILD = r"""
import importlib, json, os, subprocess, sys
sys.path.append(%(standins)r)
import forks
for target in %(targets)r + ["vllm.config.vllm"]:  # every patch's target, then a plain module
    importlib.import_module(target)
import kimi_hotfix

def states():
    return {n: str(s) for n, s in kimi_hotfix.states().items()}

def work():
    late = importlib.import_module(%(late)r)
    return {"first_call": forks.outcome(late.get_inner_dp_world_group), "states": states()}

results = []
for name, hold in forks.locks().items():
    results.append(forks.fork_while_held(name, hold, work))
parent = {"states": states(), "late_imported": %(late)r in sys.modules}
importlib.import_module(%(late)r)
parent["states_after_late"] = states()
popen = subprocess.Popen([sys.executable, "-c", "pass"], preexec_fn=lambda: None)
popen.wait(60)
forked = os.fork()
if forked == 0:
    os._exit(0)
os.waitpid(forked, 0)
print("KIMI_JSON:" + json.dumps({"results": results, "parent": parent, "pid": os.getpid(),
                                 "popen_pid": popen.pid, "fork_pid": forked}))
"""


def lock_sites() -> set:
    """Every lock the shim's source creates, as module.attr or module.Class.attr."""
    found = set()
    for path in PACKAGE.rglob("*.py"):
        module = ".".join(path.relative_to(REPO).with_suffix("").parts)

        def visit(node, owner, module=module):
            for child in ast.iter_child_nodes(node):
                if isinstance(child, ast.ClassDef):
                    visit(child, child.name, module)
                    continue
                if (isinstance(child, ast.Assign) and isinstance(child.value, ast.Call)
                        and ast.unparse(child.value.func).split(".")[-1] in LOCK_TYPES):
                    for target in child.targets:
                        if isinstance(target, ast.Name):
                            found.add(f"{module}.{target.id}")
                        elif isinstance(target, ast.Attribute):
                            found.add(f"{module}.{owner}.{target.attr}" if owner else
                                      f"{module}.{ast.unparse(target)}")
                visit(child, owner, module)

        visit(ast.parse(path.read_text()), None)
    return found


def test_every_lock_in_the_source_has_a_fork_case():
    import sys

    sys.path.append(str(STANDINS))
    import forks

    cases = set(forks.locks())
    sites = lock_sites()
    assert sites, "no lock found: the scan is broken"
    assert sites <= cases, f"locks without a fork case in tests/standins/forks.py: {sites - cases}"
    assert cases - sites == EXTERNAL  # and no case for a lock that is gone


@pytest.mark.parametrize("opt", list(OPT_FLAGS))
def test_fork_while_each_lock_is_held_finishes_with_true_states(opt):
    env = hermetic_env()
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), str(VLLM_COMPLETE)])
    code = CHILD % {"standins": str(STANDINS), "late": LATE, "targets": list(TARGETS)}
    proc = run_python(["-c", code], flags=OPT_FLAGS[opt], env=env, timeout=300)
    out = json_lines(proc.stdout)[0]
    parent = out["parent"]
    assert parent["late_imported"] is False
    settled = parent["states_after_late"]  # what a process that imports every target reads
    assert "pending" not in settled.values(), settled
    refused = ["AssertionError", "inner dp world group is not initialized"]  # plain Python's
    for result in out["results"]:
        assert result.get("error") is None, result
        assert result["hung"] is False, f"the child blocked on {result['lock']}"
        assert result["exit"] == 0, result
        child = result["child"]
        assert child["ok"] is True, (result["lock"], child)
        assert child["first_call"] == refused, (result["lock"], child)
        assert child["states"] == settled, result["lock"]
    # each forked child logged its own line; the Popen child, which only execs, none
    by_pid = summaries(proc.stderr)
    assert {r["pid"] for r in out["results"]} | {out["fork_pid"]} <= set(by_pid), by_pid.keys()
    assert out["popen_pid"] not in by_pid, by_pid[out["popen_pid"]]

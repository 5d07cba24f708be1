"""The gates (issue 21 item 5), without vLLM: the exit codes of the commands.

One table, ``kimi_hotfix.tools.cli.EXIT_CODES``, is what ``--help`` prints and what the
README's exit-code table is generated from; these tests hold the three together
and check that the commands exit with those codes:

- status: 0 where the shim arms (a stand-in vLLM distribution), 3 with
  ``"active": false`` where it would not (each reason: off, not on PYTHONPATH,
  no wrapt is in test_faults.py, no vLLM in test_status.py), 2 on usage errors;
- check: 2 on usage errors and without vLLM (test_status.py); its own
  decision (``preflight.outcome``) on report entries: 2 naming the fix where a
  probe failed for want of a device (and no "does not fix"), 1 on a problem,
  3 where only ``check`` armed a needed shim, 0 otherwise; whether the shim
  arms in a process started like this one (``status.deployment``);
- any command: 141 when stdout is closed early.
The real ``check`` on a host without a GPU, where only ``check`` arms the shim,
is tests/real/test_gates.py (one vLLM child).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

from helpers import REPO, hermetic_env, run_python

PACKAGE_DIR = str(REPO / "kimi_hotfix")


def squash(text: str) -> str:
    return " ".join(text.replace("`", "").split())


def test_help_and_readme_show_the_codes_the_code_uses():
    from kimi_hotfix.tools import cli, docs
    readme = (REPO / "README.md").read_text()
    block = re.search(r"<!-- exit-table -->\n(.*?)<!-- /exit-table -->", readme, re.S)
    assert block and block.group(1) == docs.exit_table(), "run scripts/docs --table"
    codes = [code for code, _ in cli.EXIT_CODES]
    assert codes == [cli.OK, cli.FAILED, cli.CANNOT, cli.UNARMED] and cli.PIPE == 141
    shown = squash(run_python([PACKAGE_DIR, "--help"]).stdout)
    for code, meanings in cli.EXIT_CODES:
        for command, meaning in meanings.items():
            row = f"{code} {command} {squash(meaning)}"
            assert (row in shown) is bool(meaning), row
            assert (f"| {code} |" in block.group(1)) and (meaning in block.group(1))
    for code, when in cli.ANY:
        assert f"{code} any {squash(when)}" in shown and f"{code} {when}" in block.group(1)
    for command in cli.COMMANDS:  # each subcommand's --help: its own rows only
        own = squash(run_python([PACKAGE_DIR, command, "--help"]).stdout)
        for code, meanings in cli.EXIT_CODES:
            for other, meaning in meanings.items():
                if meaning:
                    assert (f"{code} {other} {squash(meaning)}" in own) is (other == command)


def _status(env, python=None):
    proc = run_python([PACKAGE_DIR, "status", "--json"], env=env, python=python, check=False)
    return proc.returncode, json.loads(proc.stdout)


@pytest.fixture
def stand_in_vllm(tmp_path):
    """A ``vllm`` package with its distribution metadata (status reads only that)."""
    (tmp_path / "vllm").mkdir()
    (tmp_path / "vllm" / "__init__.py").write_text("raise ImportError('status imported vllm')\n")
    info = tmp_path / "vllm-0.29.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: vllm\nVersion: 0.29.0\n")
    (info / "top_level.txt").write_text("vllm\n")
    return tmp_path


def test_status_exits_0_only_where_the_shim_arms(stand_in_vllm):
    path = os.pathsep.join([str(REPO), str(stand_in_vllm)])
    rc, report = _status(hermetic_env(PYTHONPATH=path))
    assert (rc, report["active"]) == (0, True), report["active_reason"]
    assert report["active_reason"] == "arms when vLLM is imported (via sitecustomize and vLLM plugin)"
    # the kill switch, a typo in it (fails closed), and the directory off PYTHONPATH
    for env in (hermetic_env(PYTHONPATH=path, KIMI_HOTFIX="0"),
                hermetic_env(PYTHONPATH=path, KIMI_HOTFIX="disabled"),
                hermetic_env(PYTHONPATH=str(stand_in_vllm))):
        rc, report = _status(env)
        assert (rc, report["active"]) == (3, False), report["active_reason"]
        assert report["active_reason"].startswith(("OFF", "INACTIVE"))


def test_deployment_is_what_status_gates_on(stand_in_vllm):
    """check asks ``status.deployment()`` whether anything but itself arms the
    shim: the same answer as status's ``active``, in a process started each way."""
    code = (f"import json, sys\nsys.path.insert(0, {str(REPO)!r})\n"
            "from kimi_hotfix.tools import status\n"
            "print(json.dumps([status.deployment(), status.status_report()['active']]))\n")
    path = os.pathsep.join([str(REPO), str(stand_in_vllm)])
    for env, active in ((hermetic_env(PYTHONPATH=path), True),
                        (hermetic_env(PYTHONPATH=str(stand_in_vllm)), False)):
        (deployment, status_active) = json.loads(run_python(["-c", code], env=env).stdout)
        assert deployment["active"] is status_active is active
        assert deployment["enabled"] is True


def test_usage_errors_exit_2_for_every_command():
    for args in (["status", "--bogus"], ["check", "--nope"], ["audit", "--depth", "x"], ["nope"]):
        proc = run_python([PACKAGE_DIR, *args], check=False)
        assert proc.returncode == 2 and "usage:" in proc.stderr, (args, proc.stderr)


def test_a_closed_stdout_exits_141():
    """``status | head -c1``: stdout closed before the command writes."""
    read, write = os.pipe()
    os.close(read)
    try:
        proc = subprocess.run([sys.executable, PACKAGE_DIR, "status"], stdout=write,
                              stderr=subprocess.PIPE, env=hermetic_env(), text=True, timeout=60)
    finally:
        os.close(write)
    assert proc.returncode == 141 and "Traceback" not in proc.stderr, proc.stderr


# -- check's own decision, on report entries ---------------------------------------------

NO_DEVICE = ("RuntimeError: Failed to infer device type, please set the environment variable "
             "`VLLM_LOGGING_LEVEL=DEBUG` to turn on verbose logging to help debug the issue.")


def entry(without, with_, **extra):
    from kimi_hotfix.runtime.base import Kind, State
    from kimi_hotfix.tools import preflight

    e = {"name": "kv_spec_merge", "without": without, "with": with_, "state_with": "applied",
         "failures_with": None, "problems": [], "notes": [],
         "needed": without.get("ok") is not True, "fixes": with_.get("ok") is True}
    e.update(extra)
    e["no_device"] = preflight.no_device(e)
    preflight._problems(e, State(Kind.APPLIED))
    return e


def levels(here=(), elsewhere=()):
    return {"plain": {"here": True, "needed": [{"name": n, "why": "probe"} for n in here]},
            "-O": {"here": False, "needed": [{"name": n, "why": "check"} for n in elsewhere]}}


ARMS = {"active": True, "reason": "arms when vLLM is imported (via sitecustomize)", "enabled": True}
UNARMED = {"active": False, "enabled": True,
           "reason": "INACTIVE: sitecustomize not loaded: the kimi-hotfix directory is not on "
                     "PYTHONPATH; no vLLM plugin that loads"}
OFF = {"active": False, "reason": "OFF: KIMI_HOTFIX turns the shim off", "enabled": False}
FOUND = {"set_by_check": False}


def outcome(results, levels_, deployment, found=FOUND):
    from kimi_hotfix.tools import preflight
    problems = [f"{r['name']}: {p}" for r in results for p in r["problems"]]
    return preflight.outcome(results, problems, levels_, deployment, found)


def test_a_probe_without_a_device_exits_2_naming_the_fix_and_claims_nothing():
    from kimi_hotfix.tools import preflight

    # the shape the real 0.29.0 probe has: some cases fail for want of a device
    device_case = {"ok": False, "error": None, "detail": f"mla_target_draft: groups: {NO_DEVICE}",
                   "cases": {"mla_target_draft": f"error: {NO_DEVICE}"}}
    e = entry(device_case, dict(device_case))
    assert e["no_device"] is True and e["needed"] is True and e["fixes"] is False
    assert e["problems"] == ["the probe could not run: vLLM infers no device here "
                             "(Failed to infer device type)"]
    code, text = outcome([e], levels(["kv_spec_merge"]), ARMS)
    assert code == 2 and "does not fix" not in text
    assert text.endswith(f"run {preflight.device_fix()}")
    assert preflight.device_fix().startswith(f"VLLM_TARGET_DEVICE=cpu {sys.executable} ")
    assert preflight.device_fix().endswith(" -m kimi_hotfix check")
    # already re-run on CPU by check itself: it says so instead of repeating the fix
    code, text = outcome([e], levels(["kv_spec_merge"]), ARMS, {"set_by_check": True})
    assert code == 2 and "even on CPU (VLLM_TARGET_DEVICE=cpu, set by check)" in text


def test_check_exits_1_on_a_problem_3_where_only_check_armed_it_else_0():
    fixed = entry({"ok": False, "detail": "bug"}, {"ok": True, "detail": "fine"})
    broken = entry({"ok": False, "detail": "bug"}, {"ok": False, "detail": "still"})
    clean = entry({"ok": True, "detail": "fine"}, {"ok": True, "detail": "fine"})
    assert broken["problems"] and "does not fix" in broken["problems"][0]
    assert outcome([broken], levels(["kv_spec_merge"]), ARMS)[0] == 1
    assert outcome([broken], levels(["kv_spec_merge"]), UNARMED)[0] == 1  # 1 before 3
    assert outcome([fixed], levels(["kv_spec_merge"]), ARMS)[0] == 0
    code, text = outcome([fixed], levels(["kv_spec_merge"]), UNARMED)
    assert code == 3 and "only this check armed the shim" in text and UNARMED["reason"] in text
    # needed only under -O: still a server started this way (under -O) runs unpatched
    assert outcome([clean], levels((), ["kv_spec_merge"]), UNARMED)[0] == 3
    # nothing needed anywhere: nothing to arm
    assert outcome([clean], levels(), UNARMED) == (0, "nothing needs kimi-hotfix at any "
                                                      "optimize level: remove it")
    # the kill switch: the disabled states say it (a needed patch fails the check: 1)
    assert outcome([clean], levels((), ["kv_spec_merge"]), OFF)[0] == 0

"""The core under faults, with stand-in patches (no vLLM): every state stays true.

- undo before the target is imported holds (the patch stays off), reapply
  brings it back; undo names what something else re-wrapped since;
- a second patch on an attribute another patch owns is refused (failed, one
  log line), strict mode raises;
- arming that fails, and a hook that fails, end in ``failed`` with the reason
  (never "not loaded"); strict mode raises on both;
- a target imported while the hook never ran reads ``failed`` at exit;
- a fork while another thread is applying a patch: the child neither hangs
  nor keeps a half-applied patch; it says so;
- arming while another thread imports a target settles in that thread once
  its import ends; under strict mode a failure there fails that import.
"""

from __future__ import annotations

import json
import os

import pytest

from helpers import REPO, STANDINS, hermetic_env, json_lines, run_python, summaries, warning_lines

PRELUDE = (f"import os, sys, threading, time\nsys.path.append({str(STANDINS)!r})\n"
           "import fakes\nfrom fakes import Fake\n"
           "from kimi_hotfix.runtime import base, core, patching, state\n")


def run(tmp_path, code, names, timeout=120, **env):
    for name in names:
        (tmp_path / f"standin_{name}.py").write_text(
            "class Thing:\n    def first(self):\n        return 'original'\n"
            "    def second(self):\n        return 'original'\n")
    environ = hermetic_env(**env)
    environ["PYTHONPATH"] = os.pathsep.join([str(REPO), str(tmp_path)])
    return run_python(["-c", PRELUDE + code], env=environ, check=False, timeout=timeout)


def run_strict_or_not(tmp_path, code, names, strict):
    """(the child's JSON, its process) with KIMI_HOTFIX_STRICT set or not; the child exits 0."""
    proc = run(tmp_path, code, names, KIMI_HOTFIX_STRICT="1" if strict else None)
    assert proc.returncode == 0, proc.stderr
    return json_lines(proc.stdout)[0], proc


UNDO = r'''
a, b = Fake("a", patching.needed("x")), Fake("b", patching.needed("x"))
fakes.register(a, b)
core.arm("test")
import standin_a
core.undo()                      # a applied, b still pending
import standin_b                 # b's hook runs now: it must stay off
out = {"after_undo": fakes.states(), "a": fakes.installed("standin_a"),
       "b": fakes.installed("standin_b")}
core.reapply()
out["after_reapply"] = fakes.states()
out["b_after"] = fakes.installed("standin_b")
thing = sys.modules["standin_a"].Thing
outer = vars(thing)["first"]
thing.first = lambda self: "someone else's wrapper"   # re-wrapped by another library
core.undo("a")
out["partial"] = fakes.states()["a"]
out["first_kept"] = thing().first()
out["second_restored"] = thing().second()
fakes.emit(out)
'''


def test_undo_covers_pending_patches_and_names_what_it_could_not_restore(tmp_path):
    proc = run(tmp_path, UNDO, ["a", "b"])
    assert proc.returncode == 0, proc.stderr
    out = json_lines(proc.stdout)[0]
    undone = ["disabled", "disabled (undone)"]
    assert out["after_undo"] == {"a": undone, "b": undone}
    assert out["a"] == [] and out["b"] == []  # b's later import did not apply it
    assert out["after_reapply"] == {"a": ["applied", "applied"], "b": ["applied", "applied"]}
    assert out["b_after"] == ["first", "second"]
    assert out["partial"] == ["disabled", "disabled (undone; could not restore Thing.first "
                                          "(replaced since))"]
    assert out["first_kept"] == "someone else's wrapper" and out["second_restored"] == "original"
    (warning,) = warning_lines(proc.stderr)
    assert "undo of a could not restore Thing.first: replaced since by something else" in warning


CONFLICT = r'''
fakes.register(Fake("owner", patching.needed("x"), target="standin_shared", attrs=("first",)),
               Fake("second", patching.needed("x"), target="standin_shared", attrs=("second", "first")))
core.arm("test")
try:
    import standin_shared
    out = {"import": "ok"}
except base.KimiHotfixError as exc:
    out = {"import": f"KimiHotfixError: {exc}"}
module = sys.modules.get("standin_shared")  # a failed import (strict) leaves none
out.update(states=fakes.states(), owners=module and {
    a: getattr(vars(module.Thing)[a], "_self_kimi_hotfix_patch", None) for a in ("first", "second")})
fakes.emit(out)
'''


@pytest.mark.parametrize("strict", [False, True])
def test_a_second_patch_on_an_owned_attribute_is_refused(tmp_path, strict):
    out, proc = run_strict_or_not(tmp_path, CONFLICT, ["shared"], strict)
    why = "Thing.first is already patched by kimi-hotfix patch 'owner'"
    assert out["states"] == {"owner": ["applied", "applied"], "second": ["failed", f"failed: {why}"]}
    if strict:  # the import failed: the module is not in sys.modules
        assert out["import"] == f"KimiHotfixError: second: {why}" and out["owners"] is None
    else:  # all or nothing for "second"
        assert out["import"] == "ok" and out["owners"] == {"first": "owner", "second": None}
    (warning,) = warning_lines(proc.stderr)
    assert f"second could not apply ({why}); vLLM unchanged" in warning


ARM_FAILS = r'''
class BrokenWrapt:
    def register_post_import_hook(self, hook, name):
        raise RuntimeError("hook registry broken")
from kimi_hotfix.runtime import _wrapt
_wrapt.load = BrokenWrapt
fakes.register(Fake("a", patching.needed("x")))
try:
    core.arm("test")
    out = {"arm": "returned"}
except base.KimiHotfixError as exc:
    out = {"arm": f"KimiHotfixError: {exc}"}
import standin_a
out["states"] = fakes.states()
fakes.emit(out)
'''


@pytest.mark.parametrize("strict", [False, True])
def test_arming_failure_reads_failed_with_its_reason(tmp_path, strict):
    out, proc = run_strict_or_not(tmp_path, ARM_FAILS, ["a"], strict)
    why = "arming failed: RuntimeError: hook registry broken"
    assert out["arm"] == (f"KimiHotfixError: {why}" if strict else "returned")
    assert out["states"] == {"a": ["failed", f"failed: {why}"]}
    (lines,) = summaries(proc.stderr).values()
    assert lines[-1].endswith(f"a: failed: {why}")  # not "not loaded": truthful at exit too
    assert "kimi-hotfix: arming failed (RuntimeError: hook registry broken); vLLM runs unpatched" \
        in proc.stderr


HOOK_FAILS = r'''
def broken(*args):
    raise KeyError("the shim's own bug")
from kimi_hotfix.runtime import outcome
outcome.decide_and_apply = broken
fakes.register(Fake("a", patching.needed("x")))
core.arm("test")
try:
    import standin_a
    out = {"import": "ok"}
except base.KimiHotfixError as exc:
    out = {"import": f"KimiHotfixError: {exc}"}
out.update(states=fakes.states(),
           installed="standin_a" in sys.modules and fakes.installed("standin_a"))
fakes.emit(out)
'''


@pytest.mark.parametrize("strict", [False, True])
def test_hook_failure_reads_failed_and_strict_fails_the_import(tmp_path, strict):
    out, proc = run_strict_or_not(tmp_path, HOOK_FAILS, ["a"], strict)
    why = "its import hook failed: KeyError: \"the shim's own bug\""
    assert out["states"] == {"a": ["failed", f"failed: {why}"]}
    assert out["installed"] == (False if strict else [])  # strict: the import failed
    assert out["import"] == (f"KimiHotfixError: a: {why}" if strict else "ok")


NEVER_RAN = r'''
fakes.register(Fake("a", patching.needed("x")), Fake("b", patching.needed("x")))
core.arm("test")
core.settle = lambda name, module: None   # the hook runs, but settles nothing
import standin_a
'''


def test_imported_target_whose_patch_never_ran_reads_failed_at_exit(tmp_path):
    proc = run(tmp_path, NEVER_RAN, ["a", "b"])
    assert proc.returncode == 0, proc.stderr
    (lines,) = summaries(proc.stderr).values()
    assert lines[-1].endswith("a: failed: standin_a was imported but the patch never ran | "
                              "b: not loaded")


FORK = r'''
reached, go = fakes.events()
fakes.register(Fake("slow", patching.needed("x"), pause=(reached, go)))
core.arm("test")
worker = threading.Thread(target=__import__, args=("standin_slow",))
worker.start()
reached.wait(30)                 # the worker is inside apply: "first" wrapped, "second" not yet
during = fakes.states()          # no lock held while patch code runs: this returns at once
pid = os.fork()
if pid == 0:
    thing = sys.modules["standin_slow"].Thing
    fakes.emit({"who": "child", "states": fakes.states(), "installed": fakes.installed("standin_slow"),
                "first": thing().first()})
    core.reapply("slow")         # the child can still take locks: nothing hangs
    fakes.emit({"who": "child-after", "states": fakes.states()})
    sys.stdout.flush()
    os._exit(0)
go.set()
worker.join(60)
_, status = os.waitpid(pid, 0)
fakes.emit({"who": "parent", "status": status, "states": fakes.states(), "during": during,
            "installed": fakes.installed("standin_slow")})
'''


def test_fork_while_another_thread_applies_a_patch(tmp_path):
    proc = run(tmp_path, FORK, ["slow"], timeout=60)
    assert proc.returncode == 0, proc.stderr
    out = {o["who"]: o for o in json_lines(proc.stdout)}
    why = "was being applied by another thread when this process forked; rolled back here"
    assert out["child"]["states"] == {"slow": ["failed", f"failed: {why}"]}
    assert out["child"]["installed"] == [] and out["child"]["first"] == "original"
    assert out["child-after"]["states"] == out["child"]["states"]  # reapply: not undone, a no-op
    assert out["parent"]["during"] == {"slow": ["pending", "pending"]}  # read mid-apply
    assert out["parent"]["status"] == 0
    assert out["parent"]["states"] == {"slow": ["applied", "applied"]}
    assert out["parent"]["installed"] == ["first", "second"]
    by_pid = summaries(proc.stderr)
    assert len(by_pid) == 2  # the child logs its own line, with its own pid
    assert "kimi-hotfix: slow was being applied by another thread when this process forked" \
        in proc.stderr


SLOW_TARGET = """
import os, time
open(os.environ["SLOW_TARGET_STARTED"], "w").close()
while not os.path.exists(os.environ["SLOW_TARGET_GO"]):
    time.sleep(0.01)
class Thing:
    def first(self):
        return "original"
    def second(self):
        return "original"
"""
MID_IMPORT = r'''
import json
fakes.register(Fake("slow", patching.needed("stand-in"), target="slow_target",
                    apply_fails=os.environ.get("FAIL") == "1"))
result = {}
def importer():
    try:
        __import__("slow_target")
        result["import"] = "ok"
    except BaseException as exc:
        result["import"] = f"{type(exc).__name__}: {exc}"
thread = threading.Thread(target=importer)
thread.start()
while not os.path.exists(os.environ["SLOW_TARGET_STARTED"]):
    time.sleep(0.01)
half = sys.modules["slow_target"].__spec__._initializing  # mid-import in the other thread
core.arm("test")
state_while = str(core.states()["slow"])
open(os.environ["SLOW_TARGET_GO"], "w").close()
thread.join(30)
mod = sys.modules.get("slow_target")
fakes.emit({"half": half, "while": state_while, "after": str(core.states()["slow"]),
            "import": result.get("import"), "call": mod.Thing().first() if mod else None,
            "spec_class": type(mod.__spec__).__name__ if mod else None,
            "threads": threading.active_count()})
'''


@pytest.mark.parametrize("case", ["ok", "fails", "fails-strict"])
def test_arming_while_another_thread_imports_a_target(tmp_path, case):
    """The target is half-executed in another thread when the shim arms: the
    patch settles in that thread once its import ends (no deadlock, no helper
    thread, no patching of a module that is not there yet); under strict mode
    a failure there fails that import."""
    (tmp_path / "slow_target.py").write_text(SLOW_TARGET)
    env = hermetic_env(SLOW_TARGET_STARTED=str(tmp_path / "started"),
                       SLOW_TARGET_GO=str(tmp_path / "go"), FAIL="1" if "fails" in case else "0",
                       KIMI_HOTFIX_STRICT="1" if "strict" in case else None)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), str(tmp_path)])
    proc = run_python(["-c", PRELUDE + MID_IMPORT], env=env, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    out = json_lines(proc.stdout)[0]
    assert out["half"] is True and out["while"] == "pending"
    assert out["spec_class"] == "ModuleSpec" and out["threads"] == 1  # put back; no helper left
    if case == "ok":
        assert out["after"] == "applied" and out["call"] == "patched" and out["import"] == "ok"
        return
    why = "RuntimeError: second step failed"
    assert out["after"] == f"failed: {why}" and out["call"] == "original"
    if case == "fails":
        assert out["import"] == "ok"
    else:
        assert out["import"] == f"KimiHotfixError: slow: {why}"


JSON_LOG = r'''
a = Fake("a", patching.needed("x"))
fakes.register(a)
core.arm("test")
import standin_a
core.undo()
print("KIMI_JSON:" + json.dumps({"pid": os.getpid()}))
'''


@pytest.mark.parametrize("flags", [[], ["-O"], ["-OO"]], ids=["plain", "-O", "-OO"])
def test_json_log_format_gives_one_object_per_line(tmp_path, flags):
    """KIMI_HOTFIX_LOG_FORMAT=json: every line the shim logs is one JSON object
    with pid, role, level and message; summary lines also carry the states;
    an unknown format warns and falls back to text."""
    environ = hermetic_env(KIMI_HOTFIX_LOG_FORMAT="JSON ")
    environ["PYTHONPATH"] = os.pathsep.join([str(REPO), str(tmp_path)])
    (tmp_path / "standin_a.py").write_text("class Thing:\n    def first(self):\n        return 1\n"
                                           "    def second(self):\n        return 2\n")
    proc = run_python([*flags, "-c", "import json\n" + PRELUDE + JSON_LOG], env=environ)
    pid = json_lines(proc.stdout)[0]["pid"]
    lines = [json.loads(line) for line in proc.stderr.splitlines()]
    assert lines and all(rec["pid"] == pid and rec["role"] == "main" and rec["logger"] == "kimi-hotfix"
                         for rec in lines), proc.stderr
    summary = [rec for rec in lines if "states" in rec]
    assert [rec["states"]["a"].split(" ")[0] for rec in summary] == ["pending", "applied", "disabled"]
    assert all(rec["message"].startswith("kimi-hotfix 0.1.0 (") and rec["level"] == "INFO"
               for rec in summary)
    environ["KIMI_HOTFIX_LOG_FORMAT"] = "yaml"
    proc = run_python([*flags, "-c", "import json\n" + PRELUDE + JSON_LOG], env=environ)
    assert "KIMI_HOTFIX_LOG_FORMAT='yaml' is not understood; valid values: text, json; using text" \
        in proc.stderr, proc.stderr
    assert not proc.stderr.lstrip().startswith("{")

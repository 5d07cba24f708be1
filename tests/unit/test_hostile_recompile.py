"""recompile and hardening against a vLLM source that is not what runs (issue 28 finding 9).

Shim mechanics, in child interpreters, plain, -O and -OO, on a module written
here (a stand-in for a vLLM file in a writable site-packages or an in-place
upgrade of a running image):

- nothing of the source is evaluated, before the byte-for-byte check or after
  it: a default value with a side effect is never run, and (not a literal: it
  cannot be compared) the recompile refuses;
- a default value changed on disk after the import: refused (it is compared);
- an ``assert`` changed on disk after the import: under -O the running code has
  no assert to compare it with, so hardening refuses when the ``.py`` is not the
  source of the running code: its -O bytecode records another source, or, with
  no bytecode written (``-B``), the file changed after the process started. In
  plain Python the byte-for-byte check refuses it;
- the same module unchanged hardens, and its assert raises as plain Python's.
"""

from __future__ import annotations

import json
import time

import pytest

from helpers import OPT_FLAGS, hermetic_env, json_lines, run_python

MODULE = '''
SEEN = []


def _mark():
    SEEN.append("evaluated")
    return 1


def with_side_effect(x, y=_mark()):
    return x + y


def with_default(x, y=1):
    return x + y


def guarded(x):
    assert x > 0, "x must be positive"
    return x
'''
CHANGED = {  # what an upgrade (or an intruder) leaves on disk after the import
    "default": ("def with_default(x, y=1):", "def with_default(x, y=2222):"),
    "assert": ('assert x > 0, "x must be positive"', 'assert __import__("os").environ.setdefault('
               '"KIMI_PWNED", "1"), "x"'),
}
CHILD = r'''
import json, os, sys
sys.path.insert(0, sys.argv[1])
import target
from kimi_hotfix import hardening, recompile
from kimi_hotfix.base import PatchError

change = sys.argv[2]
out = {"seen_after_import": list(target.SEEN)}
if change != "none":
    old, new = json.loads(sys.argv[3])
    path = target.__file__
    text = open(path).read()
    with open(path, "w") as f:
        f.write(text.replace(old, new))
    recompile.forget()

def attempt(make):
    try:
        made = make()
    except PatchError as exc:
        return ["PatchError", str(exc)]
    try:
        return ["ok", made(-1)]
    except AssertionError as exc:
        return ["AssertionError", str(exc)]

out["side_effect"] = attempt(lambda: recompile.recompile(target.with_side_effect, lambda t: None))
out["seen"] = list(target.SEEN)
out["default"] = attempt(lambda: recompile.recompile(target.with_default, lambda t: None))
out["harden"] = attempt(lambda: hardening.harden(target.guarded))
try:  # what a patch does when it wraps: the check runs at wrap time, before any call
    hardening.OnFirstCall(type("Ctx", (), {"name": "probe"})(), [target.guarded])
    out["on_first_call"] = "ok"
except PatchError as exc:
    out["on_first_call"] = str(exc)
out["pwned"] = os.environ.get("KIMI_PWNED")
print("KIMI_JSON:" + json.dumps(out))
'''


def run(tmp_path, opt, change, bytecode=True):
    target = tmp_path / "pkg"
    target.mkdir()
    (target / "target.py").write_text(MODULE)
    time.sleep(0.05)  # written before the child starts (its start time is in clock ticks)
    flags = [*OPT_FLAGS[opt], *([] if bytecode else ["-B"])]
    proc = run_python(["-c", CHILD, str(target), change, json.dumps(CHANGED.get(change))],
                      flags=flags, env=hermetic_env(shim=False, PYTHONPATH=str(__import__("helpers").REPO)))
    return json_lines(proc.stdout)[0]


@pytest.mark.parametrize("opt", ["plain", "O", "OO"])
def test_nothing_of_the_source_runs_and_an_unchanged_module_hardens(tmp_path, opt):
    out = run(tmp_path, opt, "none")
    assert out["seen_after_import"] == ["evaluated"]  # the import evaluated the default once
    assert out["seen"] == ["evaluated"]  # ... and the recompile never did
    assert out["side_effect"][0] == "PatchError" and "not literals" in out["side_effect"][1]
    assert out["default"] == ["ok", 0]
    assert out["harden"] == ["AssertionError", "x must be positive"]
    assert out["on_first_call"] == "ok"
    assert out["pwned"] is None


@pytest.mark.parametrize("bytecode", [True, False], ids=["bytecode", "no-bytecode"])
@pytest.mark.parametrize("opt", ["plain", "O", "OO"])
def test_a_source_changed_after_import_is_refused(tmp_path, opt, bytecode):
    out = run(tmp_path, opt, "default", bytecode)
    assert out["default"][0] == "PatchError" and "default values differ" in out["default"][1], out
    (tmp_path / "pkg").rename(tmp_path / "first")
    out = run(tmp_path, opt, "assert", bytecode)
    assert out["harden"][0] == "PatchError", out
    if opt == "plain":  # the asserts are in the running code: compared byte for byte
        assert "does not match its running code" in out["harden"][1]
    else:
        why = "differs from its bytecode" if bytecode else "changed after this process started"
        assert why in out["harden"][1] and "not recompiled" in out["harden"][1], out
        assert why in out["on_first_call"], out  # the patch reads failed at once
    assert out["pwned"] is None  # the changed assert never ran

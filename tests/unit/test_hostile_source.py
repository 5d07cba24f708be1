"""recompile and -O parity's in-place code against a vLLM source that is not what runs
(issue 28 finding 9; issue 36 item 1: Python's own rule for bytecode).

Shim mechanics, in child interpreters, plain, -O and -OO, on a module written
here (a stand-in for a vLLM file in a writable site-packages or an in-place
upgrade of a running image):

- nothing of the source is evaluated, before the byte-for-byte check or after
  it: a default value with a side effect is never run, and (not a literal: it
  cannot be compared) the recompile refuses;
- a default value changed on disk after the import: refused (it is compared);
- an ``assert`` changed on disk after the import: under -O the running code has
  no assert to compare it with, so -O parity (giving a module imported before
  the shim armed its plain code in place: kimi_hotfix.runtime.parity.swap) refuses
  when the ``.py`` is not the source of the running code: it changed after the
  process started, with or without bytecode written (``-B``). In plain Python
  the recompile's byte-for-byte check refuses it;
- the same module unchanged gets its plain code, and its assert raises as
  plain Python's.
"""

from __future__ import annotations

import json
import os
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
from kimi_hotfix.runtime import parity, recompile
from kimi_hotfix.runtime.base import PatchError

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
report = parity.Report()
parity.swap([target], report)
out["parity"] = {"refused": report.refused.get("target"), "swapped": report.swapped.get("target", 0)}
try:
    out["parity"]["guarded"] = ["ok", target.guarded(-1)]
except AssertionError as exc:
    out["parity"]["guarded"] = ["AssertionError", str(exc)]
out["pwned"] = os.environ.get("KIMI_PWNED")
print("KIMI_JSON:" + json.dumps(out))
'''


def run(tmp_path, opt, change, bytecode=True):
    target = tmp_path / "pkg"
    target.mkdir()
    (target / "target.py").write_text(MODULE)
    # installed before the child starts, as a vLLM file is: a process's start time is
    # known to the clock tick after a boot time in whole seconds (/proc)
    past = time.time() - 60
    os.utime(target / "target.py", (past, past))
    flags = [*OPT_FLAGS[opt], *([] if bytecode else ["-B"])]
    proc = run_python(["-c", CHILD, str(target), change, json.dumps(CHANGED.get(change))],
                      flags=flags, env=hermetic_env(shim=False, PYTHONPATH=str(__import__("helpers").REPO)))
    return json_lines(proc.stdout)[0]


@pytest.mark.parametrize("opt", ["plain", "O", "OO"])
def test_nothing_of_the_source_runs_and_an_unchanged_module_gets_plain_code(tmp_path, opt):
    out = run(tmp_path, opt, "none")
    assert out["seen_after_import"] == ["evaluated"]  # the import evaluated the default once
    assert out["seen"] == ["evaluated"]  # ... and the recompile never did
    assert out["side_effect"][0] == "PatchError" and "not literals" in out["side_effect"][1]
    assert out["default"] == ["ok", 0]
    assert out["parity"]["refused"] is None
    assert out["parity"]["guarded"] == ["AssertionError", "x must be positive"]
    # plain Python runs plain code already: nothing to give; -O and -OO: the guarded def
    # (and -OO: every def, their docstrings aside)
    assert (out["parity"]["swapped"] > 0) is (opt != "plain")
    assert out["pwned"] is None


@pytest.mark.parametrize("bytecode", [True, False], ids=["bytecode", "no-bytecode"])
@pytest.mark.parametrize("opt", ["plain", "O", "OO"])
def test_a_source_changed_after_import_is_refused(tmp_path, opt, bytecode):
    out = run(tmp_path, opt, "default", bytecode)
    assert out["default"][0] == "PatchError" and "default values differ" in out["default"][1], out
    (tmp_path / "pkg").rename(tmp_path / "first")
    out = run(tmp_path, opt, "assert", bytecode)
    # the file changed after this process started: not the running code's source, at
    # any level, with bytecode written or not; the module keeps the code it runs
    assert "changed after this process started" in out["parity"]["refused"], out
    assert out["parity"]["swapped"] == 0
    assert out["parity"]["guarded"] == (["AssertionError", "x must be positive"] if opt == "plain"
                                        else ["ok", -1])
    assert out["pwned"] is None  # the changed assert never ran

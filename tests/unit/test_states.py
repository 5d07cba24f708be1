"""The state logic of kimi_hotfix.runtime.core, with stand-in patches (no vLLM).

A child interpreter replaces the registry with small patches
(tests/standins/fakes.py) whose checks return each kind of decision (or raise),
arms, imports their stand-in target modules and reports what the shim decided,
logged and left installed:
- needed -> applied; fixed -> not_needed; absent -> not_affected (nothing
  installed); forced over fixed -> applied (forced; ...);
- a check that cannot tell, or raises, applies (the safe side) and warns once;
  strict mode raises; a PatchError from the check (its target missing) fails;
- cannot tell and cannot apply: one warning that says both, and `failed`;
- apply is all or nothing: a failure half-way puts back what it had wrapped;
- ``toggled`` puts back exactly what was installed, and the state;
- the summary line is logged when armed and again at each change; at exit a
  target never imported ends "not_loaded";
- a wrapper failure is counted in the state, logged once, says what runs
  instead; strict raises.
Plus the texts of the state kinds and the decisions.
"""

from __future__ import annotations

import os

import pytest

from kimi_hotfix.runtime import base, patching

from helpers import REPO, STANDINS, hermetic_env, json_lines, run_python, summaries, warning_lines

PRELUDE = f"import sys\nsys.path.append({str(STANDINS)!r})\nimport fakes\nfrom fakes import Fake\n" \
          "from kimi_hotfix.runtime import base, core, patching, state\n"
NAMES = ("needed", "fixed", "absent", "unknown", "raises", "missing", "halfway", "forced",
         "unsure_broken", "never")
CHILD = PRELUDE + r'''
PATCHES = [
    Fake("needed", patching.needed("the bug is there")),
    Fake("fixed", patching.fixed("upstream does it")),
    Fake("absent", patching.absent("no such feature")),
    Fake("unknown", patching.cannot_tell("no source")),
    Fake("raises", raises=ValueError("probe exploded")),
    Fake("missing", raises=base.PatchError("Thing.first not found")),
    Fake("halfway", patching.needed("the bug is there"), apply_fails=True),
    Fake("forced", patching.fixed("upstream does it")),
    Fake("unsure_broken", patching.cannot_tell("no source"), apply_fails=True),
    Fake("never", patching.needed("never imported")),
]
fakes.register(*PATCHES)
core.arm("test")
import importlib
for p in PATCHES[:-1]:
    importlib.import_module(p.target)

out = {"states": fakes.states(),
       "installed": {p.name: fakes.installed(p.target) for p in PATCHES[:-1]}}
thing = sys.modules["standin_needed"].Thing
before = (vars(thing)["first"], vars(thing)["second"])
from kimi_hotfix.tools.preflight import toggled  # check's own toggle
with toggled("needed", False) as st:
    out["toggled_off"] = [str(st), fakes.installed("standin_needed"), thing().first()]
out["after_off_identical"] = (vars(thing)["first"], vars(thing)["second"]) == before
from kimi_hotfix.tools.preflight import toggled  # check's own toggle
with toggled("fixed", True) as st:
    out["toggled_on"] = [str(st), fakes.installed("standin_fixed"),
                         sys.modules["standin_fixed"].Thing().first()]
out["after_on"] = [str(core.states()["fixed"]), fakes.installed("standin_fixed")]
fakes.emit(out)
'''


def run(tmp_path, code=CHILD, names=NAMES, **env):
    for name in names:
        (tmp_path / f"standin_{name}.py").write_text(
            "class Thing:\n    def first(self):\n        return 'original'\n"
            "    def second(self):\n        return 'original'\n")
    environ = hermetic_env(KIMI_HOTFIX_FORCE="forced" if "forced" in names else None, **env)
    environ["PYTHONPATH"] = os.pathsep.join([str(REPO), str(tmp_path)])
    return run_python(["-c", code], env=environ, check=False)


def test_each_decision_becomes_its_state(tmp_path):
    proc = run(tmp_path)
    assert proc.returncode == 0, proc.stderr
    out = json_lines(proc.stdout)[0]
    states = {n: tuple(s) for n, s in out["states"].items()}
    assert states == {
        "needed": ("applied", "applied"),
        "fixed": ("not_needed", "not needed: upstream fixed (upstream does it)"),
        "absent": ("not_affected", "not affected (no such feature)"),
        "unknown": ("applied", "applied (cannot tell: no source; applied to be safe)"),
        "raises": ("applied", "applied (cannot tell: its decide raised ValueError: probe "
                              "exploded; applied to be safe)"),
        "missing": ("failed", "failed: Thing.first not found"),
        "halfway": ("failed", "failed: RuntimeError: second step failed"),
        "forced": ("applied", "applied (forced; not needed: upstream fixed (upstream does it))"),
        "unsure_broken": ("failed", "failed: cannot tell whether it is needed (no source) and "
                                    "cannot apply (RuntimeError: second step failed)"),
        "never": ("pending", "pending"),  # until the process ends: see the summary line
    }
    installed = out["installed"]
    assert installed["needed"] == installed["unknown"] == installed["forced"] == ["first", "second"]
    assert installed["fixed"] == installed["absent"] == installed["missing"] == []
    assert installed["halfway"] == installed["unsure_broken"] == []  # all or nothing
    warnings = [w.split(" WARNING ")[1] for w in warning_lines(proc.stderr)]
    assert [w.split(" (")[0] for w in warnings] == [
        "kimi-hotfix: cannot tell whether unknown is needed",
        "kimi-hotfix: cannot tell whether raises is needed",
        "kimi-hotfix: missing could not apply",
        "kimi-hotfix: halfway could not apply",
        "kimi-hotfix: cannot tell whether unsure_broken is needed",
    ]
    # one line says both halves, truthfully: no "applied to be safe" for it
    assert warnings[-1] == ("kimi-hotfix: cannot tell whether unsure_broken is needed (no source), "
                            "and it cannot apply (RuntimeError: second step failed); vLLM unchanged")
    (lines,) = summaries(proc.stderr).values()
    assert "needed: pending" in lines[0]  # armed: everything pending
    assert len(lines) == 1 + (len(NAMES) - 1) + 1  # armed, one per settled patch, at exit
    assert lines[-1].endswith("never: not loaded")  # the reason stays out of the line: short
    assert "unsure_broken: failed: cannot tell" in lines[-1]


def test_toggled_puts_back_exactly_what_was_there(tmp_path):
    out = json_lines(run(tmp_path).stdout)[0]
    assert out["toggled_off"] == ["disabled (toggled off)", [], "original"]
    assert out["after_off_identical"] is True
    assert out["toggled_on"] == ["applied (toggled on)", ["first", "second"], "patched"]
    assert out["after_on"] == ["not needed: upstream fixed (upstream does it)", []]


def test_strict_mode_raises_when_a_check_cannot_tell(tmp_path):
    proc = run(tmp_path, KIMI_HOTFIX_STRICT="1")
    assert proc.returncode == 1
    assert ("kimi_hotfix.runtime.base.KimiHotfixError: unknown: cannot tell whether it is needed: "
            "no source") in proc.stderr
    # the state was recorded before the raise: the exit line says what happened
    assert "unknown: applied (cannot tell: no source; applied to be safe)" in \
        list(summaries(proc.stderr).values())[0][-1]


WRAPPER = PRELUDE + r'''
patch = Fake("some_patch", patching.needed("x"), attrs=("first",))
fakes.register(patch)
core.arm("test")
import standin_some_patch
for i in range(3):
    try:
        patch.ctx.failed(RuntimeError(f"boom {i}"), "vLLM's own code runs")
        print("contained")
    except base.KimiHotfixError as exc:
        print("raised", exc)
st = core.states()["some_patch"]
fakes.emit({"kind": st.kind.value, "text": str(st), "failures": st.failures,
            "first": st.first_failure})
'''


@pytest.mark.parametrize("strict", [False, True])
def test_wrapper_failure_counted_logged_once_with_what_runs_instead(tmp_path, strict):
    proc = run(tmp_path, WRAPPER, names=["some_patch"], KIMI_HOTFIX_STRICT="1" if strict else None)
    assert proc.returncode == 0, proc.stderr
    if strict:
        assert proc.stdout.splitlines()[:3] == [f"raised some_patch wrapper failed: boom {i}"
                                                for i in range(3)]
    else:
        assert proc.stdout.splitlines()[:3] == ["contained"] * 3
    out = json_lines(proc.stdout)[0]
    assert out == {"kind": "applied", "failures": 3, "first": "RuntimeError: boom 0",
                   "text": "applied; its code failed on 3 calls (first: RuntimeError: boom 0), "
                           "vLLM's own code ran"}
    warnings = warning_lines(proc.stderr)
    assert len(warnings) == 1
    assert "some_patch wrapper failed (RuntimeError: boom 0); vLLM's own code runs" in warnings[0]
    (lines,) = summaries(proc.stderr).values()  # logged again once, not per failure
    assert [line.split("): ", 1)[1] for line in lines] == [
        "some_patch: pending", "some_patch: applied",
        "some_patch: applied; its code failed (first: RuntimeError: boom 0), vLLM's own code ran"]


@pytest.mark.parametrize("kind, detail, text", [
    ("pending", "", "pending"),
    ("applied", "", "applied"),
    ("applied", "forced; x", "applied (forced; x)"),
    ("not_needed", "why", "not needed: upstream fixed (why)"),
    ("not_affected", "why", "not affected (why)"),
    ("disabled", "KIMI_HOTFIX_DISABLE", "disabled (KIMI_HOTFIX_DISABLE)"),
    ("failed", "wrapt is not installed", "failed: wrapt is not installed"),
    ("not_loaded", "x never imported", "not loaded (x never imported)"),
])
def test_state_texts(kind, detail, text):
    state = base.State(kind, detail)
    line = "not loaded" if kind == "not_loaded" else text  # the line leaves out why
    assert str(state) == text and state.line_text() == line
    assert state.kind is base.Kind(kind) and f"{state.kind}" == kind  # an Enum that prints its value
    failing = state.with_failure("E: x").with_failure("E: y")
    assert (failing.failures, failing.first_failure) == (2, "E: x")
    assert str(failing) == text + "; its code failed on 2 calls (first: E: x), vLLM's own code ran"
    assert failing.line_text() == line + "; its code failed (first: E: x), vLLM's own code ran"


def test_unknown_state_kind_raises():
    with pytest.raises(ValueError):
        base.State("undone")
    with pytest.raises(ValueError):
        patching.Decision("maybe", "x")


def test_decisions():
    decisions = (patching.needed("a"), patching.fixed("b"), patching.absent("c"), patching.cannot_tell("d"))
    assert [d.applies for d in decisions] == [True, False, False, True]
    assert [d.verdict for d in decisions] == list(patching.Verdict)
    assert patching.ProbeResult(ok=False, cases={"a": "b"}, error="e").as_dict() == {
        "ok": False, "detail": "", "cases": {"a": "b"}, "affected": True, "error": "e"}

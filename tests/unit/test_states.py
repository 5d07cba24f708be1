"""The state logic of kimi_hotfix.core, with stand-in patches (no vLLM).

A child interpreter replaces the registry with small patches whose checks
return each kind of decision (or raise), arms, imports their stand-in target
modules and reports what the shim decided, logged and left installed:
- needed -> applied; fixed -> not_needed; absent -> not_affected (nothing
  installed); forced over fixed -> applied (forced; ...);
- a check that cannot tell, or raises, applies (the safe side) and warns once;
  strict mode raises; a PatchError from the check (its target missing) fails;
- apply is all or nothing: a failure half-way puts back what it had wrapped;
- ``toggled`` puts back exactly what was installed, and the state;
- a target never imported ends "not_loaded" in the summary line at exit;
- a wrapper failure is logged once, naming what runs instead; strict raises.
Plus the texts of the state kinds and the decisions.
"""

from __future__ import annotations

import json
import os

import pytest

from kimi_hotfix import base

from helpers import REPO, hermetic_env, json_lines, run_python, summary_lines, warning_lines

CHILD = r'''
import json, sys
from kimi_hotfix import base, core

class Fake(base.Patch):
    def __init__(self, name, decision=None, raises=None, apply_fails=False):
        self.name, self.target = name, "standin_" + name
        self.decision, self.raises, self.apply_fails = decision, raises, apply_fails
    def check(self, module, optimize):
        if self.raises:
            raise self.raises
        return self.decision
    def apply(self, module, wrap):
        wrap(module.Thing, "first", lambda wrapped, instance, args, kwargs: "patched")
        if self.apply_fails:
            raise RuntimeError("second step failed")
        wrap(module.Thing, "second", replacement=lambda self: "replaced")
    def probe(self):
        return base.ProbeResult(ok=True)

PATCHES = [
    Fake("needed", base.needed("the bug is there")),
    Fake("fixed", base.fixed("upstream does it")),
    Fake("absent", base.absent("no such feature")),
    Fake("unknown", base.cannot_tell("no source")),
    Fake("raises", raises=ValueError("probe exploded")),
    Fake("missing", raises=base.PatchError("Thing.first not found")),
    Fake("halfway", base.needed("the bug is there"), apply_fails=True),
    Fake("forced", base.fixed("upstream does it")),
    Fake("never", base.needed("never imported")),
]
core._patches.update((p.name, p) for p in PATCHES)
core.arm("test")
import importlib
for p in PATCHES[:-1]:
    importlib.import_module(p.target)

def installed(name):
    thing = sys.modules["standin_" + name].Thing
    return [a for a in ("first", "second") if core.is_wrapped(vars(thing)[a])]

out = {"states": {n: [s.kind, str(s)] for n, s in core.states().items()},
       "installed": {p.name: installed(p.name) for p in PATCHES[:-1]}}
thing = sys.modules["standin_needed"].Thing
before = (vars(thing)["first"], vars(thing)["second"])
with core.toggled("needed", False) as state:
    out["toggled_off"] = [str(state), installed("needed"), thing().first()]
out["after_off_identical"] = (vars(thing)["first"], vars(thing)["second"]) == before
with core.toggled("fixed", True) as state:
    out["toggled_on"] = [str(state), installed("fixed"), sys.modules["standin_fixed"].Thing().first()]
out["after_on"] = [str(core.states()["fixed"]), installed("fixed")]
print("KIMI_JSON:" + json.dumps(out), flush=True)
'''

MODULE = ("class Thing:\n    def first(self):\n        return 'original'\n"
          "    def second(self):\n        return 'original'\n")


def run(tmp_path, **env):
    for name in ("needed", "fixed", "absent", "unknown", "raises", "missing", "halfway", "forced"):
        (tmp_path / f"standin_{name}.py").write_text(MODULE)
    environ = hermetic_env(KIMI_HOTFIX_FORCE="forced", **env)
    environ["PYTHONPATH"] = os.pathsep.join([str(REPO), str(tmp_path)])
    return run_python(["-c", CHILD], env=environ, check=False)


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
        "raises": ("applied", "applied (cannot tell: its check raised ValueError: probe "
                              "exploded; applied to be safe)"),
        "missing": ("failed", "failed: Thing.first not found"),
        "halfway": ("failed", "failed: RuntimeError: second step failed"),
        "forced": ("applied", "applied (forced; not needed: upstream fixed (upstream does it))"),
        "never": ("pending", "pending"),  # until the process ends: see the summary line
    }
    installed = out["installed"]
    assert installed["needed"] == installed["unknown"] == installed["forced"] == ["first", "second"]
    assert installed["fixed"] == installed["absent"] == installed["missing"] == []
    assert installed["halfway"] == []  # all or nothing
    warnings = warning_lines(proc.stderr)
    assert [w.split(" WARNING ")[1].split(" (")[0] for w in warnings] == [
        "kimi-hotfix: cannot tell whether unknown is needed",
        "kimi-hotfix: cannot tell whether raises is needed",
        "kimi-hotfix: missing could not apply",
        "kimi-hotfix: halfway could not apply",
    ]
    lines = summary_lines(proc.stderr)
    assert len(lines) == 1 and "never: not loaded (standin_never never imported)" in lines[0]


def test_toggled_puts_back_exactly_what_was_there(tmp_path):
    out = json_lines(run(tmp_path).stdout)[0]
    assert out["toggled_off"] == ["disabled (toggled off)", [], "original"]
    assert out["after_off_identical"] is True
    assert out["toggled_on"] == ["applied (toggled on)", ["first", "second"], "patched"]
    assert out["after_on"] == ["not needed: upstream fixed (upstream does it)", []]


def test_strict_mode_raises_when_a_check_cannot_tell(tmp_path):
    proc = run(tmp_path, KIMI_HOTFIX_STRICT="1")
    assert proc.returncode == 1
    assert ("kimi_hotfix.base.KimiHotfixError: unknown: cannot tell whether it is needed: "
            "no source") in proc.stderr


WRAPPER = r'''
from kimi_hotfix import core
core.arm("test")
for i in range(3):
    try:
        core.wrapper_failed("some_patch", RuntimeError(f"boom {i}"), "vLLM's own code runs")
        print("contained")
    except core.KimiHotfixError as exc:
        print("raised", exc)
'''


@pytest.mark.parametrize("strict", [False, True])
def test_wrapper_failure_logged_once_with_what_runs_instead(strict):
    proc = run_python(["-c", WRAPPER], env=hermetic_env(KIMI_HOTFIX_STRICT="1" if strict else None))
    if strict:
        assert proc.stdout.splitlines() == [f"raised some_patch wrapper failed: boom {i}"
                                            for i in range(3)]
    else:
        assert proc.stdout.splitlines() == ["contained"] * 3
    warnings = warning_lines(proc.stderr)
    assert len(warnings) == 1
    assert "some_patch wrapper failed (RuntimeError: boom 0); vLLM's own code runs" in warnings[0]


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
    assert str(base.State(kind, detail)) == text
    assert base.State(kind, detail).kind in base.KINDS


def test_unknown_state_kind_raises():
    with pytest.raises(ValueError):
        base.State("undone")


def test_decisions():
    assert [d.applies for d in (base.needed("a"), base.fixed("b"), base.absent("c"),
                                base.cannot_tell("d"))] == [True, False, False, True]
    assert json.dumps(base.ProbeResult(ok=True, cases={"a": "b"}).as_dict())

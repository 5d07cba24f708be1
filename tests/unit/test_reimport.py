"""A target module re-imported after its patch applied (importlib.reload, or
removed from sys.modules and imported afresh): the patch settles again on the
new objects during that import (before anything reads the states), its state
says so, what it wrapped before stays wrapped, and
undo() puts back both. Child interpreters with stand-in patches (fakes.py),
as in test_states.py."""

from __future__ import annotations

import os

from helpers import REPO, STANDINS, hermetic_env, json_lines, run_python

CHILD = f"import sys\nsys.path.append({str(STANDINS)!r})\n" + r'''
import importlib
import fakes
from fakes import Fake
from kimi_hotfix.runtime import base, core, state, wrapping, patching
fakes.register(Fake("reloaded", patching.needed("the bug is there")),
               Fake("fresh", patching.needed("the bug is there")),
               Fake("untouched", patching.needed("the bug is there")),
               Fake("unsure", patching.cannot_tell("no source")))
core.arm("test")


def states():  # core.states(): an applied patch whose module was re-imported settles first
    return {n: [s.kind.value, str(s)] for n, s in core.states().items()}


mods = {n: importlib.import_module("standin_" + n) for n in ("reloaded", "fresh", "untouched", "unsure")}
old = {n: m.Thing for n, m in mods.items()}
out = {"before": states()}
importlib.reload(mods["reloaded"])
out["reloaded_unread"] = fakes.installed("standin_reloaded")  # before anything reads the states
importlib.reload(mods["unsure"])
del sys.modules["standin_fresh"]
out["removed"] = states()["fresh"]  # removed, not imported again yet: still in use
importlib.import_module("standin_fresh")
out["fresh_unread"] = fakes.installed("standin_fresh")
out["after"] = states()
out["new_wrapped"] = {n: fakes.installed("standin_" + n) for n in ("reloaded", "fresh")}
out["old_wrapped"] = {n: [a for a in ("first", "second") if wrapping.is_wrapped(vars(old[n])[a])]
                      for n in ("reloaded", "fresh")}
out["records"] = {n: len(state.records(n)) for n in ("reloaded", "fresh", "untouched")}
out["again"] = states()  # asking again settles nothing more
core.undo()
out["undone_new"] = {n: fakes.installed("standin_" + n) for n in ("reloaded", "fresh")}
out["undone_old"] = {n: [a for a in ("first", "second") if wrapping.is_wrapped(vars(old[n])[a])]
                     for n in ("reloaded", "fresh")}
out["old_calls"] = old["reloaded"]().first()
fakes.emit(out)
'''


def test_a_reimported_target_settles_again_and_undo_restores_both(tmp_path):
    for name in ("reloaded", "fresh", "untouched", "unsure"):
        (tmp_path / f"standin_{name}.py").write_text(
            "class Thing:\n    def first(self):\n        return 'original'\n"
            "    def second(self):\n        return 'original'\n")
    env = hermetic_env()
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), str(tmp_path)])
    proc = run_python(["-c", CHILD], env=env)
    out = json_lines(proc.stdout)[-1]
    applied = ["applied", "applied"]
    unsure = out["before"].pop("unsure")
    assert out["before"] == {"reloaded": applied, "fresh": applied, "untouched": applied}
    assert out["removed"] == applied  # removed, not imported again yet: nothing to settle
    # settled where the import happened, not when the states were read next
    assert out["reloaded_unread"] == out["fresh_unread"] == ["first", "second"]
    again = "applied (settled again: standin_{} was re-imported)"
    assert out["after"] == {"reloaded": ["applied", again.format("reloaded")],
                            "fresh": ["applied", again.format("fresh")], "untouched": applied,
                            "unsure": ["applied", unsure[1][:-1] + "; settled again: standin_unsure "
                                       "was re-imported)"]}
    assert out["again"] == out["after"]  # asking again settles nothing more
    assert out["new_wrapped"] == {"reloaded": ["first", "second"], "fresh": ["first", "second"]}
    assert out["old_wrapped"] == out["new_wrapped"]  # what it wrapped before stays wrapped
    assert out["records"] == {"reloaded": 2, "fresh": 2, "untouched": 2}
    assert out["undone_new"] == out["undone_old"] == {"reloaded": [], "fresh": []}
    assert out["old_calls"] == "original"

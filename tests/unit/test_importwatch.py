"""kimi_hotfix.runtime.importwatch in-process: a half-imported module's callbacks run
once its import ends (every callback, once, with the module or with None when
the import failed), the spec gets its class back, and a spec that cannot be
watched raises TypeError and is left as it was. The threaded arming that uses
it is tested end to end in test_lifecycle.py."""

from __future__ import annotations

import importlib.machinery
import sys
import types

import pytest

from kimi_hotfix.runtime import importwatch

WAITING = "_kimi_hotfix_waiting"


def half_imported(name):
    spec = importlib.machinery.ModuleSpec(name, None)
    spec._initializing = True
    module = types.ModuleType(name)
    module.__spec__ = spec
    return module, spec


def test_initializing_reads_the_spec_flag():
    module, spec = half_imported("kimi_iw_flag")
    assert importwatch.initializing(module) is True
    spec._initializing = False
    assert importwatch.initializing(module) is False
    del spec._initializing  # a spec the import system never marked
    assert importwatch.initializing(module) is False
    assert importwatch.initializing(object()) is False  # no __spec__ at all
    assert importwatch.initializing(types.SimpleNamespace(__spec__=None)) is False


def test_every_callback_runs_once_with_the_module_when_the_import_ends(monkeypatch):
    module, spec = half_imported("kimi_iw_ok")
    monkeypatch.setitem(sys.modules, "kimi_iw_ok", module)
    calls = []
    importwatch.when_imported(module, lambda m: calls.append(("first", m)))
    importwatch.when_imported(module, lambda m: calls.append(("second", m)))
    assert type(spec) is not importlib.machinery.ModuleSpec and calls == []
    assert spec._initializing is True
    spec._initializing = True  # still importing: nothing runs
    assert calls == []
    spec._initializing = False  # what _load_unlocked does when the module has run
    assert calls == [("first", module), ("second", module)]
    assert type(spec) is importlib.machinery.ModuleSpec and WAITING not in vars(spec)
    spec._initializing = True
    spec._initializing = False  # the class is back: nothing runs again
    assert len(calls) == 2


def test_a_failed_import_calls_back_with_none(monkeypatch):
    module, spec = half_imported("kimi_iw_failed")
    monkeypatch.delitem(sys.modules, "kimi_iw_failed", raising=False)  # the import system dropped it
    calls = []
    importwatch.when_imported(module, calls.append)
    spec._initializing = False
    assert calls == [None]
    # another module under the name (a retried import) is not this spec's
    module2, spec2 = half_imported("kimi_iw_failed")
    monkeypatch.setitem(sys.modules, "kimi_iw_failed", types.ModuleType("kimi_iw_failed"))
    importwatch.when_imported(module2, calls.append)
    spec2._initializing = False
    assert calls == [None, None]


def test_a_spec_that_cannot_be_watched_raises_and_is_left_as_it_was():
    spec = types.SimpleNamespace(name="kimi_iw_odd", _initializing=True)  # not a heap type
    module = types.SimpleNamespace(__spec__=spec)
    with pytest.raises(TypeError):
        importwatch.when_imported(module, lambda m: None)
    assert type(spec) is types.SimpleNamespace and vars(spec) == {"name": "kimi_iw_odd",
                                                                   "_initializing": True}

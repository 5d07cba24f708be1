"""kimi_hotfix.runtime.registry in-process: what a patch module that cannot be loaded
turns into (an ``Unloadable`` that names its module and cause in every text,
fails check and apply, and whose probe cannot run), and ``add``. The same in
deployed copies with broken files: test_faults.py and the fault tier."""

from __future__ import annotations

import sys
import types

import pytest

from kimi_hotfix.patches import PATCHES
from kimi_hotfix.runtime import patching, registry
from kimi_hotfix.runtime.base import PatchError
from kimi_hotfix.runtime.patching import Patch


@pytest.fixture
def fresh(monkeypatch):
    """A registry of its own: the package's patches, plus whatever a test adds."""
    monkeypatch.setattr(registry, "_patches", dict(registry.patches()))
    monkeypatch.setattr(registry, "_targets", dict(registry._targets))
    return registry


def test_a_module_whose_patch_is_not_a_patch_is_unloadable(monkeypatch):
    fake = types.ModuleType("kimi_hotfix.patches.kimi_test_notapatch")
    fake.PATCH = object()
    monkeypatch.setitem(sys.modules, fake.__name__, fake)
    patch = registry._load("kimi_test_notapatch")
    assert isinstance(patch, patching.Unloadable)
    assert patch.name == "kimi_test_notapatch"
    assert patch.module == "kimi_hotfix.patches.kimi_test_notapatch"
    assert patch.error.startswith(
        "TypeError: kimi_hotfix.patches.kimi_test_notapatch.PATCH is not a patching.Patch")


def test_a_module_that_cannot_be_imported_is_unloadable_with_its_cause():
    patch = registry._load("kimi_test_missing")
    assert isinstance(patch, patching.Unloadable) and patch.name == "kimi_test_missing"
    assert patch.error == "ModuleNotFoundError: No module named 'kimi_hotfix.patches.kimi_test_missing'"
    why = f"cannot load kimi_hotfix.patches.kimi_test_missing ({patch.error})"
    assert patch.why == why
    assert patch.summary == patch.decides == patch.probe_title \
        == "its module kimi_hotfix.patches.kimi_test_missing cannot load"
    for call in (lambda: patch.check(None, 0), lambda: patch.apply(None, None)):
        with pytest.raises(PatchError) as raised:
            call()
        assert str(raised.value) == why
    probe = patch.probe()
    assert probe.ok is None and probe.error == why
    assert patch.expect("0.29.0", 0) == (None, why)


def test_a_loadable_module_gives_its_patch():
    name = registry.names()[0]
    assert registry._load(name) is registry.get(name) and not isinstance(registry.get(name),
                                                                         patching.Unloadable)


def test_add_registers_a_patch_and_refuses_anything_else(fresh):
    extra = patching.Unloadable("kimi_test_extra", ValueError("boom"))
    assert isinstance(extra, Patch)
    fresh.add(extra)
    assert fresh.get("kimi_test_extra") is extra and fresh.names()[-1] == "kimi_test_extra"
    assert fresh.unloadable() == {"kimi_test_extra": extra}
    with pytest.raises(TypeError, match="is not a patching.Patch"):
        fresh.add(object())
    assert "kimi_test_extra" in fresh.names() and len(fresh.names()) == len(PATCHES) + 1

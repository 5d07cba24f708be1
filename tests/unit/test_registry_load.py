"""kimi_hotfix.runtime.registry in-process: what a patch module that cannot be loaded
turns into (an ``Unloadable`` that names its module and cause in every text,
fails decide and apply, and whose probe cannot run), the table's name and target, and ``add``. The same in
deployed copies with broken files: test_faults.py and the fault tier."""

from __future__ import annotations

import sys
import types

import pytest

from kimi_hotfix.patches import PATCHES
from kimi_hotfix.runtime import patching, registry
from kimi_hotfix.runtime.base import PatchError
from kimi_hotfix.runtime.patching import Patch
from kimi_hotfix.tools import about


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
    for call in (lambda: patch.decide(None, 0), lambda: patch.apply(None, None)):
        with pytest.raises(PatchError) as raised:
            call()
        assert str(raised.value) == why
    probe = patch.probe()
    assert probe.ok is None and probe.error == why
    info = about.of("kimi_test_missing")  # the tools' view says why too
    told = ("cannot load kimi_hotfix.patches.kimi_test_missing.about (ModuleNotFoundError: "
            "No module named 'kimi_hotfix.patches.kimi_test_missing')")
    assert isinstance(info, about.Unknown) and info.why == told
    assert info.summary == info.decides == info.upstream == told
    assert info.expect("0.29.0", 0) == (None, told)


def test_the_table_names_the_patch_and_its_target_once(monkeypatch):
    """The registry gives a patch its name and target from the table; a patch
    that says otherwise is not loaded (an ``Unloadable`` saying which)."""
    class Stray(patching.Patch):
        wraps = ("Thing.first",)

        def decide(self, module, optimize):
            return patching.needed("x")

        def apply(self, module, ctx):
            return None

    for declared, says in (({}, None), ({"target": "vllm.elsewhere"}, "target"),
                           ({"name": "other"}, "name")):
        fake = types.ModuleType("kimi_hotfix.patches.kimi_test_table")
        fake.PATCH = Stray()
        fake.PATCH.__dict__.update(declared)
        monkeypatch.setitem(sys.modules, fake.__name__, fake)
        monkeypatch.setitem(registry._targets, "kimi_test_table", "vllm.somewhere")
        patch = registry._load("kimi_test_table")
        if says is None:
            assert (patch.name, patch.target) == ("kimi_test_table", "vllm.somewhere")
        else:
            assert isinstance(patch, patching.Unloadable), patch
            assert f"PATCH says {says} " in patch.why and "the table says" in patch.why
            with pytest.raises(PatchError):
                patch.decide(None, 0)


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

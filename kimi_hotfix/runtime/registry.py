"""The registry: the patches of the table (kimi_hotfix.patches.PATCHES, their
names and targets), each patch's module loaded on first use.

Arming reads the table only; a patch's module (its class, its helpers) loads
when vLLM imports the patch's target (``get``), or when a tool asks for them
all (``patches``). A patch module that cannot be loaded (missing, a syntax
error, an exception at import, in it or in a shim module it imports) is not
allowed to take the others, or the host, down with it: it is registered as an
``Unloadable`` patch (kimi_hotfix.runtime.patching) under its module's name, which
reads ``failed`` with the cause, wraps nothing, and is never asked again.
"""

from __future__ import annotations

import importlib

from kimi_hotfix.patches import PATCHES

_targets: dict = dict(PATCHES)  # name -> target module, in registry order
_patches: dict = {}  # name -> Patch, as loaded


def _load(modname: str):
    from kimi_hotfix.runtime import patching  # the patch API: where it cannot load, no patch can

    target = _targets.get(modname, "")
    try:
        patch = importlib.import_module(f"kimi_hotfix.patches.{modname}").PATCH
        if not isinstance(patch, patching.Patch):
            raise TypeError(f"kimi_hotfix.patches.{modname}.PATCH is not a patching.Patch")
        for field, value in (("name", modname), ("target", target)):  # the table's, once
            declared = getattr(patch, field)
            if declared and declared != value:
                raise TypeError(f"kimi_hotfix.patches.{modname}.PATCH says {field} {declared!r}; "
                                f"the table says {value!r}")
            setattr(patch, field, value)
    except Exception as exc:  # contained: this patch fails, the others load
        return patching.Unloadable(modname, exc, target)
    return patch


def names() -> tuple:
    return tuple(_targets)


def target(name: str) -> str:
    """The module whose import triggers ``name`` (its module is not loaded)."""
    return _targets[name]


def get(name: str):
    """The patch, its module loaded now if it was not (an ``Unloadable`` if it
    cannot be)."""
    found = _patches.get(name)
    if found is None:
        found = _patches[name] = _load(name)
    return found


def broken(name: str):
    """Why ``name``'s module cannot load, where it was loaded already and could
    not be; else None (loads nothing)."""
    found = _patches.get(name)
    if found is None:
        return None
    from kimi_hotfix.runtime.patching import Unloadable

    return found.why if isinstance(found, Unloadable) else None


def patches() -> dict:
    """name -> Patch, every module loaded (the tools' view)."""
    return {name: get(name) for name in _targets}


def unloadable() -> dict:
    """name -> Unloadable: the patches whose module could not be loaded."""
    return {name: p for name, p in patches().items() if broken(name) is not None}


def add(patch) -> None:
    """Register one more patch (tests, and patches kept outside this package)."""
    from kimi_hotfix.runtime import patching
    if not isinstance(patch, patching.Patch):
        raise TypeError(f"{patch!r} is not a patching.Patch")
    _targets[patch.name] = patch.target
    _patches[patch.name] = patch

"""The patches, in registry order (kimi_hotfix.patches.PATCH_MODULES).

Importing a patch module imports neither vLLM nor wrapt; that happens in its
``check``/``apply``/``probe``, after vLLM loaded the target.
"""

from __future__ import annotations

import importlib

from kimi_hotfix.base import Patch
from kimi_hotfix.patches import PATCH_MODULES

_patches: dict = {}


def patches() -> dict:
    """name -> Patch. Each module defines ``PATCH``, a ``base.Patch``."""
    if not _patches:
        for modname in PATCH_MODULES:
            patch = importlib.import_module(f"kimi_hotfix.patches.{modname}").PATCH
            if not isinstance(patch, Patch):
                raise TypeError(f"kimi_hotfix.patches.{modname}.PATCH is not a base.Patch")
            _patches[patch.name] = patch
    return _patches


def add(patch: Patch) -> None:
    """Register one more patch (tests, and patches kept outside this package)."""
    if not isinstance(patch, Patch):
        raise TypeError(f"{patch!r} is not a base.Patch")
    patches()[patch.name] = patch


def names() -> tuple:
    return tuple(patches())


def get(name: str) -> Patch:
    return patches()[name]

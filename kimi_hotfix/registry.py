"""The patches, in registry order (kimi_hotfix.patches.PATCH_MODULES).

Importing a patch module imports neither vLLM nor wrapt; that happens in its
``check``/``apply``/``probe``, after vLLM loaded the target.

A patch module that cannot be loaded (missing, a syntax error, an exception at
import, in it or in a shim module it imports) is not allowed to take the
others, or the host, down with it: it is registered as an ``Unloadable`` patch
under its module's name, which reads ``failed`` with the cause, wraps nothing,
and is never asked again (the import is not retried on every ``names()``).
"""

from __future__ import annotations

import importlib

from kimi_hotfix.base import Patch, PatchError, ProbeResult, describe
from kimi_hotfix.patches import PATCH_MODULES

_patches: dict = {}


class Unloadable(Patch):
    """Stands in the registry for a patch module that cannot be loaded."""

    def __init__(self, modname: str, exc: BaseException):
        self.name = modname
        self.module = f"{__name__.rpartition('.')[0]}.patches.{modname}"
        self.error = describe(exc)
        self.why = f"cannot load {self.module} ({self.error})"
        self.summary = self.decides = self.probe_title = f"its module {self.module} cannot load"

    def check(self, module, optimize):
        raise PatchError(self.why)

    def apply(self, module, ctx):
        raise PatchError(self.why)

    def probe(self):
        return ProbeResult(ok=None, error=self.why)

    def expect(self, version, optimize):
        return None, self.why


def _load(modname: str) -> Patch:
    try:
        patch = importlib.import_module(f"kimi_hotfix.patches.{modname}").PATCH
        if not isinstance(patch, Patch):
            raise TypeError(f"kimi_hotfix.patches.{modname}.PATCH is not a base.Patch")
    except Exception as exc:  # contained: this patch fails, the others load
        return Unloadable(modname, exc)
    return patch


def patches() -> dict:
    """name -> Patch. Each module defines ``PATCH``, a ``base.Patch``; one that
    cannot be loaded is an ``Unloadable`` under its module's name."""
    if not _patches:
        for modname in PATCH_MODULES:
            patch = _load(modname)
            _patches[patch.name] = patch
    return _patches


def unloadable() -> dict:
    """name -> Unloadable: the patches whose module could not be loaded."""
    return {name: p for name, p in patches().items() if isinstance(p, Unloadable)}


def add(patch: Patch) -> None:
    """Register one more patch (tests, and patches kept outside this package)."""
    if not isinstance(patch, Patch):
        raise TypeError(f"{patch!r} is not a base.Patch")
    patches()[patch.name] = patch


def names() -> tuple:
    return tuple(patches())


def get(name: str) -> Patch:
    return patches()[name]

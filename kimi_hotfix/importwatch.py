"""Run a callback when a half-imported module has finished importing.

Arming can find a target module half-executed: another thread (or this one,
further up the stack) is importing it, and wrapt would run a post-import hook
on it at once, before its classes exist. The import system ends every import
with ``spec._initializing = False``, in the importing thread, after the module
has run (``importlib._bootstrap._load_unlocked``, Python 3.9 to 3.13). The
spec's class is swapped for a subclass that watches that one assignment, puts
the class back and runs the callbacks there and then: in the importing thread,
so no extra thread, no lock, and an exception (strict mode) fails that import
as a post-import hook's would.
"""

from __future__ import annotations

import functools
import sys
from typing import Callable

_WAITING = "_kimi_hotfix_waiting"  # on the watched spec: the callbacks to run


def initializing(module) -> bool:
    return bool(getattr(getattr(module, "__spec__", None), "_initializing", False))


def when_imported(module, callback: Callable) -> None:
    """Call ``callback(module)`` once ``module``'s import finishes, or
    ``callback(None)`` if it fails. TypeError/AttributeError where the spec
    cannot be watched (not a plain class instance)."""
    spec = module.__spec__
    waiting = vars(spec).get(_WAITING)
    if waiting is not None:
        waiting.append(callback)
        return
    vars(spec)[_WAITING] = [callback]
    try:
        spec.__class__ = _watching(type(spec))
    except TypeError:
        vars(spec).pop(_WAITING, None)
        raise


@functools.cache
def _watching(cls):
    def get(spec):
        return vars(spec).get("_initializing", False)

    def put(spec, value):
        vars(spec)["_initializing"] = value
        if not value:
            spec.__class__ = cls
            done = sys.modules.get(spec.name)
            if getattr(done, "__spec__", None) is not spec:
                done = None  # the import failed
            for callback in vars(spec).pop(_WAITING, []):
                callback(done)

    return type(f"Watched{cls.__name__}", (cls,), {"__slots__": (),
                                                    "_initializing": property(get, put)})

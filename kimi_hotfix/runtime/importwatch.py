"""Imports the post-import hooks do not see: a half-imported module, a re-import.

``when_imported``: arming can find a target module half-executed: another thread (or this one,
further up the stack) is importing it, and wrapt would run a post-import hook
on it at once, before its classes exist. The import system ends every import
with ``spec._initializing = False``, in the importing thread, after the module
has run (``importlib._bootstrap._load_unlocked``, Python 3.9 to 3.13). The
spec's class is swapped for a subclass that watches that one assignment, puts
the class back and runs the callbacks there and then: in the importing thread,
so no extra thread, no lock, and an exception (strict mode) fails that import
as a post-import hook's would.

``watch_reimports``: wrapt's hook for a module runs once, at its first import;
``importlib.reload`` or a fresh import (after ``del sys.modules[name]``) runs
the module's code again and vLLM gets new classes, unpatched. A finder first
on ``sys.meta_path`` (inserted when the first patch applies: an insertion,
unlike a removal, cannot make another thread's walk of the list skip a
finder) answers for the watched names only: it asks the finders after it and
wraps the loader, whose ``exec_module`` calls back once the module's code has
run, in the importing thread, before anything else can use it.
"""

from __future__ import annotations

import functools
import sys
import threading
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


class Reimports:
    """The finder behind ``watch_reimports``: finds nothing itself."""

    def __init__(self):
        self.watched: dict = {}  # module name -> callback(module)
        self._searching = threading.local()

    def find_spec(self, fullname, path=None, target=None):
        callback = self.watched.get(fullname)
        if callback is None or getattr(self._searching, "name", None) == fullname:
            return None
        self._searching.name = fullname
        try:
            for finder in [f for f in sys.meta_path if f is not self]:
                find = getattr(finder, "find_spec", None)
                spec = find(fullname, path, target) if find is not None else None
                if spec is not None:
                    break
            else:
                return None
        finally:
            self._searching.name = None
        if spec.loader is not None and hasattr(spec.loader, "exec_module"):
            spec.loader = _Reexecuted(spec.loader, callback)
        return spec

    def invalidate_caches(self):
        pass


class _Reexecuted:
    def __init__(self, loader, callback):
        self.loader, self.callback = loader, callback

    def __getattr__(self, name):
        return getattr(self.loader, name)

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module):
        module.__loader__ = module.__spec__.loader = self.loader  # what vLLM and linecache see
        self.loader.exec_module(module)
        self.callback(module)


_finder = None


def watch_reimports(name: str, callback: Callable) -> None:
    """Call ``callback(module)`` each time module ``name`` is imported again."""
    global _finder
    if _finder is None:
        _finder = Reimports()
    _finder.watched[name] = callback
    if _finder not in sys.meta_path:  # in place, as wrapt does: a thread walking the list
        sys.meta_path.insert(0, _finder)  # meanwhile sees one finder twice, never skips one

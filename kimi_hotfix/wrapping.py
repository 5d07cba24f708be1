"""What the shim installs, and how it puts it back.

A patch's ``apply(module, ctx)`` gets a ``PatchContext`` bound to that patch:
``ctx.wrap`` installs a wrapt ``FunctionWrapper`` (or a replacement function)
that carries ``MARKER`` naming the patch that owns it, and records it
(``Record``); ``ctx.failed`` reports the patch's own code failing at call time.

Ownership, as ArcticInference's ``ArcticPatch`` keeps it: an attribute that
already carries the marker of this patch is left alone (wrapped already, by this
or another copy of the shim: never twice); one that carries another patch's
marker is refused (``PatchError``: the patch fails, all or nothing).

``uninstall``/``reinstall`` act on records and touch an attribute only where it
still holds what the record says (something else may have re-wrapped it since);
they return the records they could not act on.
"""

from __future__ import annotations

import sys
import threading
from dataclasses import dataclass
from typing import Any, Callable, Optional

from kimi_hotfix.base import Context, PatchError

MARKER = "_self_kimi_hotfix_patch"  # on everything the shim installs: the owning patch's name
_install_lock = threading.Lock()  # held for one check-and-set, never around patch code


@dataclass
class Record:
    owner: Any
    attr: str
    original: Any  # the raw class/module __dict__ entry
    wrapper: Any

    @property
    def qualname(self) -> str:
        return f"{getattr(self.owner, '__qualname__', self.owner)}.{self.attr}"


def owner_of(obj) -> Optional[str]:
    """The name of the patch that installed ``obj``, or None."""
    name = getattr(obj, MARKER, None)
    return name if isinstance(name, str) else None


def is_wrapped(obj) -> bool:
    return owner_of(obj) is not None


_classes: dict = {}  # wrapt module -> its FunctionWrapper subclass


def wrapper_class(wrapt):
    """wrapt's ``FunctionWrapper``, made to pickle, copy and deepcopy the way
    the function it wraps does (wrapt's proxies refuse: NotImplementedError):
    a function by reference, module and qualified name (so it unpickles as
    whatever that attribute holds where it is loaded: the wrapper in a process
    with the shim, vLLM's own function without); a bound method as
    ``getattr(its self, its name)``, as Python pickles methods; copies are the
    object itself, as for functions."""
    found = _classes.get(wrapt)
    if found is not None:
        return found

    def __reduce_ex__(self, protocol):
        wrapped = self.__wrapped__
        if getattr(wrapped, "__self__", None) is not None:  # a bound method
            return wrapped.__reduce_ex__(protocol)
        path, _, name = wrapped.__qualname__.rpartition(".")
        if not path:  # a module's function: by reference
            return name
        owner = sys.modules[wrapped.__module__]  # a class's function: getattr(the class, name)
        for part in path.split("."):
            owner = getattr(owner, part)
        return getattr, (owner, name)

    def __copy__(self):
        return self

    def __deepcopy__(self, memo):
        return self

    body = {"__reduce_ex__": __reduce_ex__, "__reduce__": lambda self: __reduce_ex__(self, 2),
            "__copy__": __copy__, "__deepcopy__": __deepcopy__}
    bound = type("KimiHotfixBoundWrapper", (wrapt.BoundFunctionWrapper,), dict(body))
    found = type("KimiHotfixWrapper", (wrapt.FunctionWrapper,),
                 {**body, "__bound_function_wrapper__": bound})
    _classes[wrapt] = found
    return found


class PatchContext(Context):
    """``Context`` for one patch: its wraps go to ``records`` (shared with the
    core, so a fork can roll back a half-done apply); ``on_failure(name, exc,
    instead)`` is the core's wrapper-failure report."""

    def __init__(self, name: str, records: list, load_wrapt: Callable,
                 on_failure: Callable, skipped: Optional[list] = None):
        self.name = name
        self.records = records
        self.skipped = [] if skipped is None else skipped  # wrapped already by this patch
        self._load_wrapt = load_wrapt
        self._on_failure = on_failure

    def wrap(self, owner, attr, wrapper=None, *, replacement=None):
        if (wrapper is None) == (replacement is None):
            raise PatchError("wrap() takes a wrapper or a replacement")
        if attr not in vars(owner):
            raise PatchError(f"{getattr(owner, '__qualname__', owner)}.{attr} is not defined there")
        original = vars(owner)[attr]
        if replacement is None:
            proxy = wrapper_class(self._load_wrapt())(original, wrapper)
        else:
            proxy = replacement
            proxy.__wrapped__ = original
        setattr(proxy, MARKER, self.name)
        with _install_lock:
            if vars(owner).get(attr) is not original:
                raise PatchError(f"{Record(owner, attr, None, None).qualname} changed while "
                                 "being patched")
            current = owner_of(original)
            if current == self.name:
                self.skipped.append(attr)
                return None  # wrapped already, by this or another copy of the shim
            if current is not None:
                raise PatchError(f"{Record(owner, attr, None, None).qualname} is already "
                                 f"patched by kimi-hotfix patch {current!r}")
            setattr(owner, attr, proxy)
            self.records.append(Record(owner, attr, original, proxy))
        return proxy

    def failed(self, exc, instead):
        self._on_failure(self.name, exc, instead)


def _swap(records: list, have: str, put: str) -> list:
    """For each record (last first): where ``owner.attr`` still holds the
    record's ``have`` object, set its ``put`` object; return those it did not."""
    left = []
    with _install_lock:
        for rec in reversed(records):
            if vars(rec.owner).get(rec.attr) is getattr(rec, have):
                setattr(rec.owner, rec.attr, getattr(rec, put))
            else:
                left.append(rec)
    return left


def uninstall(records: list) -> list:
    """Put vLLM's own objects back; the records whose wrapper was replaced since."""
    return _swap(records, "wrapper", "original")


def reinstall(records: list) -> list:
    """Put the shim's objects back; the records whose original was replaced since."""
    return _swap(records, "original", "wrapper")


def after_fork_in_child() -> None:
    """A forked child starts with a new lock (another thread may have held it)."""
    global _install_lock
    _install_lock = threading.Lock()

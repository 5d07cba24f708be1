"""What the shim installs, and how it puts it back.

A patch's ``apply(module, ctx)`` gets a ``PatchContext`` bound to that patch:
``ctx.wrap`` installs a wrapt ``FunctionWrapper`` (or a replacement function)
that carries ``MARKER`` naming the patch that owns it, and records it
(``Record``); ``ctx.failed`` reports the patch's own code failing at call time.

Ownership, as ArcticInference's ``ArcticPatch`` keeps it: an attribute that
already carries the marker of this patch is left alone (wrapped already, by this
or another copy of the shim: never twice); one that carries another patch's
marker is refused (``PatchError``: the patch fails, all or nothing).

Other instrumentation (an APM agent's wrapt ``FunctionWrapper``, a
``functools.wraps`` wrapper in another package) may wrap the same attribute,
before the shim or after it. ``layers(owner, attr)`` follows such wrappers down
to vLLM's own object: each step is a *slot* the shim can rewrite (the
attribute; a proxy's ``__wrapped__``; the closure cell a ``functools.wraps``
wrapper calls through). ``vllm_own`` is what the patches' decisions read;
``wrap`` installs the shim's wrapper in the slot that holds vLLM's own object,
beneath the other wrappers, so they keep running and the shim's still runs;
where no slot reaches it (a closure with no single cell holding it), the patch
fails (PatchError) rather than bypass the other library or run unpatched
while saying ``applied``. A wrapper of vLLM's own package is vLLM's: the walk
stops there.

``uninstall``/``reinstall`` find the record's object in the layers, wherever
it sits now (another library may have wrapped above it since), and rewrite
only the slot that still holds it; they return the records they could not
act on.
"""

from __future__ import annotations

import os
import sys
import threading
import types
from dataclasses import dataclass
from typing import Any, Callable, Optional

from kimi_hotfix.runtime import messages
from kimi_hotfix.runtime.base import MARKER, PatchError, is_wrapped  # noqa: F401
from kimi_hotfix.runtime.patching import Context

_install_lock = threading.Lock()  # held for one check-and-set, never around patch code
_said: set = set()  # the remarks patches logged through Context.log in this process
SAID_MAX = 64
OUR_TYPES = ("KimiHotfixWrapper", "KimiHotfixBoundWrapper")  # wrapper_class's, in any copy
MAX_DEPTH = 16  # wrappers followed down one attribute


@dataclass
class Record:
    owner: Any
    attr: str
    original: Any  # the raw class/module __dict__ entry
    wrapper: Any

    @property
    def qualname(self) -> str:  # a class's qualified name, a module's name
        owner = getattr(self.owner, "__qualname__", None) or getattr(self.owner, "__name__", self.owner)
        return f"{owner}.{self.attr}"


def owner_of(obj) -> Optional[str]:
    """The name of the patch that installed ``obj``, or None."""
    name = getattr(obj, MARKER, None)
    return name if isinstance(name, str) else None


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


# -- the layers of wrappers on one attribute ---------------------------------------------


class _AttrSlot:
    def __init__(self, owner, attr):
        self.owner, self.attr = owner, attr

    def get(self):
        return vars(self.owner).get(self.attr)

    def set(self, value):
        setattr(self.owner, self.attr, value)


class _ProxySlot:  # a wrapt-style proxy's __wrapped__ (settable)
    def __init__(self, proxy):
        self.proxy = proxy

    def get(self):
        return self.proxy.__wrapped__

    def set(self, value):
        self.proxy.__wrapped__ = value


class _CellSlot:  # the closure cell a functools.wraps wrapper calls through
    def __init__(self, cell):
        self.cell = cell

    def get(self):
        return self.cell.cell_contents

    def set(self, value):
        self.cell.cell_contents = value


def _home(owner) -> str:
    """The directory (or file) of the owner's top-level package: vLLM's own code."""
    name = owner.__name__ if isinstance(owner, types.ModuleType) else owner.__module__
    top = sys.modules.get(name.split(".")[0])
    path = getattr(top, "__file__", None) or ""
    if os.path.basename(path) == "__init__.py":
        return os.path.dirname(path) + os.sep
    return path


def own_marker(node) -> Optional[str]:
    """The patch that installed this very object (never what it proxies)."""
    if type(node).__name__ in OUR_TYPES:
        return getattr(node, MARKER, None)
    if type(node) is types.FunctionType:
        found = node.__dict__.get(MARKER)
        return found if isinstance(found, str) else None
    return None


def _is_proxy(node) -> bool:
    if type(node) in (types.FunctionType, classmethod, staticmethod, types.MethodType):
        return False
    desc = getattr(type(node), "__wrapped__", None)
    return desc is not None and hasattr(desc, "__set__")


def _bottom(obj):
    """What ``obj`` proxies, through every proxy (wrapt's, the shim's)."""
    for _ in range(MAX_DEPTH):
        if not _is_proxy(obj):
            break
        obj = obj.__wrapped__
    return obj


def _leads_to(obj, target) -> bool:
    for _ in range(MAX_DEPTH):
        if obj is target:
            return True
        if not _is_proxy(obj):
            return False
        obj = obj.__wrapped__
    return False


def _cell_below(func):
    """The one closure cell through which the ``functools.wraps`` wrapper
    ``func`` calls what it wraps: the cell whose object is (or proxies, the
    shim's wrapper included) what its ``__wrapped__`` names, which is only a
    hint (it is not updated when that cell is rewritten); None if not one."""
    target = _bottom(func.__dict__["__wrapped__"])
    cells = []
    for cell in func.__closure__ or ():
        try:
            if _leads_to(cell.cell_contents, target):
                cells.append(cell)
        except ValueError:  # an empty cell
            pass
    return cells[0] if len(cells) == 1 else None


def layers(owner, attr) -> list:
    """[(slot or None, object)] from ``owner.attr`` down to vLLM's own object:
    through proxies (any wrapt copy's, the shim's) and through other
    packages' ``functools.wraps`` wrappers; a slot None: nothing can rewrite
    that step (the walk ends there)."""
    home = _home(owner)
    slot = _AttrSlot(owner, attr)
    node = slot.get()
    out = [(slot, node)]
    for _ in range(MAX_DEPTH):
        if _is_proxy(node):
            node, slot = node.__wrapped__, _ProxySlot(node)
        elif (type(node) is types.FunctionType and "__wrapped__" in node.__dict__
              and own_marker(node) is None and not node.__code__.co_filename.startswith(home)):
            cell = _cell_below(node)
            node, slot = ((cell.cell_contents, _CellSlot(cell)) if cell is not None
                          else (node.__wrapped__, None))
        else:
            break
        out.append((slot, node))
        if slot is None:
            break
    return out


def vllm_own(owner, attr):
    """vLLM's own object beneath whatever wraps ``owner.attr`` (the attribute
    itself where nothing does)."""
    return layers(owner, attr)[-1][1]


def _describe(node) -> str:
    code = getattr(node, "__code__", None)
    where = f" ({code.co_filename})" if type(node) is types.FunctionType and code else ""
    return f"{getattr(node, '__module__', '?')}.{getattr(node, '__qualname__', type(node).__name__)}{where}"


class PatchContext(Context):
    """``Context`` for one patch: its wraps go to ``records`` (shared with the
    core, so a fork can roll back a half-done apply); ``on_failure(name, exc,
    instead)`` is the core's wrapper-failure report, ``on_spent(phase,
    seconds)`` its cost account."""

    def __init__(self, name: str, records: list, load_wrapt: Callable,
                 on_failure: Callable, on_spent: Optional[Callable] = None,
                 skipped: Optional[list] = None):
        self.name = name
        self.records = records
        self.skipped = [] if skipped is None else skipped  # wrapped already by this patch
        self._load_wrapt = load_wrapt
        self._on_failure = on_failure
        self._on_spent = on_spent

    def wrap(self, owner, attr, wrapper=None, *, replacement=None):
        if (wrapper is None) == (replacement is None):
            raise PatchError("wrap() takes a wrapper or a replacement")
        qualname = Record(owner, attr, None, None).qualname
        if attr not in vars(owner):
            raise PatchError(f"{qualname} is not defined there")
        links = layers(owner, attr)
        for _slot, node in links:
            current = own_marker(node)
            if current == self.name:
                self.skipped.append(attr)
                return None  # wrapped already, by this or another copy of the shim
            if current is not None:
                raise PatchError(f"{qualname} is already patched by kimi-hotfix patch {current!r}")
        slot, original = links[-1]
        if slot is None:
            raise PatchError(f"{qualname} is wrapped by {_describe(links[-2][1])}, whose closure does "
                             "not hold vLLM's own function in one cell: the shim cannot run "
                             "beneath it")
        if replacement is None:
            proxy = wrapper_class(self._load_wrapt())(original, wrapper)
        else:
            proxy = replacement
            proxy.__wrapped__ = original
        setattr(proxy, MARKER, self.name)
        with _install_lock:
            if slot.get() is not original:
                raise PatchError(f"{qualname} changed while being patched")
            slot.set(proxy)
            self.records.append(Record(owner, attr, original, proxy))
        return proxy

    def failed(self, exc, instead):
        self._on_failure(self.name, exc, instead)

    def spent(self, phase, seconds):
        if self._on_spent is not None:
            self._on_spent(phase, seconds)

    def log(self, detail):
        detail = str(detail)
        if detail in _said or len(_said) >= SAID_MAX:
            return  # each remark once per process, and a bounded number of them
        _said.add(detail)
        messages.emit(messages.PATCH_SAYS, self.name, detail)


def holds(rec, obj) -> bool:
    """Do the layers on the record's attribute hold ``obj`` (in a slot that can
    be rewritten)?"""
    return any(slot is not None and node is obj for slot, node in layers(rec.owner, rec.attr))


def reachable(rec) -> bool:
    """Does vLLM still reach what the record wrapped: the attribute holds the
    wrapper, and its owner is what its module (in sys.modules) names? False
    after ``importlib.reload`` or a fresh import of the module (new objects)."""
    if not holds(rec, rec.wrapper):
        return False
    if isinstance(rec.owner, type(sys)):
        found = sys.modules.get(rec.owner.__name__)
        return found is None or found is rec.owner  # removed, not re-imported yet: still in use
    found = sys.modules.get(rec.owner.__module__)
    if found is None:
        return True
    for part in rec.owner.__qualname__.split("."):
        found = getattr(found, part, None)
    return found is rec.owner


def _swap(records: list, have: str, put: str) -> list:
    """For each record (last first): where the layers on ``owner.attr`` still
    holds the record's ``have`` object (on the attribute, or beneath another
    library's wrapper, or above one), put its ``put`` object in that slot;
    return the records it could not act on."""
    left = []
    with _install_lock:
        for rec in reversed(records):
            target = getattr(rec, have)
            for slot, node in layers(rec.owner, rec.attr):
                if slot is not None and node is target:
                    slot.set(getattr(rec, put))
                    break
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

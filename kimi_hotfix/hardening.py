"""Plain-Python checks under ``python -O``, one vLLM function at a time.

``python -O`` strips every ``assert``. Where vLLM guards a configuration or an
invariant with ``assert``, plain Python refuses what ``-O`` accepts; where a
caller catches the AssertionError to fall back, ``-O`` skips the fallback.
This module gives a named vLLM function its plain-Python behaviour back:

- ``asserts(func)``: how many ``assert`` statements the function's own source
  holds (a structural check on its parsed source, not on text a comment could
  satisfy); ``None`` where the source is unavailable; ``checks(func)``: the
  same less the type-narrowing ones;
- ``harden(func)``: the function recompiled from vLLM's own source with each
  ``assert cond, msg`` written as ``if not cond: raise AssertionError(msg)``,
  compiled with ``optimize=0`` (kimi_hotfix.recompile: checked byte for byte
  against the running code first; PatchError otherwise);
- ``OnFirstCall(name, funcs).wrapper(func)``: a wrapper for ``wrap()`` that
  hardens the functions the first time one of them is called, not when vLLM
  imports them (their source must be there when they are wrapped: PatchError
  otherwise, so the patch reads ``failed`` at once, not ``applied``). The
  functions hardened here run once or rarely (start-up checks, a barrier's
  group lookup) and their modules are large: recompiling means parsing the
  whole module (30 to 80 ms for vllm/config/vllm.py or
  vllm/distributed/parallel_state.py), which only the process that calls the
  function should pay (bench/o_parity_mechanism.py). If hardening fails on that
  first call (the source does not match the running code), the wrapper runs
  vLLM's own function from then on and reports every such call
  (``ctx.failed``: counted in the state, logged once; strict mode raises).

The AssertionError raised is the one plain Python raises: same type, same
message, same condition evaluated once. The rewrite keeps the function's
name, defaults, annotations, ``__dict__`` and line numbers.
"""

from __future__ import annotations

import ast
import linecache
import os
import sys
import threading
import time
import types
import weakref

from kimi_hotfix import recompile, wrapping
from kimi_hotfix.base import PatchError


class AssertToRaise(ast.NodeTransformer):
    """``assert test, msg`` -> ``if not test: raise AssertionError(msg)``."""

    def visit_Assert(self, node):
        raise_exc = ast.Raise(
            exc=ast.Call(
                func=ast.Name(id="AssertionError", ctx=ast.Load()),
                args=[node.msg] if node.msg is not None else [],
                keywords=[],
            ),
            cause=None,
        )
        check = ast.If(
            test=ast.UnaryOp(op=ast.Not(), operand=node.test), body=[raise_exc], orelse=[]
        )
        return ast.fix_missing_locations(ast.copy_location(check, node))


def asserts(func):
    """Number of ``assert`` statements in ``func``'s source (nested defs
    included), or None when it has no source (kimi_hotfix.recompile reads it:
    the def alone, not the whole module, where it can). Counted once per code
    object: a patch's check and its apply ask the same question."""
    return _counts(func)[0]


def checks(func):
    """Like ``asserts``, less the type-narrowing ones (``isinstance(...)``,
    ``x is not None``, with no message: recompile.type_narrowing); None when
    there is no source."""
    return _counts(func)[1]


def _counts(func) -> tuple:
    code = getattr(func, "__code__", None)
    if code is None:
        return None, None
    if code not in _ASSERTS:
        try:
            tree = recompile.function_ast(func)
            _ASSERTS[code] = (recompile.asserts_in(tree),
                              recompile.asserts_in(tree, skip=recompile.type_narrowing))
        except PatchError:
            _ASSERTS[code] = None, None
    return _ASSERTS[code]


_ASSERTS: dict = {}  # {code object: (asserts, checks)}; a handful of entries per process


def harden(func):
    """``func`` recompiled with its asserts as explicit raises, compiled with
    ``optimize=0`` (PatchError if its source does not match the running code)."""
    return recompile.recompile(func, AssertToRaise().visit, optimize=0)


class OnFirstCall:
    """Wrappers for ``ctx.wrap()`` that call the hardened functions in place of
    vLLM's; all of ``funcs`` are hardened together, on the first call of any
    of them (one parse of their module), once per process. ``funcs`` are the
    undecorated functions (for methods, the functions in the class
    ``__dict__``); ``ctx`` is the patch's context (its ``failed`` reports a
    recompile that fails on that first call).

    The lock is held across that recompile. A process forked meanwhile by
    another thread would inherit it held by a thread it does not have: every
    instance gets a new lock in a forked child (``os.register_at_fork``), where
    nothing is built yet, so the child's own first call builds its own."""

    def __init__(self, ctx, funcs, instead="vLLM's own function runs (its asserts stripped by -O)"):
        self.ctx, self.name, self.funcs, self.instead = ctx, ctx.name, list(funcs), instead
        for func in self.funcs:  # known now: without source there is nothing to recompile
            if not linecache.getlines(func.__code__.co_filename, func.__globals__):
                raise PatchError(f"source of {func.__qualname__} unavailable "
                                 f"({func.__code__.co_filename}): nothing to recompile its asserts from")
            # under -O the asserts compiled on the first call are in no running code to
            # compare them with: the file must be the running code's source (checked
            # again on that first call, where a later change makes it fail each call)
            why = sys.flags.optimize and recompile.not_the_running_source(func.__code__.co_filename)
            if why:
                raise PatchError(f"{func.__qualname__}: {why}: its asserts cannot be checked "
                                 "against the running code under -O")
        self.impls = None  # {func: hardened or None}, built on the first call
        self.failure = None  # why the first call could not harden them
        self._lock = threading.RLock()
        _INSTANCES.add(self)

    def _after_fork_in_child(self):
        self._lock = threading.RLock()

    def impl(self, func):
        if self.impls is None:
            with self._lock:
                if self.impls is None:
                    self.impls = self._build()
        return self.impls.get(func)

    def _build(self):
        impls = {}
        failure = None
        started = time.perf_counter()
        try:
            for func in self.funcs:
                impls[func] = recompile.recompile(func, AssertToRaise().visit, optimize=0)
        except Exception as exc:  # all or nothing: vLLM's own functions from now on
            impls, failure = dict.fromkeys(self.funcs), exc
        finally:
            recompile.forget()  # the parsed module served these functions only
        self.failure = failure
        self.ctx.spent("first_call", time.perf_counter() - started)  # on /metrics
        return impls

    def wrapper(self, func):
        def first_call_wrapper(wrapped, instance, args, kwargs):
            impl = self.impl(func)
            if impl is None:  # every such call is counted (logged once; strict mode raises)
                self.ctx.failed(self.failure, self.instead)
                return wrapped(*args, **kwargs)
            if instance is None:
                return impl(*args, **kwargs)
            return impl(instance, *args, **kwargs)

        first_call_wrapper.__qualname__ = f"kimi_hotfix.{self.name}[{func.__qualname__}]"
        return first_call_wrapper


_INSTANCES: weakref.WeakSet[OnFirstCall] = weakref.WeakSet()


def _after_fork_in_child():
    for instance in list(_INSTANCES):
        instance._after_fork_in_child()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def require(owner, attr):
    """vLLM's own function stored as ``owner.attr`` (beneath any other library's
    wrapper: kimi_hotfix.wrapping.vllm_own), or PatchError."""
    value = wrapping.vllm_own(owner, attr) if attr in vars(owner) else None
    if value is None or type(value) is not types.FunctionType:
        where = getattr(owner, "__qualname__", getattr(owner, "__name__", owner))
        raise PatchError(f"{where}.{attr} not found (or not a plain function)")
    return value

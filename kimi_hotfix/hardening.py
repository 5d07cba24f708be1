"""Plain-Python checks under ``python -O``, one vLLM function at a time.

``python -O`` strips every ``assert``. Where vLLM guards a configuration or an
invariant with ``assert``, plain Python refuses what ``-O`` accepts; where a
caller catches the AssertionError to fall back, ``-O`` skips the fallback.
This module gives a named vLLM function its plain-Python behaviour back:

- ``asserts(func)``: how many ``assert`` statements the function's own source
  holds (a structural check on its parsed source, not on text a comment could
  satisfy); ``None`` where the source is unavailable;
- ``harden(func)``: the function recompiled from vLLM's own source with each
  ``assert cond, msg`` written as ``if not cond: raise AssertionError(msg)``,
  compiled with ``optimize=0`` (kimi_hotfix.recompile: checked byte for byte
  against the running code first; PatchError otherwise);
- ``OnFirstCall(name, funcs).wrapper(func)``: a wrapper for ``wrap()`` that
  hardens the functions the first time one of them is called, not when vLLM
  imports them. The
  functions hardened here run once or rarely (start-up checks, a barrier's
  group lookup) and their modules are large: recompiling means parsing the
  whole module (30 to 80 ms for vllm/config/vllm.py or
  vllm/distributed/parallel_state.py), which only the process that calls the
  function should pay (bench/o_parity_mechanism.py). If hardening fails on that
  first call (the source does not match the running code), the wrapper logs
  once (``core.wrapper_failed``), runs vLLM's own function from then on, and
  strict mode raises.

The AssertionError raised is the one plain Python raises: same type, same
message, same condition evaluated once. The rewrite keeps the function's
name, defaults, annotations, ``__dict__`` and line numbers.
"""

from __future__ import annotations

import ast
import inspect
import linecache
import threading

from kimi_hotfix import recompile
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


def _indent(line):
    return len(line) - len(line.lstrip())


def _block_end(lines, start):
    """Index one past the function that starts at ``lines[start]`` (decorators
    first), by indentation: the first code line after the ``def`` line that is
    indented no deeper than the ``def``. Cheap, and exact for code that keeps
    multi-line strings and brackets indented; the caller parses the result
    and falls back to inspect's tokenizer when it does not parse."""
    index = start
    while index < len(lines) and not lines[index].lstrip().startswith(("def ", "async def ")):
        index += 1
    depth = _indent(lines[index]) if index < len(lines) else 0
    for end in range(index + 1, len(lines)):
        text = lines[end].strip()
        if text and not text.startswith("#") and _indent(lines[end]) <= depth:
            return end
    return len(lines)


def _parse_block(text):
    indented = text[:1].isspace()
    return ast.parse(("if 1:\n" if indented else "") + text)


def _own_source(func):
    """(text, tree) of the function's own lines (decorators included), read
    from linecache without parsing the whole module: what makes this cheap
    enough for a patch's check. None where there is no source."""
    code = getattr(func, "__code__", None)
    if code is None:
        return None
    lines = linecache.getlines(code.co_filename)
    start = code.co_firstlineno - 1
    if not lines or start >= len(lines):
        return None
    text = "".join(lines[start:_block_end(lines, start)])
    try:
        return text, _parse_block(text)
    except SyntaxError:
        pass
    try:  # inspect's block finder tokenizes: slower, exact
        text = "".join(inspect.getblock(lines[start:]))
        return text, _parse_block(text)
    except (SyntaxError, Exception):  # tokenize errors: treat as no source
        return None


def asserts(func):
    """Number of ``assert`` statements in ``func``'s source (nested defs
    included), or None when its source is unavailable or does not parse."""
    found = _own_source(func)
    if found is None:
        return None
    _, tree = found
    defs = [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
    if not defs or defs[0].name != func.__code__.co_name:
        return None
    return sum(isinstance(n, ast.Assert) for n in ast.walk(defs[0]))


def harden(func):
    """``func`` recompiled with its asserts as explicit raises (PatchError if
    its source does not match the running code)."""
    hardened = recompile.recompile(func, AssertToRaise().visit, optimize=0)
    recompile.forget()  # the parsed module served this one function
    return hardened


class OnFirstCall:
    """Wrappers for ``wrap()`` that call the hardened functions in place of
    vLLM's; all of ``funcs`` are hardened together, on the first call of any
    of them (one parse of their module), once per process. ``funcs`` are the
    undecorated functions (for methods, the functions in the class
    ``__dict__``)."""

    def __init__(self, name, funcs, instead="vLLM's own function runs (its asserts stripped by -O)"):
        self.name, self.funcs, self.instead = name, list(funcs), instead
        self.impls = None  # {func: hardened or None}, built on the first call
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
        try:
            for func in self.funcs:
                impls[func] = recompile.recompile(func, AssertToRaise().visit, optimize=0)
        except Exception as exc:  # all or nothing: vLLM's own functions from now on
            impls, failure = dict.fromkeys(self.funcs), exc
        finally:
            recompile.forget()  # the parsed module served these functions only
        if failure is not None:
            from kimi_hotfix import core

            core.wrapper_failed(self.name, failure, self.instead)  # strict mode raises
        return impls

    def wrapper(self, func):
        def first_call_wrapper(wrapped, instance, args, kwargs):
            impl = self.impl(func)
            if impl is None:
                return wrapped(*args, **kwargs)
            if instance is None:
                return impl(*args, **kwargs)
            return impl(instance, *args, **kwargs)

        first_call_wrapper.__qualname__ = f"kimi_hotfix.{self.name}[{func.__qualname__}]"
        return first_call_wrapper


def require(owner, attr):
    """``owner.attr`` as stored in its ``__dict__`` (a plain function), or PatchError."""
    value = vars(owner).get(attr)
    if value is None or not inspect.isfunction(value):
        where = getattr(owner, "__qualname__", getattr(owner, "__name__", owner))
        raise PatchError(f"{where}.{attr} not found (or not a plain function)")
    return value

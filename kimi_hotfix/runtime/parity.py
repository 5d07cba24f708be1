"""-O parity: under ``python -O``, vLLM's own modules run the bytecode plain Python runs.

Why: vLLM steers by ``assert``. ``python -O`` (the nightly containers) strips
every one: the KV-cache spec merges collapse groups (the seed's illegal memory
access), the planner's ``except AssertionError`` fallbacks never fire, a
barrier gets ``None`` instead of falling back, a configuration plain Python
refuses starts, and KV-cache ownership guards vanish, so a wrong block goes on
silently (vLLM's own tests, run under ``-O``, find them: tests/vllm_suite/).
One mechanism restores every assert of vLLM, present and future, instead of
one patch per function found.

What it changes, under ``-O`` only (plain Python keeps its asserts: nothing
to do; ``KIMI_HOTFIX_DISABLE=o_parity`` or ``KIMI_HOTFIX=0`` turn it off):

- ``PlainFinder`` goes on ``sys.meta_path`` right before Python's own
  ``PathFinder`` when the shim arms (under the bootstrap: as ``import vllm``
  starts, before any module of vLLM has run). For ``vllm`` and ``vllm.*`` it
  asks the finders after it and, where the spec's loader is Python's own
  ``SourceFileLoader``, loads the module with ``PlainLoader``: the plain
  ``.pyc`` where Python's own rule accepts it (kimi_hotfix.runtime.bytecode; pip
  writes these at install), else the source compiled with ``optimize=0``,
  cached as plain Python caches it (the plain ``.pyc``, where Python may
  write bytecode). Asserts, ``if __debug__:`` blocks and docstrings are plain
  Python's. Other finders before it (wrapt's hooks, the shim's re-import
  watch) wrap its loader as they wrap Python's.
- vLLM modules imported before arming (vLLM's plugin loader arms the shim
  late, under launchers whose ``sitecustomize`` shadows the bootstrap; the
  ``vllm`` package's own ``__init__`` under the bootstrap, once it has run):
  each function of theirs that the module's namespace reaches (module
  functions, methods, static and class methods, properties, ``__wrapped__``
  chains) gets the plain code object of the same def (same name, first line,
  arguments, locals and closure), where the ``.py`` on disk is provably the
  source of the code this process runs (bytecode.not_the_running_source).
  A module that cannot be proven keeps its ``-O`` code and is named.

``check``, the summary line, ``status`` and ``/metrics`` (``kimi_hotfix_info``'s
``o_parity`` label) say which parity is in force: ``package`` (every vLLM
module loaded with plain bytecode), ``late`` (armed after vLLM modules had run:
their functions given plain code in place), ``partial`` (some could not be:
named), ``off``, ``plain`` (no ``-O``: nothing to restore), ``failed``.

Upstream: no release up to 0.33.0 runs under ``-O`` as in plain Python; the
fixes for the sites that matter to the deployments: upstream/.

Not restored: module-level and class-body asserts of modules imported before
arming (they ran once, at import); functions only another object holds (a
registry, a closure) in those modules (counted as not reached). Undo removes
the finder and puts the in-place code back; modules loaded with plain bytecode
keep it (a re-import would load them with ``-O``'s).
"""

from __future__ import annotations

import dis
import functools
import importlib.machinery
import sys
import threading
import types
from typing import Optional

from kimi_hotfix.runtime import bytecode

PACKAGE = "vllm"
NAME = "o_parity"  # its name in KIMI_HOTFIX_DISABLE and on /metrics
_ASSERT_OP = dis.opmap.get("LOAD_ASSERTION_ERROR")
_CO_OPTIMIZED = 0x1  # inspect.CO_OPTIMIZED: a function's code (not a module or class body)


def is_vllm(name: str) -> bool:
    return name == PACKAGE or name.startswith(PACKAGE + ".")


class PlainLoader(importlib.machinery.SourceFileLoader):
    """Python's source loader, with the bytecode plain Python would run: the
    plain ``.pyc`` where Python's rule accepts it, else the source compiled at
    level 0 and cached as plain Python caches it (not under
    ``PYTHONDONTWRITEBYTECODE``; written by importlib's own ``set_data``)."""

    optimize = 0  # the level its modules' code is compiled at

    def get_code(self, fullname):
        path = self.get_filename(fullname)
        source = self.get_data(path)
        found = bytecode.cached(path, 0, source)
        code = bytecode.load(path, 0, source) if found.used else None
        if code is None:
            code = compile(source, path, "exec", dont_inherit=True, optimize=0)
            if not sys.dont_write_bytecode and found.path:
                data = bytecode.dump(code, path, source, hashed=found.kind == "checked-hash")
                if data is not None:  # importlib's own writer: atomic, the source's mode
                    self._cache_bytecode(path, found.path, data)  # (it ignores OSError)
        return code

    def source_to_code(self, data, path, *, _optimize=-1):
        return compile(data, path, "exec", dont_inherit=True, optimize=0)


class PlainFinder:
    """Finds nothing itself: for vLLM's modules it asks the finders after it
    and gives Python's own source loader's specs a ``PlainLoader``."""

    def __init__(self):
        self._searching = threading.local()

    def find_spec(self, fullname, path=None, target=None):
        if not is_vllm(fullname) or getattr(self._searching, "name", None) == fullname:
            return None
        self._searching.name = fullname
        try:
            meta_path = sys.meta_path
            after = meta_path[meta_path.index(self) + 1:] if self in meta_path else []
            for finder in after:
                find = getattr(finder, "find_spec", None)
                spec = find(fullname, path, target) if find is not None else None
                if spec is not None:
                    break
            else:
                return None
        finally:
            self._searching.name = None
        loader = spec.loader
        if type(loader) is importlib.machinery.SourceFileLoader and spec.origin:
            spec.loader = PlainLoader(loader.name, loader.path)
            cached = bytecode.pyc_path(spec.origin, 0)
            if cached:
                spec.cached = cached
        return spec

    def invalidate_caches(self):
        pass


class Report:
    """What parity did in this process (read by kimi_hotfix.runtime.core)."""

    def __init__(self):
        self.late: list = []  # vLLM modules that had run before arming
        self.swapped: dict = {}  # module name -> functions given plain code in place
        self.refused: dict = {}  # module name -> why its code stays -O's
        self.unreached: dict = {}  # module name -> defs with asserts no function object runs
        self.undone = False

    def plain_modules(self) -> int:
        return sum(1 for name, m in list(sys.modules.items())
                   if is_vllm(name) and runs_plain(m))

    def mode(self) -> str:
        if self.undone:
            return "off"
        if self.refused:
            return "partial"
        return "late" if self.swapped else "package"  # late: code given in place

    def text(self) -> str:
        mode = self.mode()
        if mode == "off":
            return "off (undone: modules loaded since run with -O's bytecode)"
        parts = [f"{mode}: vLLM's modules load with plain Python's bytecode"]
        if self.swapped:
            parts.append(f"armed after {len(self.late)} had run: {sum(self.swapped.values())} "
                         f"functions of {len(self.swapped)} given plain code in place")
        if self.refused:
            parts.append("kept -O's code: " + "; ".join(f"{m} ({why})" for m, why in
                                                       sorted(self.refused.items())[:3])
                         + (f" and {len(self.refused) - 3} more" if len(self.refused) > 3 else ""))
        if self.unreached:
            parts.append(f"{sum(self.unreached.values())} defs with asserts that never became "
                         f"a function (a branch not taken) in {len(self.unreached)} modules")
        return "; ".join(parts)


_report: Optional[Report] = None
_finder: Optional[PlainFinder] = None
_swaps: list = []  # (function, its -O code): what undo puts back
_changed = None  # called when a module swapped after arming changed the report
_lock = threading.Lock()


def report() -> Optional[Report]:
    return _report


def runs_plain(module) -> bool:
    """Does ``module``'s code run with plain bytecode (loaded by ``PlainLoader``)?"""
    return isinstance(getattr(getattr(module, "__spec__", None), "loader", None), PlainLoader)


def arm(changed=None) -> Report:
    """Install the finder and give plain code to the vLLM modules imported
    already (a module still being imported gets it once its import ends, and
    ``changed()`` is called then). Once per process (again after ``undo``);
    raises where the finder cannot be installed."""
    global _report, _finder, _changed
    with _lock:
        if _report is not None and not _report.undone:
            return _report
        report = Report()
        _changed = changed
        finder = PlainFinder()
        meta_path = list(sys.meta_path)
        at = next((i for i, f in enumerate(meta_path) if f is importlib.machinery.PathFinder),
                  len(meta_path))
        meta_path.insert(at, finder)
        sys.meta_path = meta_path  # a new list: another thread's walk of the old one goes on
        _finder, _report = finder, report
    from kimi_hotfix.runtime import importwatch
    loaded = []
    for name, module in list(sys.modules.items()):
        if not is_vllm(name) or module is None or runs_plain(module):
            continue
        if importwatch.initializing(module):  # its code runs after this: swap it once it has
            try:
                importwatch.when_imported(module, _swap_when_imported)
            except (TypeError, AttributeError) as exc:
                report.refused[name] = f"cannot watch its import ({type(exc).__name__})"
            continue
        report.late.append(name)
        loaded.append(module)
    swap(loaded, report)
    return report


def _swap_when_imported(module) -> None:
    if module is not None and _report is not None and not _report.undone:
        swap([module], _report)
        if _changed is not None:
            _changed()


class _Plan:
    """One module's plain code, keyed by (name, first line), and the functions
    that get it."""

    def __init__(self, module, origin, plain):
        self.module, self.origin, self.pairs = module, origin, {}
        self.codes: dict = {}
        for code in _code_tree(plain):
            self.codes.setdefault((code.co_name, code.co_firstlineno), []).append(code)
        self.plain = plain

    def take(self, func) -> Optional[str]:
        """Pair ``func`` with its plain code; why not, where it is not the same def."""
        if id(func) in self.pairs:
            return None
        old = func.__code__
        found = self.codes.get((old.co_name, old.co_firstlineno), ())
        if len(found) != 1:
            return None  # no such def, or two on one line: not told apart
        if not _same_def(old, found[0]):
            return f"{func.__qualname__} does not match its plain code (the source is not " \
                   "the running code's)"
        self.pairs[id(func)] = (func, found[0])
        return None

    def unreached(self) -> int:
        """Function code objects with asserts that no paired function runs."""
        covered = {id(c) for _, new in self.pairs.values() for c in _code_tree(new)}
        return sum(1 for code in _code_tree(self.plain)
                   if id(code) not in covered and code.co_flags & _CO_OPTIMIZED and _asserts(code))


def swap(modules, report: Report) -> None:
    """Give the functions of ``modules`` their plain code, where the source is
    the running code's; each module whole or not at all, its reasons in
    ``report``. The functions are those the modules' namespaces reach, and,
    where code with asserts is left over, every function object of their files
    (one pass over the garbage collector's objects: registries, closures)."""
    plans = {}
    for module in modules:
        name = module.__name__
        try:
            plan = _plan(module)
        except Exception as exc:  # contained: this module keeps its code, the others go on
            plan = f"{type(exc).__name__}: {exc}"
        if isinstance(plan, str):
            report.refused[name] = plan
        elif plan is not None:
            plans[name] = plan
    refused = {}
    for name, plan in plans.items():
        for func in _functions(plan.module, plan.origin):
            refused[name] = refused.get(name) or plan.take(func)
    left = {plan.origin: name for name, plan in plans.items() if plan.unreached()}
    if left:
        import gc

        for obj in gc.get_objects():
            if type(obj) is types.FunctionType and obj.__code__.co_filename in left:
                name = left[obj.__code__.co_filename]
                refused[name] = refused.get(name) or plans[name].take(obj)
    for name, plan in plans.items():
        if refused.get(name):
            report.refused[name] = refused[name]
            continue
        swapped = 0
        for func, new in plan.pairs.values():
            old = func.__code__
            if new != old:
                func.__code__ = new
                _swaps.append((func, old))
                swapped += 1
        if swapped:
            report.swapped[name] = swapped
        unreached = plan.unreached()
        if unreached:  # defined in a branch that never ran, or created and dropped
            report.unreached[name] = unreached


def _plan(module):
    """The module's ``_Plan``, None where it has no Python source (an
    extension, a namespace package), or why its source is not the running code's."""
    spec = getattr(module, "__spec__", None)
    origin = getattr(spec, "origin", None)
    if spec is None or not isinstance(origin, str) or not origin.endswith(".py") \
            or not isinstance(spec.loader, importlib.machinery.SourceFileLoader):
        return None
    why = bytecode.not_the_running_source(origin)
    if why:
        return why
    with open(origin, "rb") as f:
        source = f.read()
    plain = bytecode.load(origin, 0, source)
    if plain is None:
        plain = compile(source, origin, "exec", dont_inherit=True, optimize=0)
    return _Plan(module, origin, plain)


def _same_def(old, new) -> bool:
    """The same def, asserts aside (``new`` may name more: asserts add names):
    what a code object must keep for its function to take the other (CPython
    checks only the closure's size)."""
    return (old.co_argcount == new.co_argcount
            and old.co_posonlyargcount == new.co_posonlyargcount
            and old.co_kwonlyargcount == new.co_kwonlyargcount
            and old.co_varnames == new.co_varnames
            and old.co_freevars == new.co_freevars
            and old.co_cellvars == new.co_cellvars
            and old.co_flags == new.co_flags
            and set(old.co_names) <= set(new.co_names))  # asserts only add names


def _code_tree(code):
    """``code`` and every code object nested in it."""
    todo = [code]
    while todo:
        code = todo.pop()
        yield code
        todo.extend(c for c in code.co_consts if isinstance(c, types.CodeType))


@functools.cache
def _asserts(code) -> bool:
    """Does ``code`` itself (not a nested def) hold an assert?"""
    raw = code.co_code
    return _ASSERT_OP is not None and any(raw[i] == _ASSERT_OP for i in range(0, len(raw), 2))


def _functions(module, filename):
    """The functions defined in ``filename`` that ``module``'s namespace
    reaches: its functions, its classes' (nested classes too) methods, static
    and class methods, properties, ``__wrapped__`` chains and what the closures
    of the functions reached hold (a decorator's wrapper). Attributes are
    read from ``__dict__``s, never through ``getattr``: a module's
    ``__getattr__`` (vLLM's lazy imports) is not run."""
    found, seen = [], set()
    todo = list(vars(module).values())
    modname = module.__name__
    while todo:
        obj = todo.pop()
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        if isinstance(obj, types.FunctionType):
            if obj.__code__.co_filename == filename:
                found.append(obj)
            wrapped = vars(obj).get("__wrapped__")
            if wrapped is not None:
                todo.append(wrapped)
            for cell in obj.__closure__ or ():  # a decorator's wrapper holds the def it wrapped
                try:
                    todo.append(cell.cell_contents)
                except ValueError:  # an empty cell
                    pass
        elif isinstance(obj, (classmethod, staticmethod)):
            todo.append(obj.__func__)
        elif isinstance(obj, property):
            todo.extend(f for f in (obj.fget, obj.fset, obj.fdel) if f is not None)
        elif isinstance(obj, (functools.partial, functools.partialmethod, functools.cached_property)):
            todo.append(obj.func)
        elif isinstance(obj, type):
            body = vars(obj)
            if body.get("__module__") == modname:
                todo.extend(body.values())
        elif any(c.__name__ == "ObjectProxy" for c in type(obj).__mro__):
            todo.append(obj.__wrapped__)  # a wrapt wrapper (another library's, or a patch's)
        elif callable(obj) and not isinstance(obj, types.ModuleType):
            inner = _own_dict(obj)  # a wrapper object (functools.lru_cache's): its __wrapped__
            wrapped = inner.get("__wrapped__") if inner else None
            if wrapped is not None:
                todo.append(wrapped)
    return found


def _own_dict(obj):
    try:
        found = object.__getattribute__(obj, "__dict__")
    except (AttributeError, TypeError):
        return None
    return found if isinstance(found, dict) else None


def undo() -> int:
    """Take the finder off ``sys.meta_path`` and put the in-place code back.
    Returns how many vLLM modules keep plain bytecode (loaded by the finder:
    a re-import would load them with -O's)."""
    global _finder
    with _lock:
        if _report is None or _report.undone:
            return 0
        _report.undone = True
        if _finder is not None:
            sys.meta_path = [f for f in sys.meta_path if f is not _finder]
            _finder = None
        while _swaps:
            func, old = _swaps.pop()
            func.__code__ = old
    return _report.plain_modules()

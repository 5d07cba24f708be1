"""Recompile a vLLM function from vLLM's own source after an AST edit.

A patch on a per-step hot path (a method that runs every engine step), where
the extra Python frame of any wrapper costs several microseconds, inserts a
one-comparison guard at the top of vLLM's own body instead of wrapping it
(the KDA builder patch).

The source is parsed with its positions as in the file (lines and columns), so
tracebacks through the recompiled function point at vLLM's own lines, and the
function is compiled in the module's globals. Before anything is installed,
``recompile`` checks that the source matches the running code: the pristine
source, compiled the way the interpreter compiled the module, must give the
same bytecode, names, locals, constants and first line as the function that
vLLM loaded, and its default values must be literals equal to the running
function's (a stale or edited ``.py`` next to the cached bytecode, or a function
that is not what its source says, raises ``PatchError`` and the caller keeps
the original). Nothing of the source runs before that check (the def is found
in the compiled module, not executed) nor after it (defaults, annotations and
decorators are not evaluated: the result takes the running function's). The
running code was compiled at the interpreter's optimize level, or, for vLLM's
modules under ``-O`` parity (kimi_hotfix.runtime.parity), plain: the check finds which,
and the edited function is compiled at that level.

Compiled "the way the interpreter compiled the module" means, on every Python
from 3.9 to 3.13: with the module's own ``from __future__`` flags (read from
the running code object: without ``annotations``, a nested def's annotations
are evaluated in the function's bytecode), and with the qualified names vLLM's
code has (a nested function or class keeps its qualified name in the code: as
a constant up to 3.10, and for a class's ``__qualname__`` on every version),
not the name of the factory the recompiled def is nested in.
"""

from __future__ import annotations
import __future__ as _future

import ast
import copy
import functools
import linecache
import sys
import types

from kimi_hotfix.runtime.base import PatchError

# The co_flags bits that record the module's ``from __future__`` imports
# (nested_scopes' bit is CO_NESTED, a property of the def, not an import).
_FUTURE_FLAGS = functools.reduce(
    lambda flags, name: flags | getattr(_future, name).compiler_flag,
    [name for name in _future.all_feature_names if name != "nested_scopes"],
    0,
)
_FACTORY = "_kimi_hotfix_factory"
_DEF = "_kimi_hotfix_def"


@functools.lru_cache(maxsize=16)
def _module(filename):
    """(lines, parsed tree) of a module's source file, read once per file: the
    lines linecache has (what inspect reads), the tree to find defs in (cheaper
    than inspect's tokenizer, which walks each function's block token by token)."""
    lines = linecache.getlines(filename)
    if not lines:
        raise OSError("could not get source code")
    return lines, ast.parse("".join(lines))


def forget() -> None:
    """Drop the parsed modules (a few MB per vLLM module): they serve one
    patch's check and apply; the process keeps running for days after."""
    _module.cache_clear()
    _imported_names.cache_clear()
    _column_zero_imports.cache_clear()


def _statements(body):
    """Every statement of ``body`` and of the blocks nested in it (no expressions)."""
    for node in body:
        yield node
        for field in ("body", "orelse", "finalbody", "handlers"):
            yield from _statements(getattr(node, field, None) or ())


def _indent(line):
    return len(line) - len(line.lstrip())


def _parse_def(lines, first, name):
    """The def that ``lines`` hold (its text from line ``first`` of its file)
    parsed on its own, with the positions it has in its file; None when the
    text does not parse as that one def. The text is parsed as it is (nested
    under ``if 1:`` when indented), never dedented: dedenting would change
    multi-line strings. Blank lines in front put every node on its line in the
    file: cheaper than renumbering the tree (ast.increment_lineno walks it)."""
    indented = lines[0][:1].isspace()
    head = "\n" * (first - 1 - indented) + ("if 1:\n" if indented else "")
    try:
        tree = ast.parse(head + "".join(lines))
    except SyntaxError:
        return None
    body = tree.body[0].body if indented else tree.body
    if len(body) != 1 or not isinstance(body[0], (ast.FunctionDef, ast.AsyncFunctionDef)) \
            or body[0].name != name:
        return None
    return body[0]


def _own_block(code):
    """(lines, first line number, parsed def) of the def starting at
    ``code``'s first line, cut by indentation and parsed on its own (once: the
    tree serves the caller too), without parsing the module: a patch's check
    stays cheap in modules of thousands of lines. None when the cut does not
    parse as that one def (``_lines`` then parses the module)."""
    lines = linecache.getlines(code.co_filename)
    start = code.co_firstlineno - 1
    if not lines or start >= len(lines):
        return None
    index = start
    while index < len(lines) and not lines[index].lstrip().startswith(("def ", "async def ")):
        index += 1  # decorators
    if index >= len(lines):
        return None
    depth, end, header = _indent(lines[index]), len(lines), index
    opened = 0  # a multi-line signature may close at the def's own indentation
    while header < len(lines):
        code_part = lines[header].split("#", 1)[0]
        opened += code_part.count("(") + code_part.count("[") - code_part.count(")") - code_part.count("]")
        if opened <= 0:
            break
        header += 1
    for i in range(header + 1, len(lines)):
        text = lines[i].strip()
        if text and not text.startswith("#") and _indent(lines[i]) <= depth:
            end = i
            break
    while end > index + 1 and not lines[end - 1].strip():
        end -= 1
    block = lines[start:end]
    funcdef = _parse_def(block, start + 1, code.co_name)
    if funcdef is None:
        return None
    return block, start + 1, funcdef


def _lines(func):
    """(lines, first line number, parsed def or None) of ``func``'s source,
    decorators included; PatchError if none. The one way the package reads
    vLLM source: the lines linecache has (what inspect reads), the def cut by
    indentation, or found in the parsed module where the cut does not parse."""
    code = func.__code__
    own = _own_block(code)
    if own is not None:
        return own
    try:
        lines, tree = _module(code.co_filename)
    except (OSError, SyntaxError, ValueError) as exc:
        raise PatchError(f"source of {func.__qualname__} unavailable ({exc})") from exc
    for node in _statements(tree.body):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == code.co_name:
            first = min([node.lineno] + [d.lineno for d in node.decorator_list])
            if first == code.co_firstlineno:
                return lines[first - 1:node.end_lineno], first, None
    raise PatchError(f"source of {func.__qualname__} unavailable (no def at line "
                     f"{code.co_firstlineno} of {code.co_filename})")


def source(func) -> str:
    """``func``'s source text (``PatchError`` where there is none)."""
    return "".join(_lines(func)[0])


def function_ast(func) -> ast.Module:
    """``func``'s source as a module of one ``def``, with the positions it has
    in its file (a fresh tree on every call: callers edit it)."""
    lines, first, funcdef = _lines(func)
    if funcdef is None:
        funcdef = _parse_def(lines, first, func.__code__.co_name)
    if funcdef is None:
        raise PatchError(f"source of {func.__qualname__} does not parse as its def")
    if not isinstance(funcdef, ast.FunctionDef):
        raise PatchError(f"unexpected source layout for {func.__qualname__}")
    return ast.Module(body=[funcdef], type_ignores=[])


def asserts_in(tree, skip=None) -> int:
    """How many ``assert`` statements ``tree`` holds, nested blocks and defs
    included, less those ``skip(node)`` is true for. It walks statements only
    (an assert is one; expressions, the bulk of a tree, cannot hold one):
    several times cheaper than ast.walk."""
    count, todo = 0, list(tree.body)
    while todo:
        node = todo.pop()
        if isinstance(node, ast.Assert):
            count += skip is None or not skip(node)
            continue
        for field in ("body", "orelse", "finalbody", "handlers", "cases"):
            block = getattr(node, field, None)
            if isinstance(block, list):
                todo.extend(block)
    return count


def type_narrowing(node) -> bool:
    """``assert isinstance(...)`` or ``assert x is not None``, with no message:
    an assert that tells a type checker what vLLM's own code already guarantees,
    not a check of what a user configured (upstream/make_patches.py leaves the
    same ones). One with a message is a check (e.g. a getter's "not
    initialized")."""
    test = node.test
    if node.msg is not None:
        return False
    if isinstance(test, ast.Call) and getattr(test.func, "id", None) == "isinstance":
        return True
    return (isinstance(test, ast.Compare) and len(test.ops) == 1
            and isinstance(test.ops[0], ast.IsNot)
            and isinstance(test.comparators[0], ast.Constant)
            and test.comparators[0].value is None)


def _undecorated(tree):
    """Drop the decorators (the caller passes the undecorated function); the
    def keeps the first decorator's line, as CPython numbers a decorated def."""
    funcdef = tree.body[0]
    if funcdef.decorator_list:
        funcdef.lineno = min(d.lineno for d in funcdef.decorator_list)
        funcdef.decorator_list = []
    return tree


def _bound(node):
    """The names an import statement binds in its scope."""
    if isinstance(node, ast.Import):
        return [a.asname or a.name.split(".")[0] for a in node.names]
    return [a.asname or a.name for a in node.names if a.name != "*"]


@functools.lru_cache(maxsize=16)
def _imported_names(filename):
    """Import-bound names of the module in ``filename``. CPython compiles
    ``name.attr(...)`` differently when ``name`` comes from an import statement
    of the module (LOAD_ATTR instead of LOAD_METHOD, 3.11+), so the recompiled
    function must see the same declarations to be the same bytecode."""
    try:
        _, tree = _module(filename)
    except (OSError, SyntaxError, ValueError):
        return ()
    names = []
    todo = list(tree.body)
    while todo:  # the module's own scope: not inside a def or a class
        node = todo.pop(0)
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            names += _bound(node)
        elif not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            for field in ("body", "orelse", "finalbody", "handlers"):
                todo += getattr(node, field, None) or ()
    return tuple(dict.fromkeys(names))


@functools.lru_cache(maxsize=16)
def _column_zero_imports(filename):
    """The names bound by the import statements that start at column 0 of the
    module in ``filename``, each statement parsed on its own: a first guess
    at ``_imported_names`` that does not parse the module (a few ms in vLLM's
    modules of thousands of lines). It misses imports nested in ``if``/``try``
    blocks and may take one from a multi-line string; ``recompile`` checks the
    result byte for byte and falls back to the exact names on a mismatch."""
    lines = linecache.getlines(filename)
    names, index = [], 0
    while index < len(lines):
        line, index = lines[index], index + 1
        if not line.startswith(("import ", "from ")):
            continue
        text = line
        while index < len(lines) and (text.count("(") > text.count(")")
                                      or text.rstrip().endswith("\\")):
            text, index = text + lines[index], index + 1
        try:
            statement = ast.parse(text).body
        except SyntaxError:
            continue
        for node in statement:
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                names += _bound(node)
    return tuple(dict.fromkeys(names))


def _declarations(filename):
    """The import-bound names to declare, best guess first: the column-0
    imports, then (only if that guess compiled differently) the exact set."""
    guess = _column_zero_imports(filename)
    yield guess
    exact = _imported_names(filename)
    if exact != guess:
        yield exact


def _fingerprint(code):
    return (
        code.co_argcount,
        code.co_posonlyargcount,
        code.co_kwonlyargcount,
        code.co_varnames,
        code.co_names,
        code.co_firstlineno,
        code.co_code,
        tuple(_fingerprint(c) if isinstance(c, types.CodeType) else c for c in code.co_consts),
    )


def _compile(func, tree, optimize, cells, imported):
    """Execute ``tree`` (one def) in ``func``'s globals; the def is nested in a
    factory whose parameters are ``cells`` (closure names), so helpers reach
    the function through closure cells and never through vLLM's globals.

    In the factory the def goes by a name of its own: under its real name, a
    reference to that name in its body (a recursive module-level function)
    would become a closure over the factory's local instead of the global it
    is in vLLM. The compiled code gets its real names back (``_requalify``).
    The def's own annotations are left out: they are evaluated by the code
    around a def, never by its body, and the result takes ``func``'s.
    ``imported``: the module's import-bound names, declared (never executed)
    next to the factory so that ``name.attr(...)`` compiles as in the module.
    Returns the compiled module (``_def_code`` finds the def in it; ``_define`` runs it)."""
    funcdef = copy.copy(tree.body[0])  # the tree stays as the caller edited it
    real_name, funcdef.name = funcdef.name, _DEF
    funcdef.returns = None
    funcdef.args = copy.copy(funcdef.args)
    for field in ("posonlyargs", "args", "kwonlyargs", "vararg", "kwarg"):
        value = getattr(funcdef.args, field)
        if isinstance(value, list):
            setattr(funcdef.args, field, [_unannotated(arg) for arg in value])
        elif value is not None:
            setattr(funcdef.args, field, _unannotated(value))
    factory = ast.FunctionDef(
        name=_FACTORY,
        args=ast.arguments(
            posonlyargs=[],
            args=[ast.arg(arg=name) for name in cells],
            kwonlyargs=[],
            kw_defaults=[],
            defaults=[],
        ),
        body=[funcdef, ast.Return(value=ast.Name(id=funcdef.name, ctx=ast.Load()))],
        decorator_list=[],
        returns=None,
        type_comment=None,
    )
    # the def's default values are the running function's (set on the result):
    # placeholders here, so that nothing of the source is evaluated, checked or not
    funcdef.args.defaults = [_placeholder(d) for d in funcdef.args.defaults]
    funcdef.args.kw_defaults = [d and _placeholder(d) for d in funcdef.args.kw_defaults]
    filename = func.__code__.co_filename
    body = [ast.copy_location(factory, funcdef)]
    if imported:  # declared, never executed: ``if 0:`` is compiled away
        declare = [ast.Import(names=[ast.alias(name=n)]) for n in imported]
        body.append(ast.If(test=ast.Constant(value=0), body=declare, orelse=[]))
    module = ast.Module(body=body, type_ignores=[])
    _locate(module, funcdef)
    code = compile(module, filename, "exec", flags=func.__code__.co_flags & _FUTURE_FLAGS,
                   dont_inherit=True, optimize=optimize)
    return _requalify(code, f"{_FACTORY}.<locals>.{_DEF}", func.__qualname__, real_name)


def _define(func, code, cells):
    """Run the compiled module: it defines the factory, which makes the def
    (defaults are placeholders, annotations and decorators gone: nothing of
    vLLM's source runs here)."""
    namespace: dict = {}
    exec(code, func.__globals__, namespace)  # defines the factory only
    return namespace[_FACTORY](**cells)


def _def_code(module_code):
    """The def's code object inside the compiled module, found without running it."""
    factory = next(c for c in module_code.co_consts if isinstance(c, types.CodeType))
    return next(c for c in factory.co_consts if isinstance(c, types.CodeType))


def _placeholder(node):
    return ast.copy_location(ast.Constant(value=None), node)


def _same_defaults(func, funcdef) -> bool:
    """The source's default values are literals equal to the running function's
    (read with ``ast.literal_eval``: nothing is evaluated). A default that is not
    a literal cannot be compared: False."""
    def literal(node):
        value = ast.literal_eval(node)
        return type(value), value

    try:
        source = [literal(d) for d in funcdef.args.defaults]
        kw = {a.arg: literal(d) for a, d in zip(funcdef.args.kwonlyargs, funcdef.args.kw_defaults)
              if d is not None}
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return False
    running = [(type(v), v) for v in func.__defaults__ or ()]
    running_kw = {k: (type(v), v) for k, v in (func.__kwdefaults__ or {}).items()}
    return source == running and kw == running_kw


def _locate(root, funcdef):
    """Give the nodes around ``funcdef`` (the factory, the declarations) the
    def's position, as ``ast.fix_missing_locations`` would, without walking the
    def itself: vLLM's nodes have theirs, and an edit places what it adds
    (``ast.fix_missing_locations`` on its own nodes)."""
    todo = [root]
    while todo:
        node = todo.pop()
        for attr in ("lineno", "col_offset", "end_lineno", "end_col_offset"):
            if attr in node._attributes and getattr(node, attr, None) is None:
                setattr(node, attr, getattr(funcdef, attr))
        todo.extend(child for child in ast.iter_child_nodes(node) if child is not funcdef)


def _unannotated(arg):
    arg = copy.copy(arg)
    arg.annotation = None
    return arg


def _requalify(code, old, new, name):
    """``code`` with the qualified names that start with ``old`` (the def as
    nested in the factory) starting with ``new`` (its name in vLLM) instead:
    ``co_qualname`` (3.11+) and the string constants the compiler emits for
    them (a nested function's qualname up to 3.10; a class body's
    ``__qualname__``); and the def's own code named ``name`` again."""

    def rename(value):
        if value == old or value.startswith(old + "."):
            return new + value[len(old):]
        return value

    consts = tuple(
        _requalify(c, old, new, name) if isinstance(c, types.CodeType)
        else rename(c) if isinstance(c, str) else c
        for c in code.co_consts
    )
    changes = {"co_consts": consts}
    if code.co_name == _DEF:
        changes["co_name"] = name
    if hasattr(code, "co_qualname"):
        changes["co_qualname"] = rename(code.co_qualname)
    return code.replace(**changes)


def recompile(func, edit, *, optimize=-1, cells=None):
    """vLLM's ``func`` recompiled from its source after ``edit(tree)`` changed
    the parsed ``ast.Module`` in place (its one ``FunctionDef`` keeps its name;
    decorators are dropped: pass the undecorated function). ``cells``: names
    the edited code may use, bound as closure variables. ``optimize``: as for
    ``compile`` (-1: the level the running code was compiled at)."""
    if not isinstance(func, types.FunctionType):
        raise PatchError(f"{func!r} is not a Python function; cannot recompile")
    if func.__code__.co_freevars:
        raise PatchError(f"{func.__qualname__} uses a closure; cannot recompile")
    cells = dict(cells or {})
    filename = func.__code__.co_filename
    linecache.checkcache(filename)  # the text on disk now
    tree = _undecorated(function_ast(func))
    running = _fingerprint(func.__code__)
    # the level the running code was compiled at: the interpreter's, or plain
    # (vLLM's modules under -O parity: kimi_hotfix.runtime.parity)
    levels = dict.fromkeys((sys.flags.optimize, 0))
    found = next(((level, imported) for level in levels for imported in _declarations(filename)
                  if _fingerprint(_def_code(_compile(func, tree, level, {}, imported))) == running),
                 None)
    if found is None:
        raise PatchError(f"source of {func.__qualname__} does not match its running code")
    level, imported = found
    if optimize == -1:
        optimize = level
    if not _same_defaults(func, tree.body[0]):
        raise PatchError(f"source of {func.__qualname__} does not match its running code "
                         "(its default values differ, or are not literals)")
    edit(tree)  # compiling did not change the tree: edit the checked one
    try:
        new = _define(func, _compile(func, tree, optimize, cells, imported), cells)
    except Exception as exc:
        raise PatchError(f"{func.__qualname__} cannot be redefined "
                         f"({type(exc).__name__}: {exc})") from exc
    new.__qualname__ = func.__qualname__
    new.__module__ = func.__module__
    new.__doc__ = func.__doc__
    new.__defaults__ = func.__defaults__
    new.__kwdefaults__ = func.__kwdefaults__
    new.__annotations__ = func.__annotations__
    new.__dict__.update(func.__dict__)
    return new

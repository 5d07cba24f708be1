"""One module's source reduced to what the audit needs (stdlib ``ast`` only).

``summarize(text, module, is_package)`` parses the source once and returns a
JSON-able dict, which the audit caches by the file's hash:

  imports    module-level import bindings: local name -> [module, attribute|None]
  star       modules imported with ``*`` at module level
  defs       every function (methods and nested functions too), by qualified
             name inside the module (``Class.method``, ``outer.<locals>.inner``):
             its lines, the lines of the ``assert`` statements directly in it
             (not in nested defs), the lines of its explicit ``raise
             AssertionError`` statements (``-O`` keeps those), the calls it
             makes (a decorator it applies too: ``@f`` calls f, ``@f(...)``
             and ``f(...)(...)`` call what f returns, written ``f()``), its
             local aliases of callables (``g = mod.f``), the names it returns,
             its own function-level imports, its enclosing class,
             whether it is a pydantic validator, and, where the audit can
             report it (it holds an assert or a site), its normalised hash
             (``source_hash``; None otherwise)
  classes    class qualified name -> bases (dotted names) and line
  sites      the places that turn an ``AssertionError`` into something else:
             ``except`` clauses naming it (alone or in a tuple), ``with
             contextlib.suppress(AssertionError)`` blocks, and pydantic
             validators that hold ``assert`` (pydantic turns an AssertionError
             raised in a validator into a ValidationError). For each: the
             enclosing function, the calls its guarded block makes and the
             asserts directly in that block.
             In a test module (``tests=True``: a file of vLLM's ``tests/``),
             one more kind: ``raises``, a ``with pytest.raises(AssertionError)``
             block (``pytest.raises((..., AssertionError))`` too), or the call
             form ``pytest.raises(AssertionError, func, ...)``: the test steers
             by the AssertionError that vLLM code raises in the block. Such a
             site also lists the block's explicit ``raise AssertionError``
             lines and its other mentions of ``AssertionError``
             (``side_effect=AssertionError``): AssertionErrors ``-O`` keeps.

Calls are written as dotted text: ``name``, ``name.attr``, ``self.attr``,
``super().attr``; a call whose receiver is not a plain name chain (a
subscript, a call result) is ``?.attr``. The audit resolves them later, across
modules.

The normalised hash (``source_hash``) is a SHA-256 over a canonical dump of
the function's AST: docstrings (of the function and of anything nested in it)
dropped, no positions, no comments (the parser has none), empty fields left
out and f-string literal parts joined (so the dump is the same on Python 3.9
to 3.13, tests/unit/test_audit.py). So a change of
formatting, comments or docstrings keeps a review valid; any change to code,
a string literal (an assert's message included), a decorator or a default
marks the function as changed.
"""

from __future__ import annotations

import ast
import hashlib

VALIDATOR_DECORATORS = ("field_validator", "model_validator", "validator", "root_validator")
_DEF = (ast.FunctionDef, ast.AsyncFunctionDef)
_SKIP_ATTRS = frozenset(("lineno", "col_offset", "end_lineno", "end_col_offset", "ctx",
                         "type_comment", "kind"))


# -- the normalised hash --------------------------------------------------------


def _without_docstring(body):
    if (body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant)
            and isinstance(body[0].value.value, str)):
        return body[1:]
    return body


def _fstring_parts(values):
    """An f-string's parts with empty literal parts dropped and adjacent literal
    parts joined: Python 3.12.1 adds an empty literal after a nested format
    spec field (``f'{a:>{k}}'``) that 3.9 to 3.11 and 3.13 do not."""
    parts: list = []
    for value in values:
        if isinstance(value, ast.Constant) and isinstance(value.value, str):
            if not value.value:
                continue
            if parts and isinstance(parts[-1], ast.Constant) and isinstance(parts[-1].value, str):
                parts[-1] = ast.Constant(value=parts[-1].value + value.value)
                continue
        parts.append(value)
    return parts


def _dump(node, out):
    """Canonical text of ``node``: type and non-empty fields, no positions."""
    if isinstance(node, ast.AST):
        out.append(type(node).__name__)
        out.append("(")
        for name in node._fields:
            if name in _SKIP_ATTRS:
                continue
            value = getattr(node, name, None)
            if name == "body" and isinstance(node, (*_DEF, ast.ClassDef)):
                value = _without_docstring(value)
            elif name == "values" and isinstance(node, ast.JoinedStr):
                value = _fstring_parts(value)
            if value is None or value == []:
                continue
            out.append(name)
            out.append("=")
            _dump(value, out)
            out.append(",")
        out.append(")")
    elif isinstance(node, list):
        out.append("[")
        for item in node:
            _dump(item, out)
            out.append(",")
        out.append("]")
    else:
        out.append(repr(node))


def source_hash(node) -> str:
    out: list = []
    _dump(node, out)
    return hashlib.sha256("".join(out).encode()).hexdigest()[:16]


# -- helpers ---------------------------------------------------------------------


def dotted(expr):
    """``a.b.c`` for a Name/Attribute chain, ``super().x`` kept, else ``?.attr``/None."""
    parts = []
    node = expr
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
        return ".".join(reversed(parts))
    if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "super"
            and parts):
        return "super()." + ".".join(reversed(parts))
    if parts:
        return "?." + ".".join(reversed(parts[:1]))  # the attribute called, receiver unknown
    return None


def _catches_assertion_error(expr) -> list:
    """The names an ``except`` clause's type names, if AssertionError is among them."""
    items = expr.elts if isinstance(expr, ast.Tuple) else [expr]
    names = [dotted(item) or "?" for item in items]
    return names if any(n.rsplit(".", 1)[-1] == "AssertionError" for n in names) else []


def _resolve_relative(module: str, is_package: bool, level: int, name):
    if level == 0:
        return name
    parts = module.split(".")
    if not is_package:
        parts = parts[:-1]
    if level > 1:
        parts = parts[: len(parts) - (level - 1)]
    base = ".".join(parts)
    return f"{base}.{name}" if name else base


def _import_bindings(node, module, is_package) -> dict:
    found = {}
    if isinstance(node, ast.Import):
        for alias in node.names:
            if alias.asname:
                found[alias.asname] = [alias.name, None]
            else:
                head = alias.name.split(".")[0]
                found[head] = [head, None]
    elif isinstance(node, ast.ImportFrom):
        source = _resolve_relative(module, is_package, node.level, node.module)
        for alias in node.names:
            if alias.name != "*":
                found[alias.asname or alias.name] = [source, alias.name]
    return found


def _is_validator(funcdef) -> bool:
    for deco in funcdef.decorator_list:
        target = deco.func if isinstance(deco, ast.Call) else deco
        name = dotted(target) or ""
        if name.rsplit(".", 1)[-1] in VALIDATOR_DECORATORS:
            return True
    return False


def _suppresses_assertion_error(item) -> list:
    call = item.context_expr
    if not isinstance(call, ast.Call):
        return []
    name = dotted(call.func) or ""
    if name.rsplit(".", 1)[-1] != "suppress":
        return []
    names = [dotted(arg) or "?" for arg in call.args]
    return names if any(n.rsplit(".", 1)[-1] == "AssertionError" for n in names) else []


def _names_assertion_error(expr) -> bool:
    name = dotted(expr) if isinstance(expr, (ast.Name, ast.Attribute)) else None
    return bool(name) and name.rsplit(".", 1)[-1] == "AssertionError"


def _raises_assertion_error(node) -> bool:
    """``raise AssertionError`` / ``raise AssertionError(...)`` (``builtins.`` too)."""
    exc = node.exc
    if isinstance(exc, ast.Call):
        exc = exc.func
    return exc is not None and _names_assertion_error(exc)


class _Block:
    """Calls, asserts, explicit ``raise AssertionError`` and other mentions of
    AssertionError directly in a list of statements (not in nested defs/classes)."""

    def __init__(self):
        self.calls: list = []
        self.asserts: list = []
        self.raises: list = []  # lines of ``raise AssertionError``: -O keeps them
        self.mentions: list = []  # lines naming AssertionError otherwise (side_effect=...)
        self.imports: dict = {}
        self.aliases: dict = {}  # name = a.b.c (no call): the name calls what a.b.c is
        self.returns: list = []  # names returned (``return inner``: a decorator factory)

    def scan(self, nodes, module, is_package):
        todo = list(nodes)
        while todo:
            node = todo.pop()
            if isinstance(node, (*_DEF, ast.ClassDef)):
                # decorators and defaults run here; the body does not. A decorator
                # is called with the def: ``@f`` calls f, ``@f(...)`` calls what f
                # returns (written ``f()``)
                todo.extend(node.decorator_list)
                for deco in node.decorator_list:
                    name = dotted(deco.func if isinstance(deco, ast.Call) else deco)
                    if name and not name.startswith("?."):
                        self.calls.append(name + "()" if isinstance(deco, ast.Call) else name)
                if isinstance(node, ast.ClassDef):
                    todo.extend(node.bases)
                else:
                    todo.extend(node.args.defaults)
                    todo.extend(d for d in node.args.kw_defaults if d is not None)
                continue
            if isinstance(node, ast.Assert):
                self.asserts.append(node.lineno)
            elif isinstance(node, ast.Raise) and _raises_assertion_error(node):
                self.raises.append(node.lineno)
                todo.extend(n for n in (node.cause,) if n is not None)
                if isinstance(node.exc, ast.Call):  # the message's own calls
                    todo.extend(node.exc.args)
                    todo.extend(k.value for k in node.exc.keywords)
                continue
            elif _names_assertion_error(node) and not isinstance(getattr(node, "ctx", None),
                                                                 ast.Store):
                self.mentions.append(node.lineno)
                continue
            elif isinstance(node, ast.Call):
                name = dotted(node.func)
                if name:
                    self.calls.append(name)
                elif isinstance(node.func, ast.Call):  # f(...)(...): what f returns
                    inner = dotted(node.func.func)
                    if inner and not inner.startswith("?."):
                        self.calls.append(inner + "()")
            elif (isinstance(node, ast.Assign) and len(node.targets) == 1
                  and isinstance(node.targets[0], ast.Name)
                  and isinstance(node.value, (ast.Name, ast.Attribute))):
                name = dotted(node.value)
                if name and not name.startswith("?."):
                    self.aliases[node.targets[0].id] = name
            elif isinstance(node, ast.Return) and isinstance(node.value, ast.Name):
                self.returns.append(node.value.id)
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                self.imports.update(_import_bindings(node, module, is_package))
            todo.extend(ast.iter_child_nodes(node))
        self.calls = sorted(set(self.calls))
        self.asserts.sort()
        self.raises.sort()
        self.mentions = sorted(set(self.mentions))
        return self


def summarize(text, module: str, is_package: bool, tests: bool = False) -> dict:
    """The summary of one module's source (see the module docstring); ``tests``:
    a test module, whose ``pytest.raises(AssertionError)`` blocks are sites too.
    SyntaxError propagates (the caller records the file as unparsed)."""
    tree = ast.parse(text)
    out = {"imports": {}, "star": [], "defs": {}, "classes": {}, "sites": []}

    def visit(body, prefix, cls, func):
        """``prefix``: qualified name prefix; ``cls``: enclosing class qualname
        for methods; ``func``: enclosing function qualname (None at class or
        module level)."""
        for node in body:
            if isinstance(node, ast.ClassDef):
                qual = prefix + node.name
                out["classes"][qual] = {"bases": [dotted(b) or "?" for b in node.bases],
                                        "line": node.lineno}
                visit(node.body, qual + ".", qual, None)
                continue
            if isinstance(node, _DEF):
                qual = prefix + node.name
                block = _Block().scan(node.body, module, is_package)
                info = {
                    "line": min([node.lineno] + [d.lineno for d in node.decorator_list]),
                    "end": node.end_lineno,
                    "asserts": block.asserts,
                    "raises": block.raises,
                    "calls": block.calls,
                    "aliases": block.aliases,
                    "returns": sorted(set(block.returns)),
                    "imports": block.imports,
                    "class": cls,
                    "validator": _is_validator(node),
                    "hash": None,
                }
                out["defs"][qual] = info
                sites_before = len(out["sites"])
                if info["validator"] and block.asserts:
                    out["sites"].append({"kind": "validator", "function": qual,
                                         "line": node.lineno, "catches": ["pydantic"],
                                         "calls": block.calls, "asserts": block.asserts})
                visit(node.body, qual + ".<locals>.", None, qual)
                # hashed only where the audit can report it: a function with
                # asserts, or one holding a site (hashing walks the whole def)
                if block.asserts or any(site["function"] == qual
                                        for site in out["sites"][sites_before:]):
                    info["hash"] = source_hash(node)
                continue
            if func is None and cls is None and isinstance(node, (ast.Import, ast.ImportFrom)):
                if isinstance(node, ast.ImportFrom) and any(a.name == "*" for a in node.names):
                    out["star"].append(_resolve_relative(module, is_package, node.level,
                                                         node.module))
                out["imports"].update(_import_bindings(node, module, is_package))
            if isinstance(node, ast.Try) or type(node).__name__ == "TryStar":
                for handler in node.handlers:
                    caught = handler.type is not None and _catches_assertion_error(handler.type)
                    if caught:
                        block = _Block().scan(node.body, module, is_package)
                        out["sites"].append({"kind": "except", "function": func,
                                             "line": handler.lineno, "catches": caught,
                                             "calls": block.calls, "asserts": block.asserts,
                                             "hash": source_hash(node) if func is None else None})
            if isinstance(node, (ast.With, ast.AsyncWith)):
                for index, item in enumerate(node.items):
                    caught = _suppresses_assertion_error(item)
                    if caught:
                        block = _Block().scan(node.body, module, is_package)
                        out["sites"].append({"kind": "suppress", "function": func,
                                             "line": node.lineno, "catches": caught,
                                             "calls": block.calls, "asserts": block.asserts,
                                             "hash": source_hash(node) if func is None else None})
                    expected = tests and _expects_assertion_error(item.context_expr)
                    if expected:
                        # the items after it are entered inside it: guarded too
                        later = [i.context_expr for i in node.items[index + 1:]]
                        block = _Block().scan([*later, *node.body], module, is_package)
                        out["sites"].append(_raises_site(func, item.context_expr, expected,
                                                         block, node))
            if tests and isinstance(node, (ast.Expr, ast.Assign)):
                call = node.value  # the call form: pytest.raises(AssertionError, func, ...)
                expected = _expects_assertion_error(call)
                if expected and len(call.args) > 1:
                    block = _Block()
                    name = dotted(call.args[1])
                    block.calls = [name] if name else []
                    out["sites"].append(_raises_site(func, call, expected, block, node))
            # statements nested in this one (if/for/while/try/with/match bodies)
            for field in ("body", "orelse", "finalbody", "handlers", "cases"):
                inner = getattr(node, field, None)
                if isinstance(inner, list) and inner and isinstance(inner[0], ast.AST):
                    visit(_flatten(inner), prefix, cls, func)

    visit(tree.body, "", None, None)
    return out


def valid(found) -> bool:
    """``found`` has the shape ``summarize`` gives (a cache entry read from disk
    is used only then): the five tables, each def's fields of their types."""
    if not isinstance(found, dict) or set(found) != {"imports", "star", "defs", "classes", "sites"}:
        return False
    if not (isinstance(found["imports"], dict) and isinstance(found["star"], list)
            and isinstance(found["classes"], dict) and isinstance(found["sites"], list)
            and isinstance(found["defs"], dict)):
        return False
    def binding(value):  # an import binding: [module, name or None]
        return (isinstance(value, list) and len(value) == 2 and isinstance(value[0], str)
                and (value[1] is None or isinstance(value[1], str)))

    for info in found["defs"].values():
        if not (isinstance(info, dict) and isinstance(info.get("line"), int)
                and isinstance(info.get("end"), int) and isinstance(info.get("asserts"), list)
                and isinstance(info.get("raises"), list) and isinstance(info.get("aliases"), dict)
                and isinstance(info.get("returns"), list)
                and isinstance(info.get("calls"), list) and isinstance(info.get("imports"), dict)
                and all(binding(v) for v in info["imports"].values())):
            return False
    for site in found["sites"]:
        if not (isinstance(site, dict) and isinstance(site.get("kind"), str)
                and isinstance(site.get("line"), int) and isinstance(site.get("calls"), list)):
            return False
    return all(binding(v) for v in found["imports"].values()) and all(
        isinstance(v, dict) and isinstance(v.get("bases"), list) for v in found["classes"].values())


def _expects_assertion_error(call) -> list:
    """The exceptions ``pytest.raises(...)`` expects, if AssertionError is among
    them (a literal name or tuple: a parameter holding the class is not read)."""
    if not isinstance(call, ast.Call):
        return []
    name = dotted(call.func) or ""
    if name not in ("pytest.raises", "raises"):
        return []
    expected = call.args[0] if call.args else next(
        (k.value for k in call.keywords if k.arg == "expected_exception"), None)
    return _catches_assertion_error(expected) if expected is not None else []


def _raises_site(func, call, expected, block, node) -> dict:
    return {"kind": "raises", "function": func, "line": call.lineno, "catches": expected,
            "calls": block.calls, "asserts": block.asserts, "raises": block.raises,
            "mentions": block.mentions,
            "hash": source_hash(node) if func is None else None}


def _flatten(items):
    """Statements of a body list; handlers and match cases contribute their bodies."""
    flat = []
    for item in items:
        if isinstance(item, ast.excepthandler) or type(item).__name__ == "match_case":
            flat.extend(item.body)
        else:
            flat.append(item)
    return flat

"""The package's import graph, read statically (ast: nothing of the package is imported), and its
rules, one test each. The folders are the architecture (issue 39): kimi_hotfix/runtime/ is what a
vLLM process loads, kimi_hotfix/tools/ what the commands load, kimi_hotfix/patches/<name>/ one
patch (its __init__ the runtime side; probe.py and standins.py the tools' and the tests'); at the
top only the package's API, the plugin entry point and ``python -m``'s. Rules: no module outside
those places; no cycle anywhere; runtime and patch modules never import a tool (a probe is one);
patches (and their probes) never import FORBIDDEN_FOR_PATCHES; kimi_hotfix.runtime.state imports
only kimi_hotfix.runtime.base and the stdlib; sitecustomize.py only kimi_hotfix.runtime.core, and
nothing but ``sys`` at module level. Each rule is a checker (root -> problems), shown to catch a
violation injected into a copy of the tree.

Nodes: the module files under kimi_hotfix/ (not _vendor/, __pycache__). Edges: every import anywhere
in a file (functions, if/try blocks too) and ``import_module("literal")``, resolved to the module
loaded (``from kimi_hotfix import x``: x if it is a file, else the package's __init__). Not edges:
imports under ``if TYPE_CHECKING:`` (never run); the implicit import of parent packages (Python
imports them first; as edges, every child its package imports would be a cycle); imports from
the module itself; ``import_module`` of a non-literal, e.g. f"kimi_hotfix.patches.{modname}".
"""

from __future__ import annotations

import ast
import importlib.util
import shutil
import sys
import sysconfig
from collections import namedtuple
from pathlib import Path

import pytest

from helpers import REPO

PKG = "kimi_hotfix"
RUNTIME, TOOLS, PATCHES = f"{PKG}.runtime", f"{PKG}.tools", f"{PKG}.patches"
STATE, CORE, BASE = f"{RUNTIME}.state", f"{RUNTIME}.core", f"{RUNTIME}.base"
SKIP_DIRS = ("_vendor", "__pycache__")
TOP = frozenset({PKG, f"{PKG}.__main__", f"{PKG}.plugin"})  # the API, the entry points
# a patch folder's tool and test sides (its __init__ is what vLLM processes run)
PATCH_TOOL_FILES = ("about", "probe", "standins")
# Patches reach the shim only through the Context they are given: neither the machinery that
# drives them (core, state, metrics) nor what it is built from (registry, config, messages).
FORBIDDEN_FOR_PATCHES = tuple(f"{RUNTIME}.{m}" for m in
                              ("core", "state", "metrics", "registry", "config", "messages"))
# One import in src. target: a package module (internal) or a dotted name outside the package;
# module_level: outside any def/lambda, so it runs when src is imported.
Imp = namedtuple("Imp", "src target line module_level internal")


def under(name: str, package: str) -> bool:
    return name == package or name.startswith(package + ".")


def kind(name: str) -> str:
    """The folder's kind: "tool", "patch" (a patch's runtime side, or the patch table),
    "probe" (a patch folder's tool or test side), "runtime", or "misplaced"."""
    if under(name, TOOLS) or name == f"{PKG}.__main__":
        return "tool"
    if under(name, PATCHES):
        return "probe" if name.rpartition(".")[2] in PATCH_TOOL_FILES else "patch"
    if under(name, RUNTIME) or name in TOP:
        return "runtime"
    return "misplaced"


def modules(root: Path) -> dict:
    """{dotted name: path} of the package's module files under root."""
    found = {}
    for path in sorted((root / PKG).rglob("*.py")):
        parts = path.relative_to(root).with_suffix("").parts
        if not set(SKIP_DIRS) & set(parts):
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def called(node: ast.AST) -> str:
    """x for `import_module("x")`, `__import__("x")`; "" else, and for relative or f-strings."""
    func, args = getattr(node, "func", None), getattr(node, "args", None)
    if getattr(func, "attr", getattr(func, "id", None)) not in ("import_module", "__import__"):
        return ""
    value = getattr(args[0], "value", None) if args else None
    return value if isinstance(value, str) and not value.startswith(".") else ""


def file_imports(path: Path, modname: str, is_pkg: bool, nodes) -> list:
    here = modname if is_pkg else modname.rpartition(".")[0]  # what `from . import` means
    found = []

    def add(name, line, top, names=()):
        if not under(name, PKG) or under(name, f"{PKG}._vendor"):
            return found.append(Imp(modname, name, line, top, False))
        for target in [f"{name}.{n}" for n in names] or [name]:
            target = target if target in nodes else name
            while target not in nodes and "." in target:  # the nearest module file above
                target = target.rpartition(".")[0]
            found.append(Imp(modname, target, line, top, True))

    def visit(node, top):
        if isinstance(node, ast.Import):
            for alias in node.names:
                add(alias.name, node.lineno, top)
        elif isinstance(node, ast.ImportFrom):
            base = here.rsplit(".", node.level - 1)[0] if node.level else ""  # one package per extra dot
            name = ".".join(filter(None, (base, node.module)))
            add(name, node.lineno, top, [a.name for a in node.names])
        elif called(node):
            add(called(node), node.lineno, top)
        test = node.test if isinstance(node, ast.If) else None
        skip = getattr(test, "attr", getattr(test, "id", None)) == "TYPE_CHECKING"
        top = top and not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
        for child in node.orelse if skip else ast.iter_child_nodes(node):
            visit(child, top)

    visit(ast.parse(path.read_text(encoding="utf-8"), str(path)), True)
    return [imp for imp in found if not (imp.internal and imp.target == modname)]


def imports(root: Path) -> list:
    """Every Imp of every package module under root."""
    nodes = modules(root)
    return [imp for name, path in nodes.items()
            for imp in file_imports(path, name, path.name == "__init__.py", nodes)]


def report(imps, bad, why: str) -> list:
    return [f"{i.src} -> {i.target} (line {i.line}): {why}" for i in imps if bad(i)]


def breadth_first(start, succ) -> dict:
    """{module reachable from start: its predecessor on a shortest path}; start itself is in
    it when it is on a cycle, with the module that closes the shortest one."""
    parent, queue = {}, [start]
    for v in queue:
        for w in sorted(succ[v] - set(parent)):
            parent[w] = v
            queue.append(w)
    return parent


def is_stdlib(top: str) -> bool:
    if hasattr(sys, "stdlib_module_names"):  # Python 3.10+
        return top in sys.stdlib_module_names
    # Python 3.9 (a skip would fail the run): where it would be found (find_spec runs nothing)
    origin = getattr(importlib.util.find_spec(top), "origin", None) or ""
    return origin in ("built-in", "frozen") or (
        origin.startswith(sysconfig.get_paths()["stdlib"]) and "-packages" not in origin)


def check_cycles(root: Path) -> list:
    """One cycle per strongly connected component (the modules reachable from v that reach v
    back): `a:LINE -> b:LINE -> a`, LINE where the module before an arrow imports the next."""
    line = {(i.src, i.target): i.line for i in reversed(imports(root)) if i.internal}
    succ = {name: set() for name in modules(root)}
    for src, dst in line:
        succ[src].add(dst)
    reach = {v: breadth_first(v, succ) for v in succ}
    comps = {tuple(sorted(w for w in reach[v] if v in reach[w])) for v in succ if v in reach[v]}
    problems = []
    for comp in comps:
        path, parent = [comp[0]], reach[comp[0]]  # the shortest cycle through comp[0], backwards
        while len(path) == 1 or path[-1] != comp[0]:
            path.append(parent[path[-1]])
        hops = " -> ".join(f"{a}:{line[a, b]}" for a, b in zip(path[::-1], path[-2::-1]))
        problems.append(f"cycle among {{{', '.join(comp)}}}: {hops} -> {comp[0]}")
    return sorted(problems)


def check_folders(root: Path) -> list:
    """Every module is in runtime/, tools/ or a patch folder (the top: the API and entry points)."""
    return [f"{name} ({path.relative_to(root)}): not in runtime/, tools/ or patches/"
            for name, path in modules(root).items() if kind(name) == "misplaced"]


def check_tools(root: Path) -> list:
    # direct edges suffice: a non-tool reaching a tool through others breaks the rule on the way
    return report(imports(root), lambda i: i.internal and kind(i.target) in ("tool", "probe")
                  and kind(i.src) in ("runtime", "patch"),
                  "a runtime or patch module imports a tool (or a patch's probe)")


def check_patches(root: Path) -> list:
    return report(imports(root),
                  lambda i: kind(i.src) in ("patch", "probe") and i.target in FORBIDDEN_FOR_PATCHES,
                  "patches reach the shim only through their Context")


def check_state(root: Path) -> list:
    imps = [i for i in imports(root) if i.src == STATE]
    return report(imps, lambda i: i.internal and i.target != BASE, f"only {BASE} among package modules") + \
        report(imps, lambda i: not (i.internal or is_stdlib(i.target.split(".")[0])), "not the stdlib")


def check_bootstrap(root: Path) -> list:
    imps = file_imports(root / "sitecustomize.py", "sitecustomize", False, modules(root))
    return report(imps, lambda i: i.module_level and i.target != "sys", "only sys at module level") + \
        report(imps, lambda i: i.internal and i.target != CORE, f"only {CORE} among package modules")


CHECKERS = (check_folders, check_cycles, check_tools, check_patches, check_state, check_bootstrap)


def real_tree_test(check):
    def test():
        problems = check(REPO)
        assert not problems, f"{check.__name__}: {check.__doc__ or ''}\n  " + "\n  ".join(problems)
    return test


test_every_module_is_in_its_folder = real_tree_test(check_folders)
test_no_import_cycles = real_tree_test(check_cycles)
test_runtime_and_patches_never_import_tools = real_tree_test(check_tools)
test_patches_never_import_the_machinery = real_tree_test(check_patches)
test_state_imports_only_base_and_stdlib = real_tree_test(check_state)
test_bootstrap_imports_only_core_and_sys = real_tree_test(check_bootstrap)


fn = "\n\ndef _injected():\n    {}\n".format  # an import inside a function
PROBE, BOOT = "patches/kv_spec_merge/probe.py", "../sitecustomize.py"
PATCH = "patches/kv_spec_merge/__init__.py"
E = "kimi_hotfix.{} -> kimi_hotfix.{}".format  # an edge as the checkers write it
MUTATIONS = {  # id: (checker, {file under kimi_hotfix/: source appended}, what a new problem says)
    "misplaced": (check_folders, {"stray.py": ""}, f"{PKG}.stray"),
    "cycle": (check_cycles, {"runtime/core.py": fn("from kimi_hotfix.runtime import versions"),
                             "runtime/versions.py": fn("import kimi_hotfix.runtime.core")},
              f"{RUNTIME}.versions"),
    "tools": (check_tools, {"runtime/metrics.py": "\nfrom kimi_hotfix.tools import status\n"},
              E("runtime.metrics", "tools.status")),
    "tools-relative": (check_tools, {PATCH: fn("from ...tools import cli")},
                       E("patches.kv_spec_merge", "tools.cli")),
    "tools-probe": (check_tools, {PATCH: fn("from . import probe")},
                    E("patches.kv_spec_merge", "patches.kv_spec_merge.probe")),
    "tools-literal": (check_tools,
                      {"runtime/wrapping.py": fn('import_module("kimi_hotfix.tools.audit.scan")')},
                      E("runtime.wrapping", "tools.audit.scan")),
    "patches": (check_patches, {PATCH: fn("from kimi_hotfix.runtime import core")},
                E("patches.kv_spec_merge", "runtime.core")),
    "patches-probe": (check_patches, {PROBE: "\nif True:\n    from kimi_hotfix.runtime.state import x\n"},
                      E("patches.kv_spec_merge.probe", "runtime.state")),
    "patches-init": (check_patches, {"patches/__init__.py": fn("from ..runtime import registry")},
                     E("patches", "runtime.registry")),
    "state": (check_state, {"runtime/state.py": "\nfrom kimi_hotfix.runtime import messages\n"},
              E("runtime.state", "runtime.messages")),
    "state-stdlib": (check_state, {"runtime/state.py": fn("import wrapt.wrappers")},
                     f"{STATE} -> wrapt.wrappers"),
    "bootstrap-top": (check_bootstrap, {BOOT: "\nimport os\n"}, "sitecustomize -> os"),
    "bootstrap": (check_bootstrap, {BOOT: fn("from kimi_hotfix.runtime import config")},
                  f"sitecustomize -> {RUNTIME}.config"),
    # None: not edges, nothing new (a new package; implicit parents as edges: fresh -> child -> fresh)
    "type-checking": (check_patches, {PATCH: "\nif TYPE_CHECKING:\n    import kimi_hotfix.runtime.core\n"},
                      None),
    "f-string": (check_tools, {"runtime/recompile.py": fn("""import_module(f"kimi_hotfix.tools.{'cli'}")""")},
                 None),
    "parents": (check_cycles, {"runtime/fresh/__init__.py": fn("from kimi_hotfix.runtime.fresh import child"),
                               "runtime/fresh/child.py": fn("import kimi_hotfix.runtime.fresh.leaf"),
                               "runtime/fresh/leaf.py": ""},
                None),
}


@pytest.mark.parametrize("check, sources, expected", MUTATIONS.values(), ids=MUTATIONS)
def test_checker_on_an_injected_change(tmp_path, check, sources, expected):
    shutil.copytree(REPO / PKG, tmp_path / PKG, ignore=shutil.ignore_patterns(*SKIP_DIRS))
    shutil.copy2(REPO / "sitecustomize.py", tmp_path)
    before = check(tmp_path)  # the real tree may break the rule already: look at what is new
    for rel, text in sources.items():
        (tmp_path / PKG / rel).parent.mkdir(exist_ok=True)
        with open(tmp_path / PKG / rel, "a", encoding="utf-8") as f:
            f.write(text)
    new = [p for p in check(tmp_path) if p not in before]
    assert any(expected in p for p in new) if expected else not new, (expected, new)

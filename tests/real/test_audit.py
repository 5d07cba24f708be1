"""``python -m kimi_hotfix audit`` on the real released wheels.

The audit runs with each release's venv interpreter (the installed vLLM found
through ``importlib.util.find_spec``), on an empty cache and again on the warm
one, in a child that reports which modules it imported. Its findings are
checked against an independent count of the same constructs in the installed
tree (a plain ``ast.walk``), and against the review: every site and reached
function is classified, the planner's fallbacks are covered by -O parity,
the CPU-offload getter site is listed, and docs/audit.md's tables are what the
generator makes of the cold runs. The same audit run by Python 3.12 (vLLM's
image) gives the same hashes and verdicts.
Timings are printed by the command and measured in bench/audit_time.py, not
asserted here.
"""

from __future__ import annotations

import ast
import functools
import json
import tempfile
from pathlib import Path

import pytest

from harness import venv_python, vllm_location
from helpers import REPO, hermetic_env, json_lines, run_python

pytestmark = pytest.mark.releases("0.29.0", "0.30.0", "0.33.0")
PYTHON312 = sorted(Path.home().glob(".pyenv/versions/3.12*/bin/python"))

RUN = r"""
import contextlib, io, json, sys
from kimi_hotfix import cli
buf = io.StringIO()
with contextlib.redirect_stdout(buf):
    rc = cli.main(["audit", "--json", *sys.argv[1:]])
loaded = sorted(m for m in sys.modules if m.split(".")[0] in ("vllm", "torch", "wrapt"))
print("KIMI_JSON:" + json.dumps({"rc": rc, "report": json.loads(buf.getvalue()), "imported": loaded}))
"""


def _audit(python, cache, *args):
    proc = run_python(["-c", RUN, *args], python=python,
                      env=hermetic_env(KIMI_HOTFIX_CACHE=str(cache)), check=False, timeout=600)
    found = json_lines(proc.stdout)
    assert found, f"audit printed nothing (exit {proc.returncode}):\n{proc.stderr[-4000:]}"
    return found[-1]


@functools.cache
def runs(release):
    """(cold, warm) audits of ``release``'s installed vLLM, on one fresh cache."""
    cache = Path(tempfile.mkdtemp(prefix=f"kimi-audit-{release}-"))
    python = venv_python(release)
    return _audit(python, cache), _audit(python, cache)


def report(release):
    return runs(release)[0]["report"]


def sites(release, qualname):
    return [s for s in report(release)["sites"] if s["qualname"] == qualname]


def test_audit_classifies_everything_and_imports_nothing(release):
    cold, warm = runs(release)
    for run in (cold, warm):
        assert run["rc"] == 0, run["report"].get("counts")
        assert run["imported"] == []  # neither vLLM nor torch nor wrapt
    r = cold["report"]
    print(f"\n{release}: cold {r['timings']}, warm {warm['report']['timings']}")
    assert r["version"] == release and r["all_reviewed"] is True
    assert Path(r["root"]) == (vllm_location(venv_python(release)) / "vllm").resolve()
    assert r["counts"]["sites"]["not reviewed"] == r["counts"]["reached"]["not reviewed"] == 0
    assert r["unparsed"] == {}
    # the warm run reads every summary from the cache and finds the same
    w = warm["report"]
    assert w["parsed"] == 0 and w["cache_hits"] == r["parsed"] + r["cache_hits"] > 0
    assert w["sites"] == r["sites"]


def _independent_count(root: Path) -> dict:
    """The three kinds of sites, counted with a plain ast.walk of every module."""
    def names(expr):
        items = expr.elts if isinstance(expr, ast.Tuple) else [expr]
        return [ast.unparse(i).rsplit(".", 1)[-1] for i in items]

    found = {"except": 0, "suppress": 0, "validator": 0}
    for path in root.rglob("*.py"):
        text = path.read_text(errors="replace")
        if "AssertionError" not in text and "validator" not in text:
            continue
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.ExceptHandler) and node.type is not None:
                found["except"] += "AssertionError" in names(node.type)
            elif isinstance(node, ast.withitem) and isinstance(node.context_expr, ast.Call):
                call = node.context_expr
                if ast.unparse(call.func).endswith("suppress"):
                    found["suppress"] += any("AssertionError" in names(a) for a in call.args)
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                decorators = [ast.unparse(d.func if isinstance(d, ast.Call) else d)
                              for d in node.decorator_list]
                if any(d.rsplit(".", 1)[-1] in ("field_validator", "model_validator", "validator",
                                                "root_validator") for d in decorators):
                    inner = [n for stmt in node.body for n in ast.walk(stmt)]
                    nested = {id(n) for d in inner if isinstance(d, (ast.FunctionDef, ast.Lambda))
                              for n in ast.walk(d)}
                    found["validator"] += any(isinstance(n, ast.Assert) and id(n) not in nested
                                              for n in inner)
    return found


def test_the_sites_match_an_independent_count(release):
    r = report(release)
    assert r["counts"]["kinds"] == _independent_count(Path(r["root"]))
    for site in r["sites"]:  # each points at its own handler or block in the installed file
        lines = (Path(r["root"]).parent / site["file"]).read_text().splitlines()
        window = "\n".join(lines[site["line"] - 1:site["line"] + 8])
        expected = "AssertionError" if site["kind"] != "validator" else "def "
        assert expected in window, site


@pytest.mark.releases("0.33.0")
def test_0_33_planner_fallbacks_are_covered_by_o_parity(release):
    for name in ("is_kv_cache_spec_uniform", "_get_kv_cache_groups_uniform_page_size"):
        [site] = sites(release, f"vllm.v1.core.kv_cache_planning.{name}")
        assert (site["verdict"], site["patch"], site["patch_armed"]) == ("covered", "o_parity",
                                                                         True)
        merges = {h["qualname"]: h for h in site["reaches"] if h["qualname"].endswith(".merge")}
        assert "vllm.v1.kv_cache_interface.MLAAttentionSpec.merge" in merges
        assert {h["verdict"] for h in merges.values()} == {"covered"}
        assert {h["patch"] for h in merges.values()} == {"o_parity"}


@pytest.mark.releases("0.29.0", "0.30.0")
def test_older_planner_fallbacks_are_covered_too(release):
    [site] = sites(release, "vllm.v1.core.kv_cache_utils.is_kv_cache_spec_uniform")
    assert site["verdict"] == "covered" and site["patch"] == "o_parity"
    base = [h for h in site["reaches"] if h["qualname"].endswith("kv_cache_interface.KVCacheSpec.merge")]
    # 0.29.0's base merge still asserts; 0.30.0 raises explicitly (PR #55234)
    assert len(base) == (1 if release == "0.29.0" else 0)


def test_the_cpu_offload_getter_site_is_listed(release):
    [site] = sites(release, "vllm.v1.kv_offload.cpu.spec._all_workers_barrier")
    assert site["kind"] == "except" and site["catches"] == ["AssertionError"]
    assert site["file"] == "vllm/v1/kv_offload/cpu/spec.py"
    [getter] = site["reaches"]
    assert getter["qualname"] == "vllm.distributed.parallel_state.get_inner_dp_world_group"
    assert getter["how"] == "import" and getter["depth"] == 1
    for entry in (site, getter):
        assert (entry["verdict"], entry["patch"]) == ("covered", "o_parity")
        assert entry["patch_armed"] is True  # -O parity: armed by the shim


@pytest.mark.releases("0.33.0")
def test_python_3_12_hashes_and_classifies_the_same(release, tmp_path):
    assert PYTHON312, "no Python 3.12 under ~/.pyenv (vLLM's image runs 3.12)"
    r = report(release)
    env = hermetic_env(KIMI_HOTFIX_CACHE=str(tmp_path))
    env["PYTHONPATH"] = str(REPO)
    proc = run_python(["-m", "kimi_hotfix", "audit", "--json", "--root", r["root"]],
                      python=str(PYTHON312[-1]), env=env, timeout=600)
    other = json.loads(proc.stdout)

    def key(report):
        return [(s["qualname"], s["line"], s["hash"], s["verdict"],
                 [(h["qualname"], h["hash"], h["verdict"]) for h in s["reaches"]])
                for s in report["sites"]]

    assert key(other) == key(r)


@pytest.mark.releases("0.33.0")
def test_docs_tables_are_current(release, monkeypatch):
    """docs/audit.md's tables are the audit of the three releases as they are now:
    the generator's own text, from the cold audits above (each release's
    interpreter, an empty cache: what ``audit.run(root, use_cache=False)``, which
    the generator calls, finds; the warm run agrees) rather than three more scans."""
    from kimi_hotfix import audit
    from kimi_hotfix.audit import docs

    text = (REPO / "docs" / "audit.md").read_text()
    begin, end = text.index(docs.BEGIN) + len(docs.BEGIN) + 1, text.index(docs.END)
    found = {str(Path(report(r)["root"]).resolve()): report(r) for r in ("0.29.0", "0.30.0", "0.33.0")}
    scanned = []

    def run(root, **kwargs):
        scanned.append((root, kwargs))
        return found[str(Path(root).resolve())]

    monkeypatch.setattr(audit, "run", run)
    roots = {r: str(vllm_location(venv_python(r)) / "vllm") for r in ("0.29.0", "0.30.0", "0.33.0")}
    assert text[begin:end] == docs.generated(roots), (
        "regenerate: python -m kimi_hotfix.audit.docs docs/audit.md 0.29.0=DIR 0.30.0=DIR 0.33.0=DIR")
    assert [kwargs for _, kwargs in scanned] == [{"use_cache": False}] * 3

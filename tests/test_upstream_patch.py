"""The upstream fix (upstream/0001-kv-cache-spec-merge-explicit-checks.patch),
applied to the real vLLM 0.33.0 through an overlay (upstream/overlay.py), and
the shim stepping aside by itself on that patched vLLM (issue 9).

- The overlay is built from the cached 0.33.0 venv into tmp_path; the venv's
  files the patch touches keep their sha256 (before the build, after it, and
  after every child below ran).
- Without the shim (no PYTHONPATH to the repo; the probe runs by path), the
  patched vLLM's own planner groups the Kimi-K3 layer sets under -O (seeds 0, 1,
  2) and -OO (seed 3) exactly as plain, unpatched 0.33.0 does (the reference:
  same probe, no -O, no overlay, no shim); the same runs without the overlay
  differ from the reference (the test can fail).
- With the shim behind the overlay, ``python -O <repo>/kimi_hotfix check
  --json`` finds kv_spec_merge not needed, the shim removable, exit 0; without
  the overlay the same check finds kv_spec_merge needed, not removable.

Eleven children in all, run two at a time; each imports vLLM.
"""

from __future__ import annotations

import ast
import hashlib
import importlib.util
import json
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from conftest import REPO, hermetic_env, json_lines, run_python, venv_python

pytestmark = pytest.mark.vllm("0.33.0")

RELEASE = "0.33.0"
PATCH = REPO / "upstream" / "0001-kv-cache-spec-merge-explicit-checks.patch"
PROBE = str(REPO / "kimi_hotfix" / "probes" / "kv_grouping.py")
PACKAGE_DIR = str(REPO / "kimi_hotfix")
OPTIMIZED = [("O", 0), ("O", 1), ("O", 2), ("OO", 3)]
FLAGS = {"plain": [], "O": ["-O"], "OO": ["-OO"]}
LEVEL = {"plain": 0, "O": 1, "OO": 2}
CAPABILITY = "non_causal_multi_token_decode"


def _load_overlay_module():
    spec = importlib.util.spec_from_file_location(
        "kimi_upstream_overlay", REPO / "upstream" / "overlay.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _site_packages(python: str):
    proc = run_python(
        ["-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        python=python,
        env=hermetic_env(shim=False),
    )
    return Path(proc.stdout.strip())


def _sha256(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _merge_asserts(path) -> dict:
    """{class: number of assert statements in its merge method}."""
    out = {}
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, ast.FunctionDef) and item.name == "merge":
                    out[node.name] = sum(isinstance(n, ast.Assert) for n in ast.walk(item))
    return out


class Probe:
    """One kv_grouping child: its KIMI_JSON records."""

    def __init__(self, proc):
        self.stderr = proc.stderr
        records = {}
        for obj in json_lines(proc.stdout):
            records[(obj.pop("kind"), obj.get("layer_set"))] = obj
        self.process = records[("process", None)]
        self.preflight = records[("preflight", None)]
        self.results = {
            "merge_target_draft": records[("merge_target_draft", None)],
            **{k[1]: v for k, v in records.items() if k[0] == "grouping"},
        }


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """The overlay, built from the 0.33.0 venv (hashes of the venv's files around it)."""
    python = venv_python(RELEASE)
    site_packages = _site_packages(python)
    overlay_mod = _load_overlay_module()
    touched = overlay_mod.patch_paths(PATCH)
    hashes_before = {rel: _sha256(site_packages / rel) for rel in touched}
    overlay = overlay_mod.make_overlay(site_packages, PATCH, tmp_path_factory.mktemp("overlay"))
    return {
        "python": python,
        "overlay": overlay,
        "site_packages": site_packages,
        "touched": touched,
        "hashes_before": hashes_before,
        "hashes_built": {rel: _sha256(site_packages / rel) for rel in touched},
        "manifest": json.loads((overlay / overlay_mod.MANIFEST).read_text()),
    }


@pytest.fixture(scope="module")
def setup(built):
    """Every child (two at a time), then the venv's hashes again."""
    python, overlay, site_packages = built["python"], built["overlay"], built["site_packages"]

    def probe(opt, seed, with_overlay):
        env = hermetic_env(
            shim=False, PYTHONHASHSEED=seed, PYTHONPATH=overlay if with_overlay else None
        )
        return Probe(run_python([PROBE], python=python, flags=FLAGS[opt], env=env, cwd=REPO))

    def check(with_overlay):
        path = [str(overlay), str(REPO)] if with_overlay else [str(REPO)]
        env = hermetic_env(PYTHONHASHSEED=0, PYTHONPATH=os.pathsep.join(path))
        proc = run_python(
            [PACKAGE_DIR, "check", "--json"],
            python=python,
            flags=["-O"],
            env=env,
            cwd=REPO,
            check=False,
        )
        return proc.returncode, json.loads(proc.stdout), proc.stderr

    jobs = {("reference",): (probe, ("plain", 0, False))}
    for opt, seed in OPTIMIZED:
        jobs[("overlay", opt, seed)] = (probe, (opt, seed, True))
        jobs[("plain-vllm", opt, seed)] = (probe, (opt, seed, False))
    jobs[("check", "overlay")] = (check, (True,))
    jobs[("check", "plain-vllm")] = (check, (False,))
    with ThreadPoolExecutor(max_workers=2) as pool:
        futures = {key: pool.submit(fn, *args) for key, (fn, args) in jobs.items()}
        runs = {key: future.result() for key, future in futures.items()}

    hashes_after = {rel: _sha256(site_packages / rel) for rel in built["touched"]}
    return {
        **built,
        "hashes": (built["hashes_before"], built["hashes_built"], hashes_after),
        "runs": runs,
    }


def _differing(run: Probe, ref: Probe) -> dict:
    return {k: (run.results.get(k), v) for k, v in ref.results.items() if run.results.get(k) != v}


# -- the overlay ----------------------------------------------------------------


def test_overlay_patches_a_copy_and_never_the_venv(setup):
    overlay, touched = setup["overlay"], setup["touched"]
    before, at_build, after = setup["hashes"]
    assert touched == ["vllm/v1/kv_cache_interface.py"]
    assert before == at_build == after
    manifest = setup["manifest"]["patched"]
    for rel in touched:
        copy = overlay / rel
        assert copy.is_file() and not copy.is_symlink()
        assert manifest[rel]["original_sha256"] == before[rel]
        assert manifest[rel]["patched_sha256"] == _sha256(copy) != before[rel]
    # every merge of the installed module guards with assert; none in the copy
    original = _merge_asserts(setup["site_packages"] / touched[0])
    patched = _merge_asserts(overlay / touched[0])
    assert set(original) == set(patched) and len(original) >= 6
    assert sum(original.values()) > 0
    assert patched == dict.fromkeys(original, 0)
    init = overlay / "vllm" / "__init__.py"
    assert init.is_symlink()
    assert os.path.realpath(init) == str(setup["site_packages"] / "vllm" / "__init__.py")
    # the patched module's bytecode is not linked from the venv (it would be stale)
    pycache = overlay / "vllm" / "v1" / "__pycache__"
    assert not [p for p in pycache.iterdir() if p.name.startswith("kv_cache_interface.")]


def test_overlay_refuses_a_patch_that_does_not_apply(built, tmp_path):
    """A small stand-in site-packages whose kv_cache_interface.py is already
    patched: the patch must be refused, the stand-in untouched, nothing left."""
    overlay_mod = _load_overlay_module()
    rel = built["touched"][0]
    site = tmp_path / "site-packages"
    (site / rel).parent.mkdir(parents=True)
    (site / "vllm" / "__init__.py").write_text("")
    (site / rel).write_bytes((built["overlay"] / rel).read_bytes())
    before = _sha256(site / rel)
    with pytest.raises(overlay_mod.OverlayError, match="does not apply cleanly"):
        overlay_mod.make_overlay(site, PATCH, tmp_path / "again")
    assert _sha256(site / rel) == before
    assert not (tmp_path / "again" / "vllm").exists()
    # A patch that reaches outside vllm/ is refused before anything is built.
    outside = tmp_path / "outside.patch"
    outside.write_text("--- a/torch/x.py\n+++ b/torch/x.py\n@@ -1 +1 @@\n-a\n+b\n")
    with pytest.raises(overlay_mod.OverlayError, match="outside vllm/"):
        overlay_mod.make_overlay(site, outside, tmp_path / "outside")
    assert not (tmp_path / "outside").exists()


# -- the reference ----------------------------------------------------------------


def test_reference_is_plain_unpatched_unshimmed_0_33(setup):
    ref = setup["runs"][("reference",)]
    assert ref.process["vllm"] == RELEASE
    assert ref.process["optimize"] == 0
    assert "states" not in ref.process, "the reference must run without the shim"
    assert ref.preflight["ok"], ref.preflight["detail"]


# -- patched vLLM, no shim: -O and -OO group like the reference --------------------


@pytest.mark.parametrize("opt,seed", OPTIMIZED, ids=[f"{o}-{s}" for o, s in OPTIMIZED])
def test_patched_vllm_groups_like_reference_under_optimize(setup, opt, seed):
    run, ref = setup["runs"][("overlay", opt, seed)], setup["runs"][("reference",)]
    assert run.process["vllm"] == RELEASE
    assert run.process["optimize"] == LEVEL[opt]
    assert run.process["hashseed"] == str(seed)
    assert "states" not in run.process, "the shim must not load here"
    assert "kimi-hotfix" not in run.stderr
    assert _differing(run, ref) == {}
    assert run.results["merge_target_draft"][CAPABILITY] is True
    assert run.preflight["ok"], run.preflight["detail"]


@pytest.mark.parametrize("opt,seed", OPTIMIZED, ids=[f"{o}-{s}" for o, s in OPTIMIZED])
def test_unpatched_vllm_differs_under_optimize(setup, opt, seed):
    run, ref = setup["runs"][("plain-vllm", opt, seed)], setup["runs"][("reference",)]
    assert run.process["optimize"] == LEVEL[opt]
    assert "states" not in run.process
    differing = _differing(run, ref)
    assert "kda_mla_draft_mla_first" in differing, differing
    assert "mla_cache_dtype_str" in differing, differing
    assert "'MambaSpec' object has no attribute 'cache_dtype_str'" in json.dumps(
        run.results["kda_mla_draft_mla_first"]
    )
    assert not run.preflight["ok"]


# -- the shim on patched vLLM: not needed, removable -------------------------------


def _kv_entry(report):
    (entry,) = [p for p in report["patches"] if p["name"] == "kv_spec_merge"]
    return entry


def test_shim_check_on_patched_vllm_steps_aside(setup):
    rc, report, stderr = setup["runs"][("check", "overlay")]
    assert report["vllm"] == RELEASE
    assert report["python"]["optimize"] == 1
    entry = _kv_entry(report)
    assert entry["needed"] is False, entry
    assert entry["state"].startswith("not needed"), entry["state"]
    assert entry["without"]["ok"], entry["without"]
    assert report["removable"] is True, report["verdict"]
    assert report["problems"] == []
    assert rc == 0, stderr[-3000:]


def test_shim_check_on_unpatched_vllm_is_needed(setup):
    rc, report, stderr = setup["runs"][("check", "plain-vllm")]
    assert report["python"]["optimize"] == 1
    entry = _kv_entry(report)
    assert entry["needed"] is True, entry
    assert not entry["without"]["ok"]
    assert entry["with"]["ok"], entry["with"]
    assert report["removable"] is False
    assert rc == 0, stderr[-3000:]  # needed and fixed by the shim: a pass

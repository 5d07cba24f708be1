"""The upstream fixes (upstream/000*.patch: the spec merges, the parallel group
getters, VllmConfig's checks) on the real vLLM 0.33.0, and the shim stepping
aside by itself once they land.

- The patches are applied to a copy of 0.33.0's files (upstream/overlay.py: a
  symlink tree first on PYTHONPATH, the patched files real copies); the cached
  venv is never modified (sha256 before and after every child).
- Without the shim's patches (KIMI_HOTFIX=0: nothing installed, checked), the
  patched vLLM's own planner groups the Kimi-K3 layer sets under -O (seeds 0 and
  1) and -OO (seed 3) exactly as plain 0.33.0 as released does; the same runs
  on unpatched 0.33.0 differ (the test can fail).
- On the patched vLLM, ``python -O -m kimi_hotfix check`` finds every patch
  not needed (the source checks find no assert left) and the shim removable.
"""

from __future__ import annotations

import ast
import json
import os

import pytest

from kimi_hotfix.runtime import recompile

from harness import UPSTREAM_PATCH, child, reference, upstream_overlay

pytestmark = pytest.mark.releases("0.33.0")

OPTIMIZED = [("O", 0), ("O", 1), ("OO", 3)]
LEVEL = {"O": 1, "OO": 2}


# the functions each patched file must check without assert, and whether
# type-narrowing asserts (isinstance, is not None) may stay (0003 leaves them)
CHECKED = {
    "vllm/v1/kv_cache_interface.py": ({"merge", "max_num_blocks_per_req"}, False),
    "vllm/v1/core/kv_cache_planning.py": ({"get_uniform_page_size"}, False),
    "vllm/distributed/parallel_state.py": ({"get_world_group", "get_inner_dp_world_group",
                                            "get_tp_group", "get_pp_group", "get_dcp_group",
                                            "get_pcp_group"}, False),
    "vllm/config/vllm.py": ({"__post_init__", "_set_cudagraph_sizes", "_set_compile_ranges",
                             "validate_block_size"}, True),
}


def checked_asserts(path, names, narrowing_may_stay=False) -> dict:
    """{qualified def: number of assert statements} for the defs named ``names``
    (less the type-narrowing ones where they may stay)."""
    out = {}

    def visit(body, prefix):
        for item in body:
            if isinstance(item, ast.ClassDef):
                visit(item.body, f"{prefix}{item.name}.")
            elif isinstance(item, ast.FunctionDef) and item.name in names:
                out[prefix + item.name] = sum(
                    isinstance(n, ast.Assert)
                    and not (narrowing_may_stay and recompile.type_narrowing(n))
                    for n in ast.walk(item))

    visit(ast.parse(path.read_text()).body, "")
    return out


def kv_results(run):
    return {"merge": run["kv"]["merge"], **run["kv"]["groupings"]}


def overlay_run(release, opt, seed):
    """The patched vLLM's child: with the shim on for -O seed 0 (it steps aside,
    so nothing of it runs: the same process serves test_the_shim_steps_aside),
    off (KIMI_HOTFIX=0) for the others."""
    return child(release, "upstream" if (opt, seed) == ("O", 0) else "upstream_off", opt, seed)


@pytest.mark.parametrize("opt, seed", OPTIMIZED, ids=[f"{o}-{s}" for o, s in OPTIMIZED])
def test_patched_vllm_groups_like_the_reference_without_the_shim(release, opt, seed):
    run, overlay = overlay_run(release, opt, seed), upstream_overlay(release)
    process = run["process"]
    assert process["optimize"] == LEVEL[opt] and process["hashseed"] == str(seed)
    assert process["kv_cache_interface_file"].startswith(str(overlay["path"]))
    kinds = set(run.kinds.values())
    assert kinds == {"disabled"} if (opt, seed) != ("O", 0) else kinds <= {
        "not_needed", "not_affected"}, run.states
    assert run["wrapped"]["layers"] == {} and run["wrapped"]["recorded"] == {}
    assert kv_results(run) == kv_results(reference())
    assert run["kv"]["probe"]["ok"], run["kv"]["probe"]
    # unpatched 0.33.0 under the same flags does not (when a child exists for it)
    if opt == "O" and seed in (0, 1):
        assert kv_results(child(release, "off", opt, seed)) != kv_results(reference())


def test_the_shim_steps_aside_on_the_patched_vllm(release):
    report = json.loads(child(release, "upstream", "O")["check"]["stdout"])
    assert report["python"]["optimize"] == 1
    kv = next(p for p in report["patches"] if p["name"] == "kv_spec_merge")
    assert (kv["needed"], kv["kind"]) == (False, "not_needed"), kv
    assert report["exit_status"] == 0 and report["problems"] == []
    # -O parity stays needed: vLLM's other asserts (a KV-cache block guard no fix here
    # touches) still differ under -O; the three sites the fixes rewrite no longer do
    assert report["needed"] == ["o_parity"] and report["removable"] is False, report["verdict"]

    def differing(report):
        parity = next(p for p in report["patches"] if p["name"] == "o_parity")
        return sorted(label for label, text in parity["without"]["cases"].items()
                      if "(plain Python: " in text)

    assert differing(report) == ["a free list without its tail (FreeKVCacheBlockQueue.append_n)"]
    # the same check on 0.33.0 as released: more of the cases differ under -O (the
    # getter 0002 fixes among them)
    unpatched = json.loads(child(release, "on", "O")["check"]["stdout"])
    assert unpatched["needed"] == ["o_parity"] and unpatched["removable"] is False
    assert set(differing(report)) < set(differing(unpatched)), differing(unpatched)
    assert "no inner-DP group (get_inner_dp_world_group)" in differing(unpatched)


def test_the_overlay_never_touches_the_venv(release):
    overlay = upstream_overlay(release)
    for opt, seed in OPTIMIZED:  # after the children ran
        overlay_run(release, opt, seed)
    module, site = overlay["module"], overlay["site"]
    assert sorted(overlay["touched"]) == sorted(CHECKED)
    for rel in overlay["touched"]:
        copy = overlay["path"] / rel
        assert module.sha256(site / rel) == overlay["hashes_before"][rel]
        assert copy.is_file() and not copy.is_symlink()
        assert module.sha256(copy) != overlay["hashes_before"][rel]
        original = checked_asserts(site / rel, *CHECKED[rel])
        patched = checked_asserts(copy, *CHECKED[rel])
        assert set(original) == set(patched) and sum(original.values()) > 0, rel
        assert patched == dict.fromkeys(original, 0), rel
    init = overlay["path"] / "vllm" / "__init__.py"
    assert init.is_symlink() and os.path.realpath(init) == str(site / "vllm" / "__init__.py")


def test_the_overlay_refuses_a_patch_that_does_not_apply(release, tmp_path):
    overlay = upstream_overlay(release)
    module = overlay["module"]
    site = tmp_path / "site-packages"
    (site / "vllm").mkdir(parents=True)
    (site / "vllm" / "__init__.py").write_text("")
    before = {}
    for rel in module.patch_paths(UPSTREAM_PATCH):  # the files already patched
        (site / rel).parent.mkdir(parents=True, exist_ok=True)
        (site / rel).write_bytes((overlay["path"] / rel).read_bytes())
        before[rel] = module.sha256(site / rel)
    with pytest.raises(module.OverlayError, match="does not apply cleanly"):
        module.make_overlay(site, UPSTREAM_PATCH, tmp_path / "again")
    assert {rel: module.sha256(site / rel) for rel in before} == before
    assert not (tmp_path / "again" / "vllm").exists()
    outside = tmp_path / "outside.patch"
    outside.write_text("--- a/torch/x.py\n+++ b/torch/x.py\n@@ -1 +1 @@\n-a\n+b\n")
    with pytest.raises(module.OverlayError, match="outside vllm/"):
        module.make_overlay(site, outside, tmp_path / "outside")

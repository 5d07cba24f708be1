"""The RecoverSSM patches on the real vLLM 0.29.0, 0.30.0, 0.33.0 (and 0.29.0 on 3.12).

capture_workspace (CudaGraphManager._init_candidates):
- 0.29.0 with the shim plans exactly what 0.30.0 as released plans for the same
  config (``_capture_descs`` and the ``_candidates`` table), for several
  (max_num_seqs, k) shapes incl. the seed (48, 8), Hopper sizes up to 512, each
  CUDA-graph mode, LoRA cases, varlen decode and an explicit size list; the
  largest mixed graph fits the workspace; the operator's capture sizes read the
  same after; with RecoverSSM off, or a workspace above the sizes, the plan is
  vLLM's own; with KIMI_HOTFIX=0 the over-workspace plan reproduces.
- 0.30.0 / 0.33.0: not needed, not wrapped; toggled on, the plan is unchanged.

kda_overlong_rows (KimiK3KDAMetadataBuilder.build):
- 0.29.0 / 0.30.0 with the shim: batches with rows longer than k + 1 build the
  metadata 0.33.0 builds for the same input; batches within capacity build what
  the unpatched builder builds; with KIMI_HOTFIX=0 every over-long batch raises.
- the shim installs vLLM's build recompiled with an inline guard; without that
  file's source it cannot tell, warns, and installs a wrapt wrapper that builds
  the same; a failure inside the router is logged once and leaves vLLM's own
  behaviour (strict mode raises).
- 0.33.0: not needed, not wrapped; toggled on, every batch builds the same.

Plain and -O. References come from the reference releases as released, in this
run: 0.30.0 for the plan, 0.33.0 for the builder.
"""

from __future__ import annotations

import json

import pytest

from cases import KDA_OVERLONG, KDA_WITHIN, PLANS, PLANS_OFF, SEED, key
from harness import child, plan_reference, reference
from helpers import summaries, warning_lines

FLAGS = ("plain", "O")
NEEDS_BOTH = ("0.29.0", "0.29.0-py3.12")  # releases where both patches apply
CAPACITY_ERROR = "ValueError: KDA RecoverSSM speculative decode query length exceeds"


def plan_of(result):
    return {"capture_descs": result["capture_descs"], "candidates": result["candidates"]}


def metadata(result):
    assert "error" not in result, result["error"]
    return {k: v for k, v in result["metadata"].items() if k != "extra"}


def same_extra(a, b):
    """Release-specific metadata fields, compared where both releases have them."""
    ea, eb = a["metadata"]["extra"], b["metadata"]["extra"]
    return {k: ea[k] for k in ea.keys() & eb.keys()} == {k: eb[k] for k in ea.keys() & eb.keys()}


def assert_config_left_alone(p):
    assert p["capture_sizes_after"] == p["capture_sizes"], p["capture_sizes_after"]
    assert p["capture_sizes_same_object"]
    assert p["max_capture_size_after"] == p["max_capture_size"]
    assert p["manager_config_is_shared"]
    assert p["second_manager_same_plan"]


def plans(run, which="installed"):
    return run["plans"][which]


def kdas(run, which="installed"):
    return run["kda"][which]


# -- capture_workspace ------------------------------------------------------------


@pytest.mark.releases(*NEEDS_BOTH)
@pytest.mark.parametrize("flags", FLAGS)
def test_capture_plan_on_029_is_the_030_plan(release, flags):
    ours, ref = child(release, "on", flags), plan_reference()
    assert ours.kinds["capture_workspace"] == "applied" and ours["wrapped"]["capture"]
    assert not ref["wrapped"]["capture"]
    for spec in PLANS:
        p, r = plans(ours)[key(spec)], plans(ref)[key(spec)]
        assert p["wrapped"] and not r["wrapped"]
        assert p["capture_sizes"] == r["capture_sizes"], spec  # the same config
        assert plan_of(p) == plan_of(r), spec
        assert p["largest_mixed"] <= p["workspace_tokens"], spec
        assert_config_left_alone(p)


@pytest.mark.releases("0.29.0")
@pytest.mark.parametrize("flags", FLAGS)
def test_capture_plan_without_the_shim_reproduces_the_bug(release, flags):
    off, ref = child(release, "off", flags), plan_reference()
    seed = plans(off)[key(SEED)]
    assert max(seed["capture_sizes"]) == 512  # the seed: Hopper sizes up to 512
    assert seed["largest_mixed"] > seed["workspace_tokens"] == 432, seed["largest_mixed"]
    for spec in PLANS:
        u = plans(off)[key(spec)]
        if u["largest_mixed"] > u["workspace_tokens"]:  # the comparison above can fail
            assert plan_of(u) != plan_of(plans(ref)[key(spec)]), spec


@pytest.mark.releases("0.29.0")
@pytest.mark.parametrize("flags", FLAGS)
def test_capture_plan_untouched_without_recoverssm_or_overflow(release, flags):
    ours, off = child(release, "on", flags), child(release, "off", flags)
    fits = [s for s in PLANS if plans(off)[key(s)]["largest_mixed"]
            <= plans(off)[key(s)]["workspace_tokens"]]
    assert fits  # the 576-token workspace shape
    for spec in PLANS_OFF + fits:
        p, u = plans(ours)[key(spec)], plans(off)[key(spec)]
        assert p["wrapped"]
        assert plan_of(p) == plan_of(u), spec
        assert_config_left_alone(p)
    p = plans(ours)[key(PLANS_OFF[0])]  # RecoverSSM off: vLLM's own plan, above the workspace
    assert p["largest_mixed"] > p["workspace_tokens"]


@pytest.mark.releases("0.30.0", "0.33.0")
@pytest.mark.parametrize("flags", FLAGS)
def test_capture_not_needed_where_upstream_fixed(release, flags):
    ours, off = child(release, "on", flags), child(release, "off")
    assert ours.kinds["capture_workspace"] == "not_needed", ours.states
    assert not ours["wrapped"]["capture"]
    for spec in PLANS + PLANS_OFF:
        p = plans(ours)[key(spec)]
        assert not p["wrapped"]
        assert plan_of(p) == plan_of(plans(off)[key(spec)]), spec
    seed = plans(ours)[key(SEED)]
    assert seed["largest_mixed"] <= seed["workspace_tokens"]  # the decision is right
    # toggled on anyway, the patch changes nothing
    assert ours["plans"]["forced_state"] == "applied (toggled on)"
    for spec in PLANS + PLANS_OFF:
        p = plans(ours, "forced")[key(spec)]
        assert p["wrapped"] and plan_of(p) == plan_of(plans(off)[key(spec)]), spec
        assert_config_left_alone(p)


# -- kda_overlong_rows ---------------------------------------------------------------


@pytest.mark.releases("0.29.0", "0.30.0", "0.29.0-py3.12")
@pytest.mark.parametrize("flags", FLAGS)
def test_overlong_rows_build_what_033_builds(release, flags):
    ours, ref = child(release, "on", flags), reference()
    assert ours.states["kda_overlong_rows"] == "applied"
    # vLLM's build recompiled with the inline guard, not the wrapt fallback
    assert ours["wrapped"]["build_kind"] == "inline"
    assert not ref["wrapped"]["build"]
    for spec in KDA_OVERLONG:
        o, r = kdas(ours)[key(spec)], kdas(ref)[key(spec)]
        assert o["wrapped"] and not r["wrapped"]
        assert metadata(o) == metadata(r), spec
        assert same_extra(o, r), spec


@pytest.mark.releases("0.29.0", "0.30.0")
@pytest.mark.parametrize("flags", FLAGS)
def test_overlong_rows_without_the_shim_raise(release, flags):
    off = child(release, "off", flags)
    for spec in KDA_OVERLONG:
        u = kdas(off)[key(spec)]
        capacity = spec.get("num_spec", 8) + 1
        assert u.get("error", "").startswith(CAPACITY_ERROR), u
        assert f"activation capacity ({capacity})" in u["error"]


@pytest.mark.releases("0.29.0", "0.30.0")
@pytest.mark.parametrize("flags", FLAGS)
def test_within_capacity_builds_what_the_unpatched_builder_builds(release, flags):
    ours, off = child(release, "on", flags), child(release, "off", flags)
    for spec in KDA_WITHIN:
        o, u = kdas(ours)[key(spec)], kdas(off)[key(spec)]
        assert o["wrapped"] and not u["wrapped"]
        assert "error" not in u, u
        assert o["metadata"] == u["metadata"], spec


@pytest.mark.releases("0.29.0")  # the same code path on 0.30.0
@pytest.mark.parametrize("flags", FLAGS)
def test_without_source_it_cannot_tell_and_the_wrapt_fallback_builds_the_same(release, flags):
    """kda_metadata shipped as bytecode only: the check cannot read the source, so
    the shim applies (the safe side) and warns; there is nothing to recompile, so
    it installs its wrapt wrapper, which builds the same."""
    ours, ref, off = child(release, "no_source", flags), reference(), child(release, "off", flags)
    hidden = "source of KimiK3KDAMetadataBuilder.build unavailable (could not get source code)"
    assert ours.states["kda_overlong_rows"] == (
        f"applied (cannot tell: {hidden}; applied to be safe; wrapt wrapper: {hidden})")
    assert ours["wrapped"]["build_kind"] == "wrapt"
    warnings = [w for w in warning_lines(ours.stderr) if "kda_overlong_rows" in w]
    assert len(warnings) == 1 and "cannot tell whether kda_overlong_rows is needed" in warnings[0]
    for spec in KDA_OVERLONG:
        o, r = kdas(ours)[key(spec)], kdas(ref)[key(spec)]
        assert metadata(o) == metadata(r), spec
        assert same_extra(o, r), spec
    for spec in KDA_WITHIN:
        assert kdas(ours)[key(spec)]["metadata"] == kdas(off)[key(spec)]["metadata"], spec


@pytest.mark.releases("0.29.0")
@pytest.mark.parametrize("flags", FLAGS)
def test_without_source_lines_o_parity_still_loads_plain_bytecode(release, flags):
    """Issue 20 item 3's children (parallel_state.py, config/vllm.py and the KDA
    builder's source lines unavailable): -O parity reads no source lines (its
    loader takes the plain .pyc, or reads the file itself), so every vLLM module
    the child imported still runs plain bytecode, those two included; the
    recompiling patch reads the fallback above."""
    ours = child(release, "no_source", flags)
    process = ours["process"]
    if flags == "plain":  # plain Python keeps vLLM's asserts: nothing to restore
        assert process["o_parity_mode"] == "plain" and process["plain_modules"] == []
        return
    assert process["o_parity"].startswith("applied (package"), process["o_parity"]
    for name in ("vllm.distributed.parallel_state", "vllm.config.vllm"):
        assert name in process["plain_modules"], process["plain_modules"]
    assert ours.kinds["kv_spec_merge"] == "applied"  # the others work as before


@pytest.mark.releases("0.33.0")
@pytest.mark.parametrize("flags", FLAGS)
def test_kda_not_needed_on_033(release, flags):
    ours, off = child(release, "on", flags), child(release, "off")
    assert ours.kinds["kda_overlong_rows"] == "not_needed", ours.states
    assert not ours["wrapped"]["build"]
    for spec in KDA_OVERLONG + KDA_WITHIN:
        o = kdas(ours)[key(spec)]
        assert not o["wrapped"] and "error" not in o, o  # upstream routes them itself
        assert o == kdas(off)[key(spec)], spec
    assert ours["kda"]["forced_state"] == "applied (toggled on)"
    for spec in KDA_OVERLONG + KDA_WITHIN:
        o = kdas(ours, "forced")[key(spec)]
        assert o["wrapped"] and o["metadata"] == kdas(off)[key(spec)]["metadata"], spec


# -- a failure inside the patches' own code ----------------------------------------


@pytest.mark.releases("0.29.0", "0.30.0")
@pytest.mark.parametrize("flags", FLAGS)
def test_router_failure_is_contained_and_logged_once(release, flags):
    """The router raises: logged once, naming what runs instead; vLLM's own
    build runs (its capacity ValueError, raised on vLLM's own source line: the
    recompiled build keeps the file's positions)."""
    run = child(release, "on", flags)
    kda = run["failures"]["kda_overlong_rows"]
    calls = kda["calls"]
    # within capacity: what vLLM's own build gives with the patch off (issue 30 item 4)
    assert kda["own_within"][0] == "ok" and calls[0::2] == [kda["own_within"]] * 3, kda
    for name, message, filename, line in calls[1::2]:
        assert (name, message) == ("ValueError", "KDA RecoverSSM speculative decode query "
                                   "length exceeds its activation capacity (9)")
        assert filename.endswith("vllm/models/kimi_k3/nvidia/kda_metadata.py")
        assert line == "raise ValueError("
    failures = [w for w in warning_lines(run.failures_stderr) if "kda_overlong_rows wrapper" in w]
    assert len(failures) == 1, run.failures_stderr
    assert "RuntimeError: injected failure in the patch code" in failures[0]
    assert "vLLM's own build runs on the unrouted rows" in failures[0]


@pytest.mark.releases("0.29.0")
def test_router_failure_strict_raises(release):
    run = child(release, "on", "O")  # the failures section runs it again in strict mode
    calls = run["failures"]["kda_overlong_rows_strict"]["calls"]
    assert [c[0] for c in calls[0::2]] == ["ok"] * 3
    assert [c[:2] for c in calls[1::2]] == [
        ["KimiHotfixError", "kda_overlong_rows wrapper failed: injected failure in the patch code"]
    ] * 3


@pytest.mark.releases("0.29.0")
@pytest.mark.parametrize("flags", FLAGS)
def test_capture_failure_keeps_vllms_own_plan(release, flags):
    run = child(release, "on", flags)
    result = run["failures"]["capture_workspace"]
    assert result["failing"][0] == "ok"
    assert result["failing"][1] == result["vllm_own"]  # vLLM's own (over-workspace) plan
    assert result["vllm_own"]["largest_mixed"] == 512
    failures = [w for w in warning_lines(run.failures_stderr) if "capture_workspace wrapper" in w]
    assert len(failures) == 1 and "vLLM's own capture plan is used" in failures[0]
    # a manager whose compilation_config cannot be swapped: contained, vLLM's own plan
    assert result["read_only"] == ["ok", result["vllm_own"]]
    # writes to the clamped view stay in the view
    writes = result["view_writes"]
    assert writes["view"] == [[4], 4] and writes["shared_sizes_same"] is True
    assert writes["shared_max"] != 4


@pytest.mark.releases("0.29.0")
@pytest.mark.parametrize("flags", FLAGS)
def test_vllms_own_exception_under_the_view_is_vllms(release, flags):
    """vLLM's own ``_init_candidates`` raises part-way (child_failures._vllm_raises):
    with the patch on, the same exception object reaches the caller, vLLM's code
    ran once (the same passes as unpatched), the plan it filled is kept, and
    nothing is counted against the patch."""
    run = child(release, "on", flags)
    result = run["failures"]["capture_workspace"]["vllm_raises"]
    patched, unpatched = result["patched"], result["unpatched"]
    assert unpatched["raised"] == "ValueError: raised by vLLM's own _init_candidates"
    assert unpatched["capture_modes"], unpatched  # vLLM had filled _capture_descs
    assert patched["raised_same_object"] is True, patched
    assert patched["raised"] == unpatched["raised"]
    assert patched["passes"] == unpatched["passes"], result
    assert patched["capture_modes"] == unpatched["capture_modes"], result
    assert patched["plan"][0] == unpatched["plan"][0], result
    assert patched["failures_counted"] == 0, patched


@pytest.mark.releases("0.29.0")
def test_wrapper_failures_show_in_the_state_and_the_line(release):
    """Each patch's own code failed on some calls (the failures section): the
    state counts them and names the first; the line says so, logged once more."""
    run = child(release, "on", "O")
    after = run["failures"]["states_after"]
    for name in ("kda_overlong_rows", "kv_spec_merge", "capture_workspace"):
        state = after[name]
        assert state["kind"] == "applied" and state["failures"] >= 2, state
        assert state["first_failure"].startswith("RuntimeError: injected failure"), state
        assert f"its code failed on {state['failures']} calls" in state["text"]
    (lines,) = summaries(run.stderr + run.failures_stderr).values()
    assert "its code failed (first: RuntimeError: injected failure" in lines[-1]
    assert sum("its code failed" in line for line in lines) <= 3  # once per patch, not per call


# -- the preflight probes, toggled off and on -----------------------------------------


@pytest.mark.releases("0.29.0", "0.30.0", "0.33.0")
@pytest.mark.parametrize("flags", FLAGS)
def test_probes_fail_exactly_where_the_shim_applies(release, flags):
    run = child(release, "on", flags)
    report = json.loads(run["check"]["stdout"])
    for entry in report["patches"]:
        if entry["name"] in ("kv_spec_merge", "o_parity"):
            continue
        applied = run.kinds[entry["name"]] == "applied"
        assert entry["without"]["ok"] is (not applied), entry
        assert entry["with"]["ok"] is True, entry
    capture = next(e for e in report["patches"] if e["name"] == "capture_workspace")
    for which, result in (("without", child(release, "off", flags)), ("with", run)):
        seed = plans(result)[key(SEED)]
        largest, workspace = seed["largest_mixed"], seed["workspace_tokens"]
        relation = "<=" if largest <= workspace else ">"
        assert capture[which]["detail"].startswith(
            f"largest mixed graph {largest} tokens {relation} workspace {workspace}")

"""RecoverSSM patches (issue 3) on the real vLLM 0.29.0, 0.30.0 and 0.33.0, on CPU.

capture_workspace (CudaGraphManager._init_candidates):
- 0.29.0 with the shim plans exactly what 0.30.0 (no shim) plans for the same
  config (``_capture_descs`` and the ``_candidates`` table), for several
  (max_num_seqs, k) shapes incl. the seed (48, 8), Hopper sizes up to 512, each
  CUDA-graph mode, LoRA cases, varlen decode and an explicit size list; the
  largest mixed graph fits the workspace; the operator's capture sizes read the
  same after; with RecoverSSM off, or a workspace above the sizes, the plan is
  the unpatched one; with KIMI_HOTFIX=0 the over-workspace plan reproduces.
- 0.30.0 / 0.33.0: "not needed: upstream fixed", not wrapped; forced, the plan
  is unchanged.

kda_overlong_rows (KimiK3KDAMetadataBuilder.build):
- 0.29.0 / 0.30.0 with the shim: batches with rows longer than k + 1 build the
  metadata 0.33.0 builds for the same input (counts and index tensors); batches
  within capacity build what the unpatched builder builds; with KIMI_HOTFIX=0
  every over-long batch raises the capacity ValueError.
- 0.29.0 / 0.30.0: the shim installs vLLM's build recompiled with an inline
  guard; without that file's source (bytecode only) it falls back to a wrapt
  wrapper that builds the same; a failure inside the router is logged once and
  leaves vLLM's own behaviour (strict mode raises).
- 0.33.0: "not needed", not wrapped; forced, every batch builds the same.

preflight(): with each patch undone it fails exactly where the shim says the
patch is needed; forced on, it passes.

Plain and -O. Every fact about vLLM comes from a subprocess of a real venv
(kimi_hotfix/probes/recoverssm.py): one per (release, flags, KIMI_HOTFIX*),
cached for the session; references come from the reference releases (0.30.0 for
the plan, 0.33.0 for the builder) without -O and with KIMI_HOTFIX=0.
"""

from __future__ import annotations

import json

import pytest

from conftest import REPO, VLLM_VERSION, hermetic_env, json_lines, run_python, venv_python

pytestmark = pytest.mark.vllm("0.29.0", "0.30.0", "0.33.0")

FLAGS = {"plain": [], "O": ["-O"]}
NOT_NEEDED = "not needed: upstream fixed"
SEED = {"max_num_seqs": 48, "num_spec": 8}


def dummy(num_reqs, num_tokens):
    """Query lengths of vLLM's dummy batch (InputBatch.make_dummy)."""
    base, extra = divmod(num_tokens, num_reqs)
    return [base] * (num_reqs - extra) + [base + 1] * extra


# (max_num_seqs, k): workspaces 432, 128, 320, 256, 500, 16 tokens (all below
# the 512 ceiling) and 576 (above it: nothing to clamp).
SHAPES = [(48, 8), (32, 3), (64, 4), (16, 15), (100, 4), (8, 1), (64, 8)]
PLANS = [{"max_num_seqs": s, "num_spec": k} for s, k in SHAPES] + [
    dict(SEED, cudagraph_mode="PIECEWISE"),
    dict(SEED, cudagraph_mode="FULL"),
    dict(SEED, cudagraph_mode="FULL_DECODE_ONLY"),
    dict(SEED, lora_capture_cases=[0, 1, 4]),
    dict(SEED, varlen_decode=True),
    dict(SEED, capture_sizes=[1, 2, 4, 8, 16, 32, 64, 128, 256, 400, 432, 448, 480, 512]),
]
PLANS_OFF = [dict(SEED, recoverssm=False), {"max_num_seqs": 32, "num_spec": 3,
                                            "recoverssm": False, "cudagraph_mode": "FULL"}]

KDA_OVERLONG = [
    # capture of the 512-token mixed graph: 16 rows of 10 and 32 rows of 11
    {"query_lens": dummy(48, 512)},
    # eager dummy batch above the capture limit (adaptive verification profiling)
    {"query_lens": [10] * 48},
    # 448 tokens: 32 rows of 9 stay speculative, 16 rows of 10 leave
    {"query_lens": dummy(48, 448)},
    # FULL capture passes draft = query_len - 1 for every row
    {"query_lens": [10, 10, 9, 9], "draft": [9, 9, 8, 8]},
    # real steps: speculative rows, a 12-token decode row, a prefill chunk
    {"query_lens": [9, 9, 9, 12, 20], "draft": [8, 8, 8, -1, -1],
     "is_prefilling": [False] * 4 + [True], "seq_lens": [109, 209, 309, 412, 20]},
    {"query_lens": [9, 12, 5, 1], "draft": [8, -1, 4, 0], "seq_lens": [50, 60, 70, 80]},
    {"query_lens": [12, 9, 9], "draft": [-1, 8, 8], "seq_lens": [30, 40, 50]},
    # another shape: k = 3, capacity 4
    {"query_lens": [4, 7, 2], "draft": [3, -1, 1], "seq_lens": [40, 50, 60],
     "num_spec": 3, "max_num_seqs": 32},
]
KDA_WITHIN = [
    {"query_lens": [9] * 48, "draft": [8] * 48, "seq_lens": [100] * 48},
    {"query_lens": dummy(48, 432)},
    {"query_lens": [9, 5, 1, 9], "draft": [8, 4, 0, 8], "seq_lens": [20, 30, 40, 50]},
    # a long prefill row is not a speculative row: the wrapper's slow path, no change
    {"query_lens": [9, 9, 20], "draft": [8, 8, -1], "is_prefilling": [False, False, True],
     "seq_lens": [50, 60, 20]},
    # FULL-graph padding rows
    {"query_lens": [9, 9, 0, 0], "draft": [8, 8, -1, -1], "seq_lens": [50, 60, 0, 0]},
    {"query_lens": [1] * 8, "seq_lens": [30] * 8},
    # RecoverSSM off: the wrapper must pass everything through
    {"query_lens": [10] * 4, "recoverssm": False},
]


def key(spec):
    return json.dumps(spec, sort_keys=True)  # the probe's case_key()


_RUNS: dict = {}


def probe(version, flags="plain", no_source=False, **env):
    """Everything the probe computes in one subprocess of ``version``'s venv.
    ``env``: KIMI_HOTFIX / KIMI_HOTFIX_FORCE. ``no_source``: inspect finds no
    source of kda_metadata.py (bytecode only). Cached for the session."""
    cache_key = (version, flags, no_source, tuple(sorted(env.items())))
    if cache_key not in _RUNS:
        args = ["-m", "kimi_hotfix.probes.recoverssm", "--preflight",
                "both" if not (env or no_source) else "none"]
        if no_source:
            args.append("--no-source")
        for spec in PLANS + PLANS_OFF:
            args += ["--plan", json.dumps(spec)]
        for spec in KDA_OVERLONG + KDA_WITHIN:
            args += ["--kda", json.dumps(spec)]
        proc = run_python(args, python=venv_python(version), flags=FLAGS[flags],
                          env=hermetic_env(**env), cwd=REPO)
        out = {(line["kind"], line["case"]): line["result"] for line in json_lines(proc.stdout)}
        state = out["state", "start"]
        assert state["vllm"] == version and state["optimize"] == len(FLAGS[flags]), state
        _RUNS[cache_key] = out
    return _RUNS[cache_key]


def unpatched(version, flags="plain"):
    return probe(version, flags, KIMI_HOTFIX="0")


def forced(version):
    return probe(version, KIMI_HOTFIX_FORCE="capture_workspace,kda_overlong_rows")


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


# -- capture_workspace ------------------------------------------------------------


@pytest.mark.vllm("0.29.0")
@pytest.mark.parametrize("flags", list(FLAGS))
def test_capture_plan_on_029_is_the_030_plan(flags):
    ours, ref, off = probe("0.29.0", flags), unpatched("0.30.0"), unpatched("0.29.0", flags)
    assert ours["state", "start"]["states"]["capture_workspace"] == "applied"
    assert ours["state", "start"]["wrapped"]["capture_workspace"] is True
    assert ref["state", "start"]["wrapped"]["capture_workspace"] is False
    assert off["state", "start"]["wrapped"]["capture_workspace"] is False
    for spec in PLANS:
        p, r, u = ours["plan", key(spec)], ref["plan", key(spec)], off["plan", key(spec)]
        assert p["wrapped"] and not r["wrapped"] and not u["wrapped"]
        assert p["capture_sizes"] == r["capture_sizes"] == u["capture_sizes"], spec  # same config
        assert plan_of(p) == plan_of(r), spec
        assert p["largest_mixed"] <= p["workspace_tokens"], spec
        assert_config_left_alone(p)
        # the comparison can fail: without the shim, 0.29.0 plans above the workspace
        if u["largest_mixed"] > u["workspace_tokens"]:
            assert plan_of(u) != plan_of(r), spec
    seed = off["plan", key(SEED)]
    assert max(seed["capture_sizes"]) == 512  # the seed: Hopper sizes up to 512
    assert seed["largest_mixed"] > seed["workspace_tokens"] == 432, seed["largest_mixed"]


@pytest.mark.vllm("0.29.0")
@pytest.mark.parametrize("flags", list(FLAGS))
def test_capture_plan_untouched_without_recoverssm_or_overflow(flags):
    ours, off = probe("0.29.0", flags), unpatched("0.29.0", flags)
    specs = PLANS_OFF + [s for s in PLANS if off["plan", key(s)]["largest_mixed"]
                         <= off["plan", key(s)]["workspace_tokens"]]
    assert len(specs) > len(PLANS_OFF)  # the 576-token workspace shape is among them
    for spec in specs:
        p, u = ours["plan", key(spec)], off["plan", key(spec)]
        assert p["wrapped"]
        assert plan_of(p) == plan_of(u), spec
        assert_config_left_alone(p)
    # RecoverSSM off: the mixed graphs above the workspace stay (vLLM's own plan)
    p = ours["plan", key(PLANS_OFF[0])]
    assert p["largest_mixed"] > p["workspace_tokens"]


@pytest.mark.vllm("0.30.0", "0.33.0")
@pytest.mark.parametrize("flags", list(FLAGS))
def test_capture_not_needed_where_upstream_fixed(flags):
    ours, off = probe(VLLM_VERSION, flags), unpatched(VLLM_VERSION)
    state = ours["state", "start"]
    assert state["states"]["capture_workspace"].startswith(NOT_NEEDED), state
    assert state["wrapped"]["capture_workspace"] is False
    for spec in PLANS + PLANS_OFF:
        p = ours["plan", key(spec)]
        assert not p["wrapped"]
        assert plan_of(p) == plan_of(off["plan", key(spec)]), spec
    # the shim's decision agrees with what this vLLM plans
    seed = ours["plan", key(SEED)]
    assert seed["largest_mixed"] <= seed["workspace_tokens"]


@pytest.mark.vllm("0.30.0", "0.33.0")
def test_capture_forced_where_upstream_fixed_changes_nothing():
    ours, off = forced(VLLM_VERSION), unpatched(VLLM_VERSION)
    state = ours["state", "start"]
    assert state["states"]["capture_workspace"].startswith("applied (forced"), state
    assert state["wrapped"]["capture_workspace"] is True
    for spec in PLANS + PLANS_OFF:
        p = ours["plan", key(spec)]
        assert p["wrapped"]
        assert plan_of(p) == plan_of(off["plan", key(spec)]), spec
        assert_config_left_alone(p)


# -- kda_overlong_rows ---------------------------------------------------------------


@pytest.mark.vllm("0.29.0", "0.30.0")
@pytest.mark.parametrize("flags", list(FLAGS))
def test_overlong_rows_build_what_033_builds(flags):
    ours, ref, off = probe(VLLM_VERSION, flags), unpatched("0.33.0"), unpatched(VLLM_VERSION, flags)
    assert ours["state", "start"]["states"]["kda_overlong_rows"] == "applied"
    assert ours["state", "start"]["wrapped"]["kda_overlong_rows"] is True
    # the recompiled build with the inline guard, not the wrapt fallback
    assert ours["state", "start"]["kda_build_kind"] == "inline"
    assert ref["state", "start"]["wrapped"]["kda_overlong_rows"] is False
    for spec in KDA_OVERLONG:
        o, r, u = ours["kda", key(spec)], ref["kda", key(spec)], off["kda", key(spec)]
        assert o["wrapped"] and not r["wrapped"] and not u["wrapped"]
        assert metadata(o) == metadata(r), spec
        assert same_extra(o, r), spec
        # KIMI_HOTFIX=0 in the same run: the startup crash reproduces
        capacity = spec.get("num_spec", 8) + 1
        assert u.get("error", "").startswith("ValueError: KDA RecoverSSM speculative decode"), u
        assert f"activation capacity ({capacity})" in u["error"]


@pytest.mark.vllm("0.29.0", "0.30.0")
@pytest.mark.parametrize("flags", list(FLAGS))
def test_within_capacity_builds_what_the_unpatched_builder_builds(flags):
    ours, off = probe(VLLM_VERSION, flags), unpatched(VLLM_VERSION, flags)
    for spec in KDA_WITHIN:
        o, u = ours["kda", key(spec)], off["kda", key(spec)]
        assert o["wrapped"] and not u["wrapped"]
        assert "error" not in u, u
        assert o["metadata"] == u["metadata"], spec


@pytest.mark.vllm("0.29.0", "0.30.0")
@pytest.mark.parametrize("flags", list(FLAGS))
def test_without_source_the_wrapt_fallback_builds_the_same(flags):
    """kda_metadata shipped as bytecode only: no source to recompile, so the
    shim decides by version and installs its wrapt wrapper; the metadata is
    the same."""
    ours, ref = probe(VLLM_VERSION, flags, no_source=True), unpatched("0.33.0")
    off = unpatched(VLLM_VERSION, flags)
    state = ours["state", "start"]
    assert state["states"]["kda_overlong_rows"] == (
        "applied (wrapt wrapper: source of KimiK3KDAMetadataBuilder.build unavailable "
        "(could not get source code (hidden by the probe)))"), state
    assert state["kda_build_kind"] == "wrapt"
    for spec in KDA_OVERLONG:
        o, r = ours["kda", key(spec)], ref["kda", key(spec)]
        assert metadata(o) == metadata(r), spec
        assert same_extra(o, r), spec
    for spec in KDA_WITHIN:
        assert ours["kda", key(spec)]["metadata"] == off["kda", key(spec)]["metadata"], spec


# An exception inside the patch's router, on the real builder: logged once,
# vLLM's own behaviour (the capacity ValueError, raised on vLLM's own source
# line: the recompiled build keeps the file's positions); strict mode raises.
BROKEN_ROUTER = r"""
import json, sys, traceback
from kimi_hotfix.patches import kda_overlong_rows as patch
from kimi_hotfix.probes import recoverssm as probe
from vllm.models.kimi_k3.nvidia import kda_metadata

def broken(*args):
    raise RuntimeError("injected failure in the router")

patch.route_overlong_rows = broken
builder = probe.make_builder(**probe.SEED)
calls = []
for i in range(6):
    batch = (([10] * 4,) if i % 2 else ([9] * 4, None, [8] * 4, [50] * 4))
    try:
        builder.build(*probe.build_args(*batch))
        calls.append(["ok"])
    except Exception as exc:
        last = traceback.extract_tb(exc.__traceback__)[-1]
        calls.append([type(exc).__name__, str(exc), last.filename == kda_metadata.__file__,
                      last.line])
print("KIMI_JSON:" + json.dumps({"calls": calls, "kind": probe._build_kind(
    vars(kda_metadata.KimiK3KDAMetadataBuilder)["build"])}))
"""


@pytest.mark.vllm("0.29.0", "0.30.0")
@pytest.mark.parametrize("flags", list(FLAGS))
@pytest.mark.parametrize("strict", [False, True], ids=["default", "strict"])
def test_router_failure_is_contained_and_logged_once(flags, strict):
    env = hermetic_env(KIMI_HOTFIX_STRICT="1" if strict else None)
    proc = run_python(["-c", BROKEN_ROUTER], python=venv_python(VLLM_VERSION),
                      flags=FLAGS[flags], env=env, cwd=REPO)
    out = json_lines(proc.stdout)[0]
    assert out["kind"] == "inline"
    within, overlong = out["calls"][0::2], out["calls"][1::2]
    assert within == [["ok"]] * 3
    if strict:
        assert [c[:2] for c in overlong] == [
            ["KimiHotfixError", "kda_overlong_rows wrapper failed: injected failure in the router"]
        ] * 3
    else:
        assert overlong == [["ValueError", "KDA RecoverSSM speculative decode query length "
                             "exceeds its activation capacity (9)", True,
                             'raise ValueError(']] * 3
    failures = [line for line in proc.stderr.splitlines() if "wrapper failed" in line]
    assert len(failures) == 1, proc.stderr
    assert "RuntimeError: injected failure in the router" in failures[0]


@pytest.mark.vllm("0.33.0")
@pytest.mark.parametrize("flags", list(FLAGS))
def test_kda_not_needed_on_033(flags):
    ours, off = probe("0.33.0", flags), unpatched("0.33.0")
    state = ours["state", "start"]
    assert state["states"]["kda_overlong_rows"].startswith(NOT_NEEDED), state
    assert state["wrapped"]["kda_overlong_rows"] is False
    for spec in KDA_OVERLONG + KDA_WITHIN:
        o = ours["kda", key(spec)]
        assert not o["wrapped"]
        assert o == off["kda", key(spec)], spec
        assert "error" not in o, o  # upstream routes over-long rows itself


@pytest.mark.vllm("0.33.0")
def test_kda_forced_on_033_changes_nothing():
    ours, off = forced("0.33.0"), unpatched("0.33.0")
    assert ours["state", "start"]["states"]["kda_overlong_rows"].startswith("applied (forced")
    for spec in KDA_OVERLONG + KDA_WITHIN:
        o = ours["kda", key(spec)]
        assert o["wrapped"]
        assert o["metadata"] == off["kda", key(spec)]["metadata"], spec


# -- preflight ---------------------------------------------------------------------------


@pytest.mark.parametrize("flags", list(FLAGS))
def test_preflight_fails_undone_exactly_where_needed_and_passes_forced(flags):
    run = probe(VLLM_VERSION, flags)
    states = run["state", "start"]["states"]
    undone = {e["patch"]: e for e in run["preflight", "undone"]}
    applied = {e["patch"]: e for e in run["preflight", "forced"]}
    for name in ("capture_workspace", "kda_overlong_rows"):
        needed = not states[name].startswith(NOT_NEEDED)
        assert undone[name]["ok"] is (not needed), (name, states[name], undone[name])
        assert applied[name]["ok"] is True, applied[name]
        assert undone[name]["probe"] and applied[name]["detail"]
    # the seed's numbers, as the check command shows them
    for detail, plan in ((undone["capture_workspace"]["detail"], unpatched(VLLM_VERSION)),
                         (applied["capture_workspace"]["detail"], run)):
        seed = plan["plan", key(SEED)]
        largest, workspace = seed["largest_mixed"], seed["workspace_tokens"]
        relation = "<=" if largest <= workspace else ">"
        assert detail.startswith(f"largest mixed graph {largest} tokens {relation} workspace "
                                 f"{workspace}"), detail
    for name in ("capture_workspace", "kda_overlong_rows"):
        assert run["state", "end"]["wrapped"][name] is True

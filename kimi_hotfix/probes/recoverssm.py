"""RecoverSSM probes: the installed vLLM's CUDA-graph capture plan and KDA
metadata builder, run for real on CPU (no GPU, no model weights).

Importing this module imports vLLM (set VLLM_TARGET_DEVICE=cpu first).

``capture_plan(...)`` builds a real ``CudaGraphManager`` and describes the plan
it made (``_capture_descs`` and the ``_candidates`` dispatch table) in
release-independent JSON; ``kda_build(...)`` builds a real
``KimiK3KDAMetadataBuilder`` and runs ``build`` on one batch; ``preflight()``
checks both bugs on the methods installed right now. The output of two releases
(or of one release with and without the shim) compares with ``==``.

    python [-O] -m kimi_hotfix.probes.recoverssm [--case NAME ...]
        [--plan JSON ...] [--kda JSON ...] [--preflight current|both]

prints one ``KIMI_JSON:{...}`` line per case, one for the process state
(version, -O, shim states, which methods are wrapped) and one per preflight,
so a single subprocess computes everything a test needs.

What is not the real vLLM here, and why (inputs only, never behaviour):
- ``CudaGraphManager.__init__`` asks ``get_pp_group()`` for its pipeline rank
  and the platform for a CUDA graph pool; both are stubbed during construction
  (one rank, no pool), as in the brief.
- The CPU platform turns CUDA graphs off, so the capture sizes are computed by
  vLLM's own ``VllmConfig._set_cudagraph_sizes`` after the mode is set back on.
  That method reads ``model_config.enforce_eager`` only, and there is no model:
  a stand-in with ``enforce_eager=False`` is in place for that one call.
  The default list is what vLLM computes for a Hopper GPU (capture ceiling 512).
- 0.33's ``GDNAttentionMetadataBuilder.__init__`` reads
  ``model_config.hf_text_config`` (head dims, for GPU prefill backends); an
  empty stand-in is in place for the constructor call only.
- ``build`` asks for the RecoverSSM commit context (GPU kernels bound to the
  model's KDA layers) whenever it returns speculative rows; the builder caches
  it in ``recoverssm_context``, which is pre-filled with a placeholder. It only
  ends up in the metadata's ``recoverssm_context`` field, which is not compared.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import sys
import types

import torch

JSON_MARK = "KIMI_JSON:"
SEED = {"max_num_seqs": 48, "num_spec": 8}  # the failing deployment: 48 x (1 + 8) = 432
DEFAULT_MODE = "FULL_AND_PIECEWISE"  # vLLM's default CUDA-graph mode on GPUs
DEVICE = torch.device("cpu")

# BatchExecutionDescriptor fields present in 0.29, 0.30 and 0.33. Any other
# field is serialized only when it is not at its default (0.30's num_ubatches).
DESC_FIELDS = ("cg_mode", "num_tokens", "num_reqs", "max_query_len", "uniform_token_count",
               "num_active_loras")

# KimiK3KDAMetadata fields compared across releases.
COUNT_FIELDS = ("num_spec_decodes", "num_spec_decode_tokens", "num_prefills",
                "num_prefill_tokens", "num_decodes", "num_decode_tokens", "num_actual_tokens")
TENSOR_FIELDS = ("spec_token_indx", "non_spec_token_indx", "spec_state_indices_tensor",
                 "non_spec_state_indices_tensor", "spec_query_start_loc",
                 "non_spec_query_start_loc", "num_accepted_tokens", "has_initial_state")
# Present in some releases only (0.30+): reported under "extra".
EXTRA_FIELDS = ("spec_token_start", "non_spec_token_start")


# -- configuration ------------------------------------------------------------


def vllm_config(max_num_seqs=48, num_spec=8, recoverssm=True, max_num_batched_tokens=8192,
                max_model_len=8192):
    """A real VllmConfig with an n-gram SpeculativeConfig for ``num_spec``
    draft tokens (it needs no draft model) and RecoverSSM on or off."""
    from vllm.config import SchedulerConfig, SpeculativeConfig, VllmConfig

    speculative = SpeculativeConfig(method="ngram", num_speculative_tokens=num_spec)
    scheduler = SchedulerConfig(
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max_num_batched_tokens,
        max_model_len=max_model_len,
        is_encoder_decoder=False,
    )
    config = VllmConfig(speculative_config=speculative, scheduler_config=scheduler)
    config.cache_config.use_kda_recoverssm = bool(recoverssm)
    return config


@contextlib.contextmanager
def _model_config_standin(config, **attrs):
    """``config.model_config`` reads as a namespace holding ``attrs`` (no model)."""
    saved = config.model_config
    config.model_config = types.SimpleNamespace(**attrs)
    try:
        yield
    finally:
        config.model_config = saved


def graph_mode(name):
    from vllm.config.compilation import CUDAGraphMode

    return name if isinstance(name, CUDAGraphMode) else CUDAGraphMode[str(name).upper()]


def set_capture_sizes(config, mode, sizes=None):
    """Turn CUDA graphs on in ``config`` and let vLLM size them, as a GPU would:
    ``sizes=None`` yields vLLM's default list (Hopper: up to 512 tokens); an
    explicit list goes through vLLM's handling of a user-given list."""
    compilation = config.compilation_config
    compilation.cudagraph_mode = mode
    compilation.max_cudagraph_capture_size = None
    compilation.cudagraph_capture_sizes = None if sizes is None else [int(s) for s in sizes]
    with _model_config_standin(config, enforce_eager=False):
        config._set_cudagraph_sizes()


@contextlib.contextmanager
def _cpu_graph_stubs():
    """The two things CudaGraphManager.__init__ asks of a GPU process."""
    from vllm.platforms import current_platform
    from vllm.v1.worker.gpu import cudagraph_utils

    single_rank = types.SimpleNamespace(is_first_rank=True, is_last_rank=True)
    saved_pp = cudagraph_utils.get_pp_group
    had_pool = "get_global_graph_pool" in vars(current_platform)
    saved_pool = vars(current_platform).get("get_global_graph_pool")
    cudagraph_utils.get_pp_group = lambda: single_rank
    current_platform.get_global_graph_pool = lambda: None
    try:
        yield
    finally:
        cudagraph_utils.get_pp_group = saved_pp
        if had_pool:
            current_platform.get_global_graph_pool = saved_pool
        else:
            del current_platform.get_global_graph_pool


def _wrapped(owner, attr):
    from kimi_hotfix import core

    return core.is_wrapped(vars(owner).get(attr))


# -- the capture plan ---------------------------------------------------------


def _desc(desc):
    row = [desc.cg_mode.name] + [getattr(desc, f) for f in DESC_FIELDS[1:]]
    extra = {}
    for field in dataclasses.fields(desc):
        value = getattr(desc, field.name)
        if field.name not in DESC_FIELDS and value != field.default:
            extra[field.name] = value if isinstance(value, (int, str, type(None))) else repr(value)
    if extra:
        row.append(extra)
    return row


def serialize_plan(manager):
    """``_capture_descs`` per mode (capture order) and the ``_candidates`` table.

    A descriptor is ``[cg_mode, num_tokens, num_reqs, max_query_len,
    uniform_token_count, num_active_loras]``. The table maps every
    ``(num_tokens, num_active_loras)`` key to a priority-ordered descriptor
    list; consecutive keys with the same list are one row ``[loras, first_tokens,
    last_tokens, [descriptor ids]]``, ids indexing ``descs``. Exact: the table
    can be rebuilt from it.
    """
    capture = {mode.name: [_desc(d) for d in descs]
               for mode, descs in manager._capture_descs.items()}
    descs, ids, rows = [], {}, []
    for loras, tokens in sorted((loras, tokens) for tokens, loras in manager._candidates):
        refs = []
        for d in manager._candidates[(tokens, loras)]:
            key = json.dumps(_desc(d))
            if key not in ids:
                ids[key] = len(descs)
                descs.append(_desc(d))
            refs.append(ids[key])
        last = rows[-1] if rows else None
        if last and last[0] == loras and last[2] == tokens - 1 and last[3] == refs:
            last[2] = tokens
        else:
            rows.append([loras, tokens, tokens, refs])
    return {
        "capture_descs": capture,
        "candidates": {"descs": descs, "ranges": rows, "keys": len(manager._candidates)},
    }


def _largest_mixed(manager, mode):
    """Tokens of the largest mixed-mode graph (no uniform decode, no varlen bound)."""
    mixed = mode.mixed_mode()
    if not mixed:
        return 0
    sizes = [
        d.num_tokens
        for d in manager._capture_descs.get(mixed, [])
        if d.uniform_token_count is None and d.max_query_len is None
    ]
    return max(sizes, default=0)


def capture_plan(max_num_seqs=48, num_spec=8, capture_sizes=None, recoverssm=True,
                 cudagraph_mode=DEFAULT_MODE, lora_capture_cases=None, varlen_decode=False):
    """Build a real CudaGraphManager (the main model's: decode query length
    1 + num_spec) and describe its plan; JSON-able."""
    import vllm
    from vllm.v1.worker.gpu.cudagraph_utils import CudaGraphManager

    mode = graph_mode(cudagraph_mode)
    config = vllm_config(max_num_seqs, num_spec, recoverssm)
    set_capture_sizes(config, mode, capture_sizes)
    compilation = config.compilation_config
    sizes = compilation.cudagraph_capture_sizes
    sizes_before = list(sizes)
    max_before = compilation.max_cudagraph_capture_size
    decode_query_len = getattr(config, "uniform_decode_query_len", 1 + num_spec)

    def build():
        return CudaGraphManager(
            config,
            DEVICE,
            mode,
            decode_query_len,
            lora_capture_cases=lora_capture_cases,
            varlen_decode=varlen_decode,
        )

    with _cpu_graph_stubs():
        manager = build()
        again = build()  # a second manager on the same (shared) config
    plan = serialize_plan(manager)
    largest = {name: max((d[1] for d in descs), default=0)
               for name, descs in plan["capture_descs"].items()}
    return {
        "vllm": vllm.__version__,
        "max_num_seqs": max_num_seqs,
        "num_spec": num_spec,
        "decode_query_len": decode_query_len,
        "recoverssm": bool(recoverssm),
        "cudagraph_mode": mode.name,
        "workspace_tokens": manager.max_num_reqs * manager.decode_query_len,
        "largest_mixed": _largest_mixed(manager, mode),
        "largest_by_mode": largest,
        "capture_sizes": sizes_before,
        "capture_sizes_after": list(compilation.cudagraph_capture_sizes),
        "capture_sizes_same_object": compilation.cudagraph_capture_sizes is sizes,
        "max_capture_size": max_before,
        "max_capture_size_after": compilation.max_cudagraph_capture_size,
        "manager_config_is_shared": manager.compilation_config is compilation,
        "second_manager_same_plan": serialize_plan(again) == plan,
        "wrapped": _wrapped(CudaGraphManager, "_init_candidates"),
        **plan,
    }


# -- the KDA metadata builder -------------------------------------------------


class CommitContextPlaceholder:
    """Stands for the RecoverSSM commit context (GPU kernels over the model's
    KDA layers); build() only passes it through to the metadata."""

    def __repr__(self):
        return "<RecoverSSM commit context placeholder>"


def make_builder(max_num_seqs=48, num_spec=8, recoverssm=True, block_size=16):
    """A real KimiK3KDAMetadataBuilder for one KDA layer, on CPU."""
    from vllm.models.kimi_k3.nvidia.kda_metadata import KimiK3KDAMetadataBuilder
    from vllm.v1.kv_cache_interface import MambaSpec

    config = vllm_config(max_num_seqs, num_spec, recoverssm)
    spec = MambaSpec(block_size=block_size, shapes=((4, 4),), dtypes=(torch.float32,))
    with _model_config_standin(config, hf_text_config=types.SimpleNamespace()):
        builder = KimiK3KDAMetadataBuilder(spec, ["model.layers.0.self_attn.kda"], config, DEVICE)
    builder.recoverssm_context = CommitContextPlaceholder()
    return builder


def dummy_query_lens(num_reqs, num_tokens):
    """Query lengths of vLLM's dummy batch (InputBatch.make_dummy): the
    remainder goes one token each to the last rows."""
    base, extra = divmod(num_tokens, num_reqs)
    return [base] * (num_reqs - extra) + [base + 1] * extra


def make_metadata(query_lens, is_prefilling=None, seq_lens=None, block_cols=4):
    """A CommonAttentionMetadata for one batch; row i's state blocks are
    10 * i + 1, 10 * i + 2, ... so the index tensors show which rows went where."""
    from vllm.v1.attention.backend import CommonAttentionMetadata

    n = len(query_lens)
    qsl = torch.zeros(n + 1, dtype=torch.int32)
    qsl[1:] = torch.tensor(query_lens, dtype=torch.int32).cumsum(0)
    seq = torch.tensor(seq_lens if seq_lens is not None else query_lens, dtype=torch.int32)
    blocks = (torch.arange(n, dtype=torch.int32) * 10 + 1)[:, None] + torch.arange(
        block_cols, dtype=torch.int32
    )
    prefilling = is_prefilling if is_prefilling is not None else [False] * n
    tokens = int(qsl[-1])
    return CommonAttentionMetadata(
        query_start_loc=qsl,
        query_start_loc_cpu=qsl.clone(),
        seq_lens=seq,
        num_reqs=n,
        num_actual_tokens=tokens,
        max_query_len=max(query_lens),
        max_seq_len=int(seq.max()),
        block_table_tensor=blocks,
        slot_mapping=torch.arange(tokens, dtype=torch.int64),
        is_prefilling=torch.tensor(prefilling, dtype=torch.bool),
        seq_lens_cpu_upper_bound=seq.clone(),
    )


def build_args(query_lens, is_prefilling=None, draft=None, seq_lens=None, num_accepted=None):
    """Positional arguments of ``build`` for one batch. ``draft`` defaults to
    -1 for every row, as the runner passes for dummy and eager probe batches."""
    n = len(query_lens)
    metadata = make_metadata(query_lens, is_prefilling, seq_lens)
    accepted = torch.tensor(num_accepted if num_accepted is not None else [1] * n,
                            dtype=torch.int32)
    drafts = torch.tensor(draft if draft is not None else [-1] * n, dtype=torch.int32)
    return (0, metadata, accepted, drafts)


def _plain(value):
    if isinstance(value, torch.Tensor):
        return value.tolist()
    return value


def serialize_metadata(md):
    out = {f: _plain(getattr(md, f)) for f in COUNT_FIELDS + TENSOR_FIELDS}
    commit = getattr(md, "recoverssm_commit", None)
    out["recoverssm_commit"] = None if commit is None else {
        "state_indices": _plain(commit.state_indices),
        "query_start_loc": _plain(commit.query_start_loc),
        "request_indices": _plain(commit.request_indices),
    }
    out["extra"] = {f: _plain(getattr(md, f)) for f in EXTRA_FIELDS if hasattr(md, f)}
    return out


def kda_build(query_lens, is_prefilling=None, draft=None, seq_lens=None, num_accepted=None,
              max_num_seqs=48, num_spec=8, recoverssm=True, builder=None):
    """Run the real builder's ``build`` on one batch: {"metadata": {...}} or
    {"error": "ValueError: ..."}; plus the wrapped state of ``build``."""
    from vllm.models.kimi_k3.nvidia.kda_metadata import KimiK3KDAMetadataBuilder

    if builder is None:
        builder = make_builder(max_num_seqs, num_spec, recoverssm)
    args = build_args(query_lens, is_prefilling, draft, seq_lens, num_accepted)
    result = {"wrapped": _wrapped(KimiK3KDAMetadataBuilder, "build")}
    try:
        result["metadata"] = serialize_metadata(builder.build(*args))
    except Exception as exc:
        result["error"] = f"{type(exc).__name__}: {exc}"
    return result


# -- named cases ----------------------------------------------------------------

PLANS = {
    "seed": dict(SEED),
    "seed-off": dict(SEED, recoverssm=False),
    "seed-piecewise": dict(SEED, cudagraph_mode="PIECEWISE"),
    "seed-full": dict(SEED, cudagraph_mode="FULL"),
}

KDAS = {
    # what capturing the 512-token mixed graph builds: 48 rows of 10/11 tokens
    "capture-dummy-512": {"query_lens": dummy_query_lens(48, 512)},
    # an eager dummy batch above the capture limit (adaptive verification profiling)
    "eager-48x10": {"query_lens": [10] * 48},
    # a real step: 3 speculative rows, one 12-token decode row, one prefill chunk
    "mixed-12-token-row": {
        "query_lens": [9, 9, 9, 12, 20],
        "draft": [8, 8, 8, -1, -1],
        "is_prefilling": [False, False, False, False, True],
        "seq_lens": [109, 209, 309, 412, 20],
    },
    # within capacity: the seed's steady state, 48 rows of 1 + 8 tokens
    "spec-48x9": {"query_lens": [9] * 48, "draft": [8] * 48, "seq_lens": [100] * 48},
}


def run_case(kind, spec):
    if kind == "plan":
        return capture_plan(**spec)
    return kda_build(**spec)


# -- preflight ------------------------------------------------------------------


def _preflight_capture():
    probe = ("capture plan for 48 seqs, k=8, Hopper capture sizes (to 512): "
             "largest mixed graph vs RecoverSSM workspace")
    try:
        plan = capture_plan(**SEED)
    except Exception as exc:
        return {"patch": "capture_workspace", "probe": probe, "ok": False,
                "detail": f"probe failed: {type(exc).__name__}: {exc}"}
    largest, workspace = plan["largest_mixed"], plan["workspace_tokens"]
    ok = largest <= workspace
    detail = (f"largest mixed graph {largest} tokens {'<=' if ok else '>'} workspace {workspace} "
              f"(48 x (1 + 8)); {len(plan['capture_sizes'])} capture sizes up to "
              f"{max(plan['capture_sizes'], default=0)}")
    return {"patch": "capture_workspace", "probe": probe, "ok": ok, "detail": detail}


def _preflight_kda():
    probe = "KDA build with RecoverSSM, k=8: 48x10-token eager batch and a step with a 12-token row"
    try:
        builder = make_builder(**SEED)
        parts, ok = [], True
        for name in ("eager-48x10", "mixed-12-token-row"):
            result = kda_build(builder=builder, **KDAS[name])
            if "error" in result:
                ok = False
                parts.append(f"{name}: {result['error']}")
            else:
                md = result["metadata"]
                parts.append(
                    f"{name}: {md['num_spec_decodes']} spec rows, "
                    f"{md['num_prefills']} prefill rows ({md['num_prefill_tokens']} tokens)"
                )
    except Exception as exc:
        return {"patch": "kda_overlong_rows", "probe": probe, "ok": False,
                "detail": f"probe failed: {type(exc).__name__}: {exc}"}
    return {"patch": "kda_overlong_rows", "probe": probe, "ok": ok, "detail": "; ".join(parts)}


def preflight():
    """One {"patch", "probe", "ok", "detail"} per patch, on the methods installed
    now. ok: vLLM behaves correctly (the bug does not show)."""
    return [_preflight_capture(), _preflight_kda()]


# -- command line -----------------------------------------------------------------


def state():
    """Version, -O, shim states and which methods are wrapped (imports the
    target modules first, so the shim's hooks have run)."""
    import vllm
    from vllm.models.kimi_k3.nvidia.kda_metadata import KimiK3KDAMetadataBuilder
    from vllm.v1.worker.gpu.cudagraph_utils import CudaGraphManager

    from kimi_hotfix import core

    return {
        "vllm": vllm.__version__,
        "optimize": sys.flags.optimize,
        "states": core.states(),
        "wrapped": {
            "capture_workspace": _wrapped(CudaGraphManager, "_init_candidates"),
            "kda_overlong_rows": _wrapped(KimiK3KDAMetadataBuilder, "build"),
        },
        # how the builder's build is installed: vllm (untouched), inline (the
        # recompiled build with the guard) or wrapt (the fallback wrapper)
        "kda_build_kind": _build_kind(vars(KimiK3KDAMetadataBuilder)["build"]),
    }


def _build_kind(obj):
    from kimi_hotfix import core

    if not core.is_wrapped(obj):
        return "vllm"
    return "inline" if type(obj) is types.FunctionType else "wrapt"  # wrapt proxies __class__


def hide_sources(relative="models/kimi_k3/nvidia/kda_metadata.py"):
    """Make ``inspect`` fail to find the source of vLLM's ``relative`` file, as
    where an image ships that module as bytecode only (the shim must fall back
    to its wrapt wrapper and version check). Only that file: vLLM itself reads
    the source of other modules at import (jit_warmup), so a wholly
    bytecode-only vLLM does not start."""
    import importlib.util
    import inspect
    import os

    vllm_dir = list(importlib.util.find_spec("vllm").submodule_search_locations)[0]
    hidden = os.path.realpath(os.path.join(vllm_dir, relative))
    original = inspect.getsourcelines

    def getsourcelines(obj):
        try:
            filename = inspect.getfile(obj)
        except TypeError:
            filename = ""
        if os.path.realpath(filename) == hidden:
            raise OSError("could not get source code (hidden by the probe)")
        return original(obj)

    inspect.getsourcelines = getsourcelines


def emit(kind, case, result):
    print(JSON_MARK + json.dumps({"kind": kind, "case": case, "result": result}, sort_keys=True),
          flush=True)


def case_key(spec):
    """The ``case`` of a --plan/--kda line: its spec as canonical JSON."""
    return json.dumps(spec, sort_keys=True)


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m kimi_hotfix.probes.recoverssm")
    parser.add_argument("--case", action="append", default=[],
                        help=f"named case: {', '.join(list(PLANS) + list(KDAS))}, or all")
    parser.add_argument("--plan", action="append", default=[], help="capture_plan kwargs as JSON")
    parser.add_argument("--kda", action="append", default=[], help="kda_build kwargs as JSON")
    parser.add_argument("--preflight", choices=("none", "current", "both"), default=None,
                        help="current: on the methods as installed; both: each patch undone, "
                             "then forced on (default: current, unless cases are given)")
    parser.add_argument("--no-source", action="store_true",
                        help="hide the source of kda_metadata.py from inspect (bytecode only)")
    args = parser.parse_args(argv)
    if args.no_source:
        hide_sources()
    emit("state", "start", state())
    names = list(PLANS) + list(KDAS) if "all" in args.case or not (
        args.case or args.plan or args.kda) else args.case
    for name in names:
        if name in PLANS:
            emit("plan", name, run_case("plan", PLANS[name]))
        elif name in KDAS:
            emit("kda", name, run_case("kda", KDAS[name]))
        elif name != "all":
            parser.error(f"unknown case {name!r}")
    for kind, specs in (("plan", args.plan), ("kda", args.kda)):
        for text in specs:
            spec = json.loads(text)
            emit(kind, case_key(spec), run_case(kind, spec))
    mode = args.preflight or ("current" if not (args.case or args.plan or args.kda) else "none")
    if mode == "current":
        emit("preflight", "current", preflight())
    elif mode == "both":
        from kimi_hotfix import core

        for name in ("capture_workspace", "kda_overlong_rows"):
            core.undo(name)
        emit("preflight", "undone", preflight())
        for name in ("capture_workspace", "kda_overlong_rows"):
            core.force(name)
        emit("preflight", "forced", preflight())
        emit("state", "end", state())
    return 0


if __name__ == "__main__":
    sys.exit(main())

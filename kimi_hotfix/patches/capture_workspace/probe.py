"""capture_workspace's probe: the installed vLLM's CUDA-graph capture plan, for real.

Importing this module imports torch; ``capture_plan`` imports vLLM. It builds a
real ``CudaGraphManager`` (the main model's, decode query length 1 + k) with the
stubs of ``kimi_hotfix.patches._recoverssm`` and describes the plan it made
(``_capture_descs`` and the ``_candidates`` dispatch table) in release-
independent JSON, so that two releases, or one release with and without the
patch, compare with ``==``. ``run()`` is the preflight probe: the seed's largest
mixed graph against RecoverSSM's workspace.
"""

from __future__ import annotations

import dataclasses
import json

from kimi_hotfix.patches import _recoverssm as probing
from kimi_hotfix.runtime.patching import ProbeResult

DEFAULT_MODE = "FULL_AND_PIECEWISE"  # vLLM's default CUDA-graph mode on GPUs
# BatchExecutionDescriptor fields present in 0.29, 0.30 and 0.33. Any other
# field is serialized only when it is not at its default (0.30's num_ubatches).
DESC_FIELDS = ("cg_mode", "num_tokens", "num_reqs", "max_query_len", "uniform_token_count",
               "num_active_loras")


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
    """Build a real CudaGraphManager and describe its plan; JSON-able."""
    import vllm
    from vllm.v1.worker.gpu.cudagraph_utils import CudaGraphManager

    mode = probing.graph_mode(cudagraph_mode)
    config = probing.vllm_config(max_num_seqs, num_spec, recoverssm)
    probing.set_capture_sizes(config, mode, capture_sizes)
    compilation = config.compilation_config
    sizes = compilation.cudagraph_capture_sizes
    sizes_before = list(sizes)
    max_before = compilation.max_cudagraph_capture_size
    decode_query_len = getattr(config, "uniform_decode_query_len", 1 + num_spec)

    def build():
        return CudaGraphManager(config, probing.device(), mode, decode_query_len,
                                lora_capture_cases=lora_capture_cases, varlen_decode=varlen_decode)

    with probing.cpu_graph_stubs():
        manager = build()
        again = build()  # a second manager on the same (shared) config
    plan = serialize_plan(manager)
    return {
        "vllm": vllm.__version__,
        "max_num_seqs": max_num_seqs,
        "num_spec": num_spec,
        "decode_query_len": decode_query_len,
        "recoverssm": bool(recoverssm),
        "cudagraph_mode": mode.name,
        "workspace_tokens": manager.max_num_reqs * manager.decode_query_len,
        "largest_mixed": _largest_mixed(manager, mode),
        "capture_sizes": sizes_before,
        "capture_sizes_after": list(compilation.cudagraph_capture_sizes),
        "capture_sizes_same_object": compilation.cudagraph_capture_sizes is sizes,
        "max_capture_size": max_before,
        "max_capture_size_after": compilation.max_cudagraph_capture_size,
        "manager_config_is_shared": manager.compilation_config is compilation,
        "second_manager_same_plan": serialize_plan(again) == plan,
        "wrapped": probing.wrapped(CudaGraphManager, "_init_candidates"),
        **plan,
    }


def run() -> ProbeResult:
    """The seed deployment's plan (48 seqs, k = 8, Hopper capture sizes up to 512):
    does any mixed-mode graph exceed RecoverSSM's workspace?"""
    if not probing.has_recoverssm():
        return ProbeResult(ok=True, affected=False,
                           detail="this vLLM has no RecoverSSM (no cache_config.use_kda_recoverssm)")
    plan = capture_plan(**probing.SEED)
    largest, workspace = plan["largest_mixed"], plan["workspace_tokens"]
    ok = largest <= workspace
    detail = (f"largest mixed graph {largest} tokens {'<=' if ok else '>'} workspace {workspace} "
              f"(48 x (1 + 8)); {len(plan['capture_sizes'])} capture sizes up to "
              f"{max(plan['capture_sizes'], default=0)}")
    return ProbeResult(ok=ok, detail=detail, cases={"largest mixed graph": f"{largest} tokens"})

"""kda_overlong_rows's probe: the installed vLLM's KimiK3KDAMetadataBuilder, for real.

Importing this module imports torch; its functions import vLLM. ``kda_build``
builds a real ``KimiK3KDAMetadataBuilder`` for one KDA layer on the CPU (with
the stand-ins of ``kimi_hotfix.patches._recoverssm``) and runs ``build`` on one batch,
described in release-independent JSON. ``build`` asks for the RecoverSSM commit
context (GPU kernels bound to the model's KDA layers) whenever it returns
speculative rows; the builder caches it in ``recoverssm_context``, which is
pre-filled with a placeholder that only ends up in the metadata (not compared).
``run()`` is the preflight probe: an eager 48 x 10-token batch and a step with
one 12-token decode row, k = 8.
"""

from __future__ import annotations

import types

import torch

from kimi_hotfix.patches import _recoverssm as probing
from kimi_hotfix.runtime.patching import ProbeResult

# KimiK3KDAMetadata fields compared across releases.
COUNT_FIELDS = ("num_spec_decodes", "num_spec_decode_tokens", "num_prefills",
                "num_prefill_tokens", "num_decodes", "num_decode_tokens", "num_actual_tokens")
TENSOR_FIELDS = ("spec_token_indx", "non_spec_token_indx", "spec_state_indices_tensor",
                 "non_spec_state_indices_tensor", "spec_query_start_loc",
                 "non_spec_query_start_loc", "num_accepted_tokens", "has_initial_state")
# Present in some releases only (0.30+): reported under "extra".
EXTRA_FIELDS = ("spec_token_start", "non_spec_token_start")


class CommitContextPlaceholder:
    """Stands for the RecoverSSM commit context (GPU kernels over the model's
    KDA layers); build() only passes it through to the metadata."""

    def __repr__(self):
        return "<RecoverSSM commit context placeholder>"


def make_builder(max_num_seqs=48, num_spec=8, recoverssm=True, block_size=16):
    """A real KimiK3KDAMetadataBuilder for one KDA layer, on CPU."""
    from vllm.models.kimi_k3.nvidia.kda_metadata import KimiK3KDAMetadataBuilder
    from vllm.v1.kv_cache_interface import MambaSpec

    config = probing.vllm_config(max_num_seqs, num_spec, recoverssm)
    spec = MambaSpec(block_size=block_size, shapes=((4, 4),), dtypes=(torch.float32,))
    with probing.model_config_standin(config, hf_text_config=types.SimpleNamespace()):
        builder = KimiK3KDAMetadataBuilder(spec, ["model.layers.0.self_attn.kda"], config,
                                           probing.device())
    builder.recoverssm_context = CommitContextPlaceholder()
    return builder


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


def serialize_metadata(md):
    out = {f: probing.plain(getattr(md, f)) for f in COUNT_FIELDS + TENSOR_FIELDS}
    commit = getattr(md, "recoverssm_commit", None)
    out["recoverssm_commit"] = None if commit is None else {
        "state_indices": probing.plain(commit.state_indices),
        "query_start_loc": probing.plain(commit.query_start_loc),
        "request_indices": probing.plain(commit.request_indices),
    }
    out["extra"] = {f: probing.plain(getattr(md, f)) for f in EXTRA_FIELDS if hasattr(md, f)}
    return out


def kda_build(query_lens, is_prefilling=None, draft=None, seq_lens=None, num_accepted=None,
              max_num_seqs=48, num_spec=8, recoverssm=True, builder=None):
    """Run the real builder's ``build`` on one batch: {"metadata": {...}} or
    {"error": "ValueError: ..."}; plus the wrapped state of ``build``."""
    from vllm.models.kimi_k3.nvidia.kda_metadata import KimiK3KDAMetadataBuilder

    if builder is None:
        builder = make_builder(max_num_seqs, num_spec, recoverssm)
    args = build_args(query_lens, is_prefilling, draft, seq_lens, num_accepted)
    result = {"wrapped": probing.wrapped(KimiK3KDAMetadataBuilder, "build")}
    try:
        result["metadata"] = serialize_metadata(builder.build(*args))
    except Exception as exc:
        result["error"] = f"{type(exc).__name__}: {exc}"
    return result



CASES = {
    # an eager dummy batch above the capture limit (adaptive verification profiling)
    "eager-48x10": {"query_lens": [10] * 48},
    # a real step: 3 speculative rows, one 12-token decode row, one prefill chunk
    "mixed-12-token-row": {
        "query_lens": [9, 9, 9, 12, 20],
        "draft": [8, 8, 8, -1, -1],
        "is_prefilling": [False, False, False, False, True],
        "seq_lens": [109, 209, 309, 412, 20],
    },
}


def run() -> ProbeResult:
    """Does the builder, as installed now, build over-long rows instead of raising?"""
    if not probing.has_recoverssm():
        return ProbeResult(ok=True, affected=False,
                           detail="this vLLM has no RecoverSSM (no cache_config.use_kda_recoverssm)")
    builder = make_builder(**probing.SEED)
    if not getattr(builder, "use_recoverssm", False):
        return ProbeResult(ok=True, affected=False,
                           detail="this vLLM's KDA builder has no RecoverSSM path")
    cases, failed = {}, []
    for name, spec in CASES.items():
        result = kda_build(builder=builder, **spec)
        if "error" in result:
            failed.append(f"{name}: {result['error']}")
            cases[name] = result["error"]
        else:
            md = result["metadata"]
            cases[name] = (f"{md['num_spec_decodes']} spec rows, {md['num_prefills']} prefill "
                           f"rows ({md['num_prefill_tokens']} tokens)")
    detail = (f"{len(failed)} of {len(CASES)} batches raise: {failed[0]}" if failed
              else "over-long rows take the non-speculative path")
    return ProbeResult(ok=not failed, detail=detail, cases=cases)

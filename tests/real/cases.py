"""The inputs every real-vLLM child computes (imported by child.py and the tests).

Plain data only: no vLLM, no torch. Keys of plans and batches are their specs as
canonical JSON (``key(spec)``), so a test finds a case in any child's output.
"""

from __future__ import annotations

import json

from kimi_hotfix.runtime import registry  # the shim is on every child's PYTHONPATH

PATCHES = registry.names()
TARGETS = tuple(patch.target for patch in registry.patches().values())

SEED = {"max_num_seqs": 48, "num_spec": 8}
CAPABILITY = "non_causal_multi_token_decode"


def key(spec) -> str:
    return json.dumps(spec, sort_keys=True)


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
    # a long prefill row is not a speculative row: the router runs, nothing moves
    {"query_lens": [9, 9, 20], "draft": [8, 8, -1], "is_prefilling": [False, False, True],
     "seq_lens": [50, 60, 20]},
    # FULL-graph padding rows
    {"query_lens": [9, 9, 0, 0], "draft": [8, 8, -1, -1], "seq_lens": [50, 60, 0, 0]},
    {"query_lens": [1] * 8, "seq_lens": [30] * 8},
    # RecoverSSM off: everything passes through
    {"query_lens": [10] * 4, "recoverssm": False},
]

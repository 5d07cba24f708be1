# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""KV cache spec merges must check the same under ``python -O`` as without it.

``python -O`` strips ``assert`` statements. The spec merges guard their inputs
and the planner (``is_kv_cache_spec_uniform``,
``_get_kv_cache_groups_uniform_page_size``) relies on them raising
``AssertionError`` to tell incompatible specs apart, so a bare ``assert`` in a
merge lets ``-O`` merge MLA specs with different cache dtypes (the value kept
then depends on ``PYTHONHASHSEED``) or crash with ``AttributeError`` when MLA
and Mamba layers are planned together. The checks run in child interpreters,
since pytest's own process does not run optimized.
"""

import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.cpu_test

# Prints one JSON object: the outcome of every merge case and the planner's
# grouping of a few layer sets. Contains no ``assert``: it runs under -O.
_CHILD = r"""
import json
from dataclasses import replace
from types import SimpleNamespace

import torch

from vllm.config import CacheConfig
from vllm.v1.core.kv_cache_planning import (
    get_kv_cache_groups,
    is_kv_cache_spec_uniform,
)
from vllm.v1.kv_cache_interface import (
    FullAttentionSpec,
    MambaSpec,
    MLAAttentionSpec,
    RSWASpec,
    SinkFullAttentionSpec,
    SlidingWindowMLASpec,
)

full = FullAttentionSpec(
    block_size=16, num_kv_heads=2, head_size=64, dtype=torch.bfloat16
)
mla = MLAAttentionSpec(
    block_size=16, num_kv_heads=1, head_size=576, dtype=torch.bfloat16
)
draft = replace(mla, non_causal_multi_token_decode=True)
mamba = MambaSpec(
    block_size=16,
    shapes=((2, 512), (3, 32, 32)),
    dtypes=(torch.float32, torch.float32),
    page_size_padded=mla.page_size_bytes,
)
swa_mla = SlidingWindowMLASpec(
    block_size=16,
    num_kv_heads=1,
    head_size=576,
    dtype=torch.bfloat16,
    sliding_window=128,
)
rswa = RSWASpec(
    block_size=16,
    num_kv_heads=2,
    head_size=64,
    dtype=torch.bfloat16,
    rswa_window=256,
)
sink = SinkFullAttentionSpec(
    block_size=16, num_kv_heads=2, head_size=64, dtype=torch.bfloat16, sink_len=4
)

MERGES = {
    "full": (FullAttentionSpec, [full, full]),
    "full_head_size": (FullAttentionSpec, [full, replace(full, head_size=128)]),
    "full_mla": (FullAttentionSpec, [full, mla]),
    "full_mamba": (FullAttentionSpec, [full, mamba]),
    "full_window_and_chunk": (
        FullAttentionSpec,
        [replace(full, sliding_window=64), replace(full, attention_chunk_size=64)],
    ),
    "mla_draft": (MLAAttentionSpec, [mla, draft]),
    "mla_cache_dtype_str": (
        MLAAttentionSpec,
        [
            replace(mla, cache_dtype_str="auto"),
            replace(mla, cache_dtype_str="bfloat16"),
        ],
    ),
    "mla_head_size": (MLAAttentionSpec, [mla, replace(mla, head_size=512)]),
    "mla_mamba": (MLAAttentionSpec, [mla, mamba]),
    "mla_full": (MLAAttentionSpec, [mla, full]),
    "swa_mla_window": (
        SlidingWindowMLASpec,
        [swa_mla, replace(swa_mla, sliding_window=256)],
    ),
    "swa_mla_dcp_sharded": (
        SlidingWindowMLASpec,
        [swa_mla, replace(swa_mla, dcp_sharded=False)],
    ),
    "swa_mla_max_tp_shards": (
        SlidingWindowMLASpec,
        [swa_mla, replace(swa_mla, max_tp_shards=2)],
    ),
    "swa_mla_mla": (SlidingWindowMLASpec, [swa_mla, mla]),
    "rswa_window": (RSWASpec, [rswa, replace(rswa, rswa_window=512)]),
    "rswa_full": (RSWASpec, [rswa, full]),
    "rswa_head_size": (RSWASpec, [rswa, replace(rswa, head_size=128)]),
    "sink_head_size": (SinkFullAttentionSpec, [sink, replace(sink, head_size=128)]),
    "sink_mla": (SinkFullAttentionSpec, [sink, mla]),
}

LAYER_SETS = {
    "mla_target_draft": {
        **{f"model.layers.{i}.attn": mla for i in range(4)},
        **{f"drafter.layers.{i}.attn": draft for i in range(2)},
    },
    "mla_before_mamba": {
        **{f"model.layers.{i}.attn": mla for i in (3, 7)},
        **{f"model.layers.{i}.linear_attn": mamba for i in (0, 1, 2, 4, 5, 6)},
    },
    "mla_cache_dtype_str": {
        **{
            f"model.layers.{i}.attn": replace(mla, cache_dtype_str="auto")
            for i in range(2)
        },
        **{
            f"model.layers.{i}.attn": replace(mla, cache_dtype_str="bfloat16")
            for i in range(2, 4)
        },
    },
}


def outcome(fn, *args):
    try:
        return repr(fn(*args))
    except Exception as e:
        return f"{type(e).__name__}: {e}"


def groups(specs):
    cache_config = CacheConfig()
    cache_config.kv_cache_layout = "LBNHC"
    config = SimpleNamespace(
        scheduler_config=SimpleNamespace(disable_hybrid_kv_cache_manager=False),
        speculative_config=None,
        cache_config=cache_config,
    )
    return [
        (group.layer_names, group.kv_cache_spec)
        for group in get_kv_cache_groups(config, dict(specs))
    ]


result = {
    "merge": {name: outcome(cls.merge, specs) for name, (cls, specs) in MERGES.items()},
    "uniform": {
        name: outcome(is_kv_cache_spec_uniform, dict(specs))
        for name, specs in LAYER_SETS.items()
    },
    "groups": {name: outcome(groups, specs) for name, specs in LAYER_SETS.items()},
}
print(json.dumps(result))
"""

# Merges whose specs are incompatible: each must raise AssertionError, which
# is what the planner catches.
INCOMPATIBLE = [
    "full_head_size",
    "full_mla",
    "full_mamba",
    "full_window_and_chunk",
    "mla_cache_dtype_str",
    "mla_head_size",
    "mla_mamba",
    "mla_full",
    "swa_mla_window",
    "swa_mla_dcp_sharded",
    "swa_mla_max_tp_shards",
    "swa_mla_mla",
    "rswa_window",
    "rswa_full",
    "rswa_head_size",
    "sink_head_size",
    "sink_mla",
]


def _run_child(flags: list[str], hash_seed: int) -> dict:
    env = dict(os.environ, PYTHONHASHSEED=str(hash_seed))
    env.pop("PYTHONOPTIMIZE", None)
    proc = subprocess.run(
        [sys.executable, *flags, "-c", _CHILD],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def reference() -> dict:
    return _run_child([], hash_seed=0)


def test_incompatible_specs_raise_assertion_error(reference):
    for name in INCOMPATIBLE:
        assert reference["merge"][name].startswith("AssertionError"), name
    assert reference["merge"]["mla_draft"].startswith("MLAAttentionSpec(")
    assert "non_causal_multi_token_decode=True" in reference["merge"]["mla_draft"]
    assert reference["uniform"] == {
        "mla_target_draft": "True",
        "mla_before_mamba": "False",
        "mla_cache_dtype_str": "False",
    }


@pytest.mark.parametrize(
    "flags,hash_seed",
    [(["-O"], 0), (["-O"], 1), (["-O"], 2), (["-OO"], 3)],
    ids=["O-0", "O-1", "O-2", "OO-3"],
)
def test_merge_and_grouping_same_under_optimize(reference, flags, hash_seed):
    optimized = _run_child(flags, hash_seed)
    for kind in ("merge", "uniform", "groups"):
        differing = {
            name: (value, reference[kind][name])
            for name, value in optimized[kind].items()
            if value != reference[kind][name]
        }
        assert not differing, f"{kind} differs under {flags}: {differing}"

# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""KV cache spec merges refuse incompatible specs, also under ``python -O``.

The planner (``is_kv_cache_spec_uniform``, the page-size bucketing of
``get_kv_cache_groups``) reads the ``AssertionError`` a merge raises as "these
layers cannot share a KV cache group". ``python -O`` strips ``assert``
statements, so the merges, and the two checks that guard a pick from a set,
raise explicitly. One ``python -O`` child runs the same calls again.
"""

import ast
import inspect
import json
import subprocess
import sys
import textwrap
from dataclasses import replace
from types import SimpleNamespace

import pytest
import torch

import vllm
from vllm.v1.core.kv_cache_planning import (
    get_uniform_page_size,
    is_kv_cache_spec_uniform,
)
from vllm.v1.kv_cache_interface import (
    FullAttentionSpec,
    KVCacheSpec,
    MambaSpec,
    MLAAttentionSpec,
    RSWASpec,
    SinkFullAttentionSpec,
    SlidingWindowMLASpec,
    SlidingWindowSpec,
    UniformTypeKVCacheSpecs,
)

pytestmark = pytest.mark.cpu_test

FULL = FullAttentionSpec(
    block_size=16, num_kv_heads=2, head_size=64, dtype=torch.bfloat16
)
SLIDING = SlidingWindowSpec(
    block_size=16, num_kv_heads=2, head_size=64, dtype=torch.bfloat16, sliding_window=32
)
MLA = MLAAttentionSpec(
    block_size=16, num_kv_heads=1, head_size=576, dtype=torch.bfloat16
)
DRAFT = replace(MLA, non_causal_multi_token_decode=True)
MAMBA = MambaSpec(
    block_size=16,
    shapes=((2, 512), (3, 32, 32)),
    dtypes=(torch.float32, torch.float32),
    page_size_padded=MLA.page_size_bytes,
)
SLIDING_MLA = SlidingWindowMLASpec(
    block_size=16,
    num_kv_heads=1,
    head_size=576,
    dtype=torch.bfloat16,
    sliding_window=128,
)
RSWA = RSWASpec(
    block_size=16, num_kv_heads=2, head_size=64, dtype=torch.bfloat16, rswa_window=256
)
SINK = SinkFullAttentionSpec(
    block_size=16, num_kv_heads=2, head_size=64, dtype=torch.bfloat16, sink_len=4
)

SAME_SPEC = "must have the same attention spec"
MLA_SAME = "must use the same quantization method"
SLIDING_MLA_SAME = "must use the same quantization method, tokens per state"

# (the class whose merge runs, the specs, what the AssertionError says)
INCOMPATIBLE = {
    "full_head_size": (
        FullAttentionSpec,
        [FULL, replace(FULL, head_size=128)],
        SAME_SPEC,
    ),
    "full_mla": (
        FullAttentionSpec,
        [FULL, MLA],
        "should be merged in MLAAttentionSpec",
    ),
    "full_mamba": (FullAttentionSpec, [FULL, MAMBA], "must be FullAttentionSpec"),
    "full_sliding": (FullAttentionSpec, [FULL, SLIDING], "must be FullAttentionSpec"),
    "full_window_and_chunk": (
        FullAttentionSpec,
        [replace(FULL, sliding_window=64), replace(FULL, attention_chunk_size=64)],
        "both sliding window layers and chunked local attention",
    ),
    "mla_cache_dtype_str": (
        MLAAttentionSpec,
        [
            replace(MLA, cache_dtype_str="auto"),
            replace(MLA, cache_dtype_str="bfloat16"),
        ],
        MLA_SAME,
    ),
    "mla_head_size": (MLAAttentionSpec, [MLA, replace(MLA, head_size=512)], SAME_SPEC),
    "mla_mamba": (MLAAttentionSpec, [MLA, MAMBA], "must be MLAAttentionSpec"),
    "mla_full": (MLAAttentionSpec, [MLA, FULL], "must be MLAAttentionSpec"),
    "sliding_mla_window": (
        SlidingWindowMLASpec,
        [SLIDING_MLA, replace(SLIDING_MLA, sliding_window=256)],
        SLIDING_MLA_SAME,
    ),
    "sliding_mla_dcp_sharded": (
        SlidingWindowMLASpec,
        [SLIDING_MLA, replace(SLIDING_MLA, dcp_sharded=False)],
        "must use the same DCP sharding",
    ),
    "sliding_mla_max_tp_shards": (
        SlidingWindowMLASpec,
        [SLIDING_MLA, replace(SLIDING_MLA, max_tp_shards=2)],
        "must use the same max TP shards",
    ),
    "sliding_mla_mla": (
        SlidingWindowMLASpec,
        [SLIDING_MLA, MLA],
        "must be SlidingWindowMLASpec",
    ),
    "rswa_window": (RSWASpec, [RSWA, replace(RSWA, rswa_window=512)], "rswa_window"),
    "rswa_full": (RSWASpec, [RSWA, FULL], "must be RSWASpec"),
    "sink_head_size": (
        SinkFullAttentionSpec,
        [SINK, replace(SINK, head_size=128)],
        SAME_SPEC,
    ),
    "sink_mla": (
        SinkFullAttentionSpec,
        [SINK, MLA],
        "should be merged in MLAAttentionSpec",
    ),
}

# layer sets -> is_kv_cache_spec_uniform in plain Python
LAYER_SETS = {
    "mla_target_and_draft": (
        {
            **{f"model.layers.{i}.attn": MLA for i in range(4)},
            **{f"drafter.layers.{i}.attn": DRAFT for i in range(2)},
        },
        True,
    ),
    "mla_before_mamba": (
        {
            **{f"model.layers.{i}.attn": MLA for i in (3, 7)},
            **{f"model.layers.{i}.linear_attn": MAMBA for i in (0, 1, 2, 4, 5, 6)},
        },
        False,
    ),
    "mla_cache_dtype_str": (
        {
            "model.layers.0.attn": replace(MLA, cache_dtype_str="auto"),
            "model.layers.1.attn": replace(MLA, cache_dtype_str="bfloat16"),
        },
        False,
    ),
    "full_before_sliding_window": (
        {"model.layers.0.attn": FULL, "model.layers.1.attn": SLIDING},
        False,
    ),
}

# UniformTypeKVCacheSpecs.max_num_blocks_per_req reads only this of the config
NO_DCP = SimpleNamespace(
    parallel_config=SimpleNamespace(decode_context_parallel_size=1)
)
MIXED_WIDTHS = UniformTypeKVCacheSpecs(
    block_size=16,
    kv_cache_specs={"layer.0": FULL, "layer.1": replace(FULL, block_size=32)},
)
MIXED_PAGES = [FULL, replace(FULL, head_size=128)]


@pytest.mark.parametrize(
    "merge_cls, specs, message",
    list(INCOMPATIBLE.values()),
    ids=list(INCOMPATIBLE),
)
def test_incompatible_specs_do_not_merge(merge_cls, specs, message):
    with pytest.raises(AssertionError, match=message):
        merge_cls.merge(specs)


def test_mla_target_and_draft_merge_keeps_the_capability():
    merged = MLAAttentionSpec.merge([MLA, DRAFT])
    assert merged.non_causal_multi_token_decode


@pytest.mark.parametrize(
    "layers, uniform", list(LAYER_SETS.values()), ids=list(LAYER_SETS)
)
def test_is_kv_cache_spec_uniform_on_mixed_layers(layers, uniform):
    assert is_kv_cache_spec_uniform(layers) is uniform


def test_uniform_type_specs_refuse_mixed_block_table_widths():
    with pytest.raises(AssertionError, match="same number of block table entries"):
        MIXED_WIDTHS.max_num_blocks_per_req(NO_DCP, 64)


def test_uniform_page_size_refuses_mixed_page_sizes():
    with pytest.raises(AssertionError, match="must have the same page size"):
        get_uniform_page_size(MIXED_PAGES)


def _vllm_spec_classes() -> list[type]:
    """KVCacheSpec and its subclasses defined in vLLM: subclasses that other test
    modules define do not count (the answer must not depend on test order)."""
    todo, found = [KVCacheSpec], []
    while todo:
        cls = todo.pop()
        if cls.__module__.startswith("vllm."):
            found.append(cls)
            todo.extend(cls.__subclasses__())
    return found


def _asserts(func) -> int:
    tree = ast.parse(textwrap.dedent(inspect.getsource(func)))
    return sum(isinstance(node, ast.Assert) for node in ast.walk(tree))


def test_merges_and_set_picks_check_without_assert():
    checked = {
        f"{cls.__qualname__}.merge": getattr(cls.merge, "__func__", cls.merge)
        for cls in _vllm_spec_classes()
        if "merge" in vars(cls)
    }
    assert checked.keys() >= {
        "KVCacheSpec.merge",
        "FullAttentionSpec.merge",
        "MLAAttentionSpec.merge",
    }
    checked["UniformTypeKVCacheSpecs.max_num_blocks_per_req"] = (
        UniformTypeKVCacheSpecs.max_num_blocks_per_req
    )
    checked["get_uniform_page_size"] = get_uniform_page_size
    asserting = sorted(name for name, func in checked.items() if _asserts(func))
    assert asserting == [], f"python -O strips the asserts of {asserting}"


def _outcome(fn, *args) -> str:
    try:
        return repr(fn(*args))
    except Exception as e:
        return f"{type(e).__name__}: {e}"


def outcomes() -> dict:
    """What each call above returns or raises, as text. No assert in here: the
    python -O child runs it too."""
    merges = {
        name: _outcome(merge_cls.merge, specs)
        for name, (merge_cls, specs, _) in INCOMPATIBLE.items()
    }
    merges["mla_target_and_draft"] = _outcome(MLAAttentionSpec.merge, [MLA, DRAFT])
    return {
        "merge": merges,
        "uniform": {
            name: _outcome(is_kv_cache_spec_uniform, layers)
            for name, (layers, _) in LAYER_SETS.items()
        },
        "max_num_blocks_per_req": _outcome(
            MIXED_WIDTHS.max_num_blocks_per_req, NO_DCP, 64
        ),
        "get_uniform_page_size": _outcome(get_uniform_page_size, MIXED_PAGES),
    }


def test_same_outcomes_under_python_O():
    if sys.flags.optimize:
        pytest.skip("pytest already runs under python -O: the tests above cover it")
    # This file, run as __main__ by a python -O interpreter (see the end).
    launch = "import runpy, sys; runpy.run_path(sys.argv[1], run_name='__main__')"
    proc = subprocess.run(
        [sys.executable, "-O", "-c", launch, __file__],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    child = json.loads(proc.stdout.strip().splitlines()[-1])
    assert child["optimize"] == 1 and child["vllm"] == vllm.__file__
    expected = outcomes()
    differing = {
        kind: {
            name: (value, expected[kind][name])
            for name, value in child["outcomes"][kind].items()
            if value != expected[kind][name]
        }
        if isinstance(expected[kind], dict)
        else (child["outcomes"][kind], expected[kind])
        for kind in expected
        if child["outcomes"][kind] != expected[kind]
    }
    assert not differing, f"python -O differs from python: {differing}"


if __name__ == "__main__":
    # The python -O child: an assert would be stripped here, so check explicitly.
    if sys.flags.optimize != 1:
        raise SystemExit(f"expected python -O, got optimize={sys.flags.optimize}")
    result = {"optimize": sys.flags.optimize, "vllm": vllm.__file__}
    print(json.dumps({**result, "outcomes": outcomes()}))

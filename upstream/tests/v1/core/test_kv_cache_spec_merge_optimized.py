# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""KV cache spec merges must reject the same specs under ``python -O``.

The planner (``is_kv_cache_spec_uniform``, the page-size bucketing in
``get_kv_cache_groups``) tells incompatible specs apart by the
``AssertionError`` their merge raises. ``python -O`` strips ``assert``
statements, so a merge that guards with ``assert`` lets ``-O`` merge
incompatible specs, or run on into an ``AttributeError``. The reference runs in
this process (pytest does not run optimized); one ``-O`` child runs the same
cases.
"""

import ast
import inspect
import json
import subprocess
import sys
import textwrap

import pytest

import vllm.v1.kv_cache_interface as kv_cache_interface
from vllm.v1.kv_cache_interface import KVCacheSpec

pytestmark = pytest.mark.cpu_test

# Defines cases(): every merge outcome and the planner's answers on a few layer
# sets, as strings. Run in this process and in the -O child; no assert in it.
_CASES = textwrap.dedent(
    """
    from dataclasses import replace

    import torch

    from vllm.config import VllmConfig
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
        SlidingWindowSpec,
    )

    full = FullAttentionSpec(
        block_size=16, num_kv_heads=2, head_size=64, dtype=torch.bfloat16
    )
    swa = SlidingWindowSpec(
        block_size=16,
        num_kv_heads=2,
        head_size=64,
        dtype=torch.bfloat16,
        sliding_window=32,
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
        block_size=16,
        num_kv_heads=2,
        head_size=64,
        dtype=torch.bfloat16,
        sink_len=4,
    )

    MERGES = {
        "full": (FullAttentionSpec, [full, full]),
        "mla_draft": (MLAAttentionSpec, [mla, draft]),
        "full_head_size": (FullAttentionSpec, [full, replace(full, head_size=128)]),
        "full_mla": (FullAttentionSpec, [full, mla]),
        "full_mamba": (FullAttentionSpec, [full, mamba]),
        "full_swa": (FullAttentionSpec, [full, swa]),
        "full_window_and_chunk": (
            FullAttentionSpec,
            [replace(full, sliding_window=64), replace(full, attention_chunk_size=64)],
        ),
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
            "model.layers.0.attn": replace(mla, cache_dtype_str="auto"),
            "model.layers.1.attn": replace(mla, cache_dtype_str="bfloat16"),
        },
        "full_before_sliding_window": {
            "model.layers.0.attn": full,
            "model.layers.1.attn": swa,
        },
    }


    def outcome(fn, *args):
        try:
            return repr(fn(*args))
        except Exception as e:
            return f"{type(e).__name__}: {e}"


    def groups(specs):
        vllm_config = VllmConfig()
        vllm_config.cache_config.kv_cache_layout = "LBNHC"
        return [
            (group.layer_names, group.kv_cache_spec)
            for group in get_kv_cache_groups(vllm_config, dict(specs))
        ]


    def cases():
        return {
            "merge": {
                name: outcome(cls.merge, specs) for name, (cls, specs) in MERGES.items()
            },
            "uniform": {
                name: outcome(is_kv_cache_spec_uniform, dict(specs))
                for name, specs in LAYER_SETS.items()
            },
            "groups": {
                name: outcome(groups, specs) for name, specs in LAYER_SETS.items()
            },
        }
    """
)

COMPATIBLE = ["full", "mla_draft"]


@pytest.fixture(scope="module")
def reference() -> dict:
    namespace: dict = {}
    exec(compile(_CASES, "<cases>", "exec"), namespace)
    return namespace["cases"]()


def test_incompatible_specs_raise_assertion_error(reference):
    for name, result in reference["merge"].items():
        if name in COMPATIBLE:
            assert not result.startswith(("AssertionError", "AttributeError")), name
        else:
            assert result.startswith("AssertionError"), (name, result)
    assert "non_causal_multi_token_decode=True" in reference["merge"]["mla_draft"]
    assert reference["uniform"] == {
        "mla_target_draft": "True",
        "mla_before_mamba": "False",
        "mla_cache_dtype_str": "False",
        "full_before_sliding_window": "False",
    }


def _spec_classes() -> list[type]:
    todo, found = [KVCacheSpec], []
    while todo:
        cls = todo.pop()
        found.append(cls)
        todo.extend(cls.__subclasses__())
    return found


def test_no_assert_in_any_kv_cache_spec_merge():
    checked = []
    for cls in _spec_classes():
        merge = vars(cls).get("merge")
        if merge is None:
            continue
        func = merge.__func__ if isinstance(merge, classmethod) else merge
        tree = ast.parse(textwrap.dedent(inspect.getsource(func)))
        asserts = [n.lineno for n in ast.walk(tree) if isinstance(n, ast.Assert)]
        assert not asserts, (
            f"{cls.__qualname__}.merge uses assert (python -O strips it)"
        )
        checked.append(cls.__qualname__)
    assert "MLAAttentionSpec" in checked and "FullAttentionSpec" in checked
    assert kv_cache_interface.KVCacheSpec.__qualname__ in checked


def test_same_results_under_optimized_python(reference):
    code = _CASES + "\nimport json\nprint(json.dumps(cases()))\n"
    proc = subprocess.run(
        [sys.executable, "-O", "-c", code],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    optimized = json.loads(proc.stdout.strip().splitlines()[-1])
    for kind in ("merge", "uniform", "groups"):
        differing = {
            name: (value, reference[kind][name])
            for name, value in optimized[kind].items()
            if value != reference[kind][name]
        }
        assert not differing, f"{kind} differs under -O: {differing}"

# 0001's edit of vLLM's tests/v1/core/test_kv_cache_planning.py (upstream/make_patches.py
# makes it: each "# >>> KIND ANCHOR" line starts one edit).
# >>> after def test_is_kv_cache_spec_uniform
def test_spec_merges_keep_their_checks_under_python_O():
    # The planner reads a merge's AssertionError as "these layers cannot share
    # a KV cache group" (see test_is_kv_cache_spec_uniform).
    script = r"""
import sys
from dataclasses import replace

import torch

from vllm.config import VllmConfig
from vllm.v1.core.kv_cache_planning import (
    get_uniform_page_size,
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
    UniformTypeKVCacheSpecs,
)

if sys.flags.optimize < 1:
    raise RuntimeError("subprocess is not running with optimization enabled")
kw = dict(block_size=16, num_kv_heads=2, head_size=64, dtype=torch.bfloat16)
full = FullAttentionSpec(**kw)
mla = MLAAttentionSpec(**{**kw, "num_kv_heads": 1, "head_size": 576})
mamba = MambaSpec(block_size=16, shapes=((2, 512),), dtypes=(torch.float32,))
rswa = RSWASpec(**kw, rswa_window=256)
sink = SinkFullAttentionSpec(**kw, sink_len=4)
swa_mla = SlidingWindowMLASpec(**{**kw, "num_kv_heads": 1}, sliding_window=128)
widths = UniformTypeKVCacheSpecs(
    block_size=16, kv_cache_specs={"a": full, "b": replace(full, block_size=32)}
)
cases = {
    "mla_then_mamba": lambda: is_kv_cache_spec_uniform({"a": mla, "b": mamba}),
    "full_then_sliding": lambda: is_kv_cache_spec_uniform(
        {"a": full, "b": SlidingWindowSpec(**kw, sliding_window=32)}
    ),
    "mla_cache_dtypes": lambda: is_kv_cache_spec_uniform(
        {"a": mla, "b": replace(mla, cache_dtype_str="bfloat16")}
    ),
    "rswa": lambda: RSWASpec.merge([rswa, replace(rswa, rswa_window=512)]),
    "sink": lambda: SinkFullAttentionSpec.merge([sink, replace(sink, head_size=128)]),
    "sliding_mla": lambda: SlidingWindowMLASpec.merge(
        [swa_mla, replace(swa_mla, dcp_sharded=False)]
    ),
    "block_table_widths": lambda: widths.max_num_blocks_per_req(VllmConfig(), 64),
    "page_sizes": lambda: get_uniform_page_size([full, replace(full, head_size=128)]),
}
outcomes = []
for name, case in cases.items():
    try:
        outcomes.append(f"{name} {case()}")
    except Exception as e:
        outcomes.append(f"{name} {type(e).__name__}")
print(*outcomes, sep="\n")  # last: vLLM logs to stdout too
"""
    proc = subprocess.run(
        [sys.executable, "-O", "-c", script],
        cwd=Path(__file__).resolve().parents[3],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[-8:] == [
        "mla_then_mamba False",
        "full_then_sliding False",
        "mla_cache_dtypes False",
        "rswa AssertionError",
        "sink AssertionError",
        "sliding_mla AssertionError",
        "block_table_widths AssertionError",
        "page_sizes AssertionError",
    ]

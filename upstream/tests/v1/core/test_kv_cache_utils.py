# What 0001 adds to vLLM's tests/v1/core/test_kv_cache_utils.py. Sections, in
# order, after lines "# >>> ...": the imports that file already has (not in the
# patch; they let this file run alone), the lines added to its imports, the
# lines appended at its end (upstream/make_patches.py builds the hunks).
# >>> the file's own imports
import subprocess
import sys

# >>> added to the imports
# >>> appended at the end
PYTHON_O_MERGE_CHECKS = """
from dataclasses import replace

import torch

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
no_dcp = type("C", (), {"parallel_config": type("P", (), {})()})()
no_dcp.parallel_config.decode_context_parallel_size = 1
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
    "block_table_widths": lambda: widths.max_num_blocks_per_req(no_dcp, 64),
    "page_sizes": lambda: get_uniform_page_size([full, replace(full, head_size=128)]),
}
for name, case in cases.items():
    try:
        print(name, case())
    except Exception as e:
        print(name, type(e).__name__)
"""


def test_merge_checks_survive_python_O():
    # The planner reads a merge's AssertionError as "these layers cannot share a
    # KV cache group"; python -O must not strip those checks.
    out = subprocess.run(
        [sys.executable, "-O", "-c", PYTHON_O_MERGE_CHECKS],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.splitlines()
    assert out[-8:] == [
        "mla_then_mamba False",
        "full_then_sliding False",
        "mla_cache_dtypes False",
        "rswa AssertionError",
        "sink AssertionError",
        "sliding_mla AssertionError",
        "block_table_widths AssertionError",
        "page_sizes AssertionError",
    ]

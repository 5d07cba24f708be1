# What 0003 adds to vLLM's tests/config/test_vllm_config.py. Sections, in order,
# after lines "# >>> ...": the imports that file already has (not in the patch;
# they let this file run alone), the lines added to its imports, the lines
# appended at its end (upstream/make_patches.py builds the hunks).
# >>> the file's own imports
# >>> added to the imports
import pytest

from vllm.config import (
    CompilationConfig,
    KVTransferConfig,
    ParallelConfig,
    VllmConfig,
)
# >>> appended at the end


def test_validate_block_size_raises_value_error():
    config = VllmConfig()
    config.parallel_config.decode_context_parallel_size = 8
    config.cache_config.block_size = 64
    config.parallel_config.cp_kv_cache_interleave_size = 128
    with pytest.raises(ValueError, match="divisible by cp_kv_cache_interleave_size"):
        config.validate_block_size()

    config = VllmConfig()
    config.cache_config.mamba_cache_mode = "align"
    config.scheduler_config.disable_chunked_mm_input = True
    with pytest.raises(ValueError, match="Chunked MM input is required"):
        config.validate_block_size()


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (
            {
                "parallel_config": ParallelConfig(
                    tensor_parallel_size=8, decode_context_parallel_size=4
                ),
                "kv_transfer_config": KVTransferConfig(
                    kv_connector="NixlConnector", kv_role="kv_both"
                ),
            },
            "must be 1 or equal to the NIXL transfer parallel size=8",
        ),
        (
            {"compilation_config": CompilationConfig(compile_ranges_endpoints=[0])},
            "Invalid compile range endpoint: 0",
        ),
    ],
    ids=["nixl_dcp_4_of_tp_8", "compile_range_endpoint_0"],
)
def test_post_init_checks_raise_value_error(kwargs, message):
    with pytest.raises(ValueError, match=message) as info:
        VllmConfig(**kwargs)
    # pydantic reports the ValueError of __post_init__ as a value_error
    assert [e["type"] for e in info.value.errors()] == ["value_error"]

# 0003's edit of vLLM's tests/test_config.py (upstream/make_patches.py makes it: each
# "# >>> KIND ANCHOR" line starts one edit).
# >>> replace line     with pytest.raises(AssertionError, match="divisible by"):
    with pytest.raises(ValueError, match="divisible by"):
# >>> after def test_nixl_dcp_check_rejects_non_mla_model_with_dcp
@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        pytest.param(
            {
                "device_config": DeviceConfig(device="cpu"),
                "parallel_config": ParallelConfig(
                    tensor_parallel_size=4,
                    decode_context_parallel_size=2,
                    distributed_executor_backend="mp",
                ),
                "kv_transfer_config": KVTransferConfig(
                    kv_connector="NixlConnector", kv_role="kv_both"
                ),
            },
            "must be 1 or equal to the NIXL transfer parallel size=4",
            id="nixl_dcp_2_of_tp_4",
        ),
        pytest.param(
            {"compilation_config": CompilationConfig(compile_ranges_endpoints=[0])},
            "Invalid compile range endpoint: 0",
            id="compile_range_endpoint_0",
        ),
    ],
)
def test_post_init_checks_raise_value_error(kwargs, message):
    # pydantic's ValidationError is a ValueError, and it wraps an AssertionError
    # too: pytest.raises passes while the check is an assert, the last line
    # fails then (the error's type is "assertion_error").
    with pytest.raises(ValidationError, match=message) as info:
        VllmConfig(**kwargs)
    assert [e["type"] for e in info.value.errors()] == ["value_error"]
# >>> after def test_validate_mamba_align_subblock_prefill
def test_validate_mamba_align_requires_chunked_mm_input():
    config = VllmConfig()
    config.cache_config.mamba_cache_mode = "align"
    config.scheduler_config.disable_chunked_mm_input = True
    with pytest.raises(ValueError, match="Chunked MM input is required"):
        config.validate_block_size()

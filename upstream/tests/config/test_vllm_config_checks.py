# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""VllmConfig refuses misfit configurations with ValueError, also under python -O.

The checks raise explicitly (``python -O`` strips ``assert`` statements). Checks
that run in ``__post_init__`` reach the caller as pydantic's ``ValidationError``
(a ``ValueError``), as before; ``validate_block_size`` raises ``ValueError``.
"""

import ast
import inspect
import textwrap

import pytest
from pydantic import ValidationError

from vllm.config import (
    CompilationConfig,
    KVTransferConfig,
    ParallelConfig,
    VllmConfig,
)

INTERLEAVE = (
    r"Block_size\(64\) should be greater than or equal to and divisible by "
    r"cp_kv_cache_interleave_size"
)


def dcp_config(interleave: int) -> VllmConfig:
    config = VllmConfig()
    config.parallel_config.decode_context_parallel_size = 8
    config.cache_config.block_size = 64
    config.parallel_config.cp_kv_cache_interleave_size = interleave
    return config


@pytest.mark.parametrize("interleave", [128, 48], ids=["larger", "not_a_divisor"])
def test_dcp_interleave_must_divide_the_block_size(interleave):
    with pytest.raises(ValueError, match=INTERLEAVE):
        dcp_config(interleave).validate_block_size()


def test_dcp_interleave_that_divides_the_block_size_is_accepted():
    dcp_config(64).validate_block_size()


def test_mamba_align_mode_needs_chunked_mm_input():
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
            (
                "decode_context_parallel_size=4 must be 1 or equal to the NIXL "
                "transfer parallel size=8"
            ),
        ),
        (
            {"compilation_config": CompilationConfig(compile_ranges_endpoints=[0])},
            "Invalid compile range endpoint: 0",
        ),
    ],
    ids=["nixl_dcp_4_of_tp_8", "compile_range_endpoint_0"],
)
def test_post_init_checks_raise_value_error(kwargs, message):
    with pytest.raises(ValidationError, match=message) as info:
        VllmConfig(**kwargs)
    # pydantic reports a ValueError raised in __post_init__ as a value_error
    assert [error["type"] for error in info.value.errors()] == ["value_error"]


def _is_type_narrowing(node: ast.Assert) -> bool:
    """``assert isinstance(...)`` or ``assert x is not None`` with no message:
    these tell type checkers what the code guarantees, and stay."""
    test = node.test
    if node.msg is not None:
        return False
    if isinstance(test, ast.Call) and getattr(test.func, "id", None) == "isinstance":
        return True
    return (
        isinstance(test, ast.Compare)
        and [type(op) for op in test.ops] == [ast.IsNot]
        and isinstance(test.comparators[0], ast.Constant)
        and test.comparators[0].value is None
    )


@pytest.mark.parametrize(
    "method",
    [
        "__post_init__",
        "_set_cudagraph_sizes",
        "_set_compile_ranges",
        "validate_block_size",
    ],
)
def test_checks_do_not_assert(method):
    source = textwrap.dedent(inspect.getsource(getattr(VllmConfig, method)))
    checks = [
        node.lineno
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Assert) and not _is_type_narrowing(node)
    ]
    assert checks == [], f"python -O strips these asserts of VllmConfig.{method}"

# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""VllmConfig must refuse the same configurations under ``python -O``.

``python -O`` strips ``assert`` statements; VllmConfig's checks raise
explicitly instead. The reference runs in this process; one ``-O`` child runs
the same cases.
"""

import ast
import inspect
import json
import subprocess
import sys
import textwrap

import pytest

from vllm.config import VllmConfig

pytestmark = pytest.mark.cpu_test

CHECKING = (
    "__post_init__",
    "_set_cudagraph_sizes",
    "_set_compile_ranges",
    "validate_block_size",
)

_CASES = textwrap.dedent(
    """
    from vllm.config import KVTransferConfig, ParallelConfig, VllmConfig


    def outcome(fn):
        try:
            fn()
        except Exception as e:
            return f"{type(e).__name__}: {e}"
        return "accepted"


    def interleave(size):
        def check():
            config = VllmConfig()
            config.parallel_config.decode_context_parallel_size = 8
            config.cache_config.block_size = 64
            config.parallel_config.cp_kv_cache_interleave_size = size
            config.validate_block_size()

        return check


    def nixl_dcp():
        VllmConfig(
            parallel_config=ParallelConfig(
                tensor_parallel_size=8, decode_context_parallel_size=4
            ),
            kv_transfer_config=KVTransferConfig(
                kv_connector="NixlConnector", kv_role="kv_both"
            ),
        )


    def cases():
        return {
            "interleave_fits": outcome(interleave(64)),
            "interleave_too_large": outcome(interleave(128)),
            "nixl_dcp_4_of_tp_8": outcome(nixl_dcp),
        }
    """
)


@pytest.fixture(scope="module")
def reference() -> dict:
    namespace: dict = {}
    exec(compile(_CASES, "<cases>", "exec"), namespace)
    return namespace["cases"]()


def test_misfit_configurations_are_refused(reference):
    assert reference["interleave_fits"] == "accepted"
    assert reference["interleave_too_large"].startswith(
        "AssertionError: Block_size(64)"
    )
    assert "NIXL transfer parallel size=8" in reference["nixl_dcp_4_of_tp_8"]


def test_no_assert_in_the_checks():
    for name in CHECKING:
        source = textwrap.dedent(inspect.getsource(getattr(VllmConfig, name)))
        asserts = [n for n in ast.walk(ast.parse(source)) if isinstance(n, ast.Assert)]
        assert not asserts, f"VllmConfig.{name} uses assert (python -O strips it)"


def test_same_results_under_optimized_python(reference):
    code = _CASES + "\nimport json\nprint(json.dumps(cases()))\n"
    proc = subprocess.run(
        [sys.executable, "-O", "-c", code],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == reference

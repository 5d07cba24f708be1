# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""CPU KV offload's worker barrier must fall back to the world group under -O.

``_all_workers_barrier`` uses the inner-DP world group when a DP replica spans
nodes and otherwise falls back to the world group, on the ``AssertionError``
that ``get_inner_dp_world_group()`` raises. ``python -O`` strips ``assert``
statements, so the getter must raise explicitly. One ``-O`` child builds a
one-process gloo world and runs the barrier.
"""

import ast
import inspect
import subprocess
import sys
import textwrap

import pytest

from vllm.distributed import parallel_state

pytestmark = pytest.mark.cpu_test

_CHILD = textwrap.dedent(
    """
    import socket

    import torch.distributed as dist

    from vllm.distributed import parallel_state
    from vllm.v1.kv_offload.cpu.spec import _all_workers_barrier

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", world_size=1, rank=0
    )
    parallel_state._WORLD = parallel_state.init_world_group([0], 0, "gloo")
    if parallel_state._INNER_DP_WORLD is not None:
        raise SystemExit("expected no inner-DP world group in a single process")
    _all_workers_barrier()
    print("barrier passed")
    """
)


def test_getter_raises_without_inner_dp_group():
    if parallel_state._INNER_DP_WORLD is not None:
        pytest.skip("this process has an inner-DP world group")
    with pytest.raises(AssertionError, match="inner dp world group"):
        parallel_state.get_inner_dp_world_group()


def test_no_assert_in_the_getter():
    source = textwrap.dedent(inspect.getsource(parallel_state.get_inner_dp_world_group))
    assert not any(isinstance(n, ast.Assert) for n in ast.walk(ast.parse(source)))


def test_barrier_falls_back_under_optimized_python():
    proc = subprocess.run(
        [sys.executable, "-O", "-c", _CHILD],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "barrier passed" in proc.stdout

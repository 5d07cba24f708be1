# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""CPU KV offload's worker barrier falls back to the world group under python -O.

``_all_workers_barrier`` uses the inner-DP world group when a DP replica spans
nodes and otherwise falls back to the world group, on the ``AssertionError``
that ``get_inner_dp_world_group()`` raises. ``python -O`` strips ``assert``
statements, so the getter raises explicitly. One ``python -O`` child starts a
one-process gloo world and runs the barrier.
"""

import ast
import inspect
import json
import subprocess
import sys
import textwrap

import pytest

import vllm
from vllm.distributed import parallel_state


def test_getter_raises_without_inner_dp_group():
    if parallel_state._INNER_DP_WORLD is not None:
        pytest.skip("this process has an inner-DP world group")
    with pytest.raises(AssertionError, match="inner dp world group"):
        parallel_state.get_inner_dp_world_group()


def test_getter_checks_without_assert():
    source = textwrap.dedent(inspect.getsource(parallel_state.get_inner_dp_world_group))
    asserts = [
        n.lineno for n in ast.walk(ast.parse(source)) if isinstance(n, ast.Assert)
    ]
    assert asserts == [], "python -O strips the assert of get_inner_dp_world_group"


def barrier_on_a_single_node() -> str:
    """Start a one-process gloo world (no inner-DP group: one node) and run the
    CPU-offload barrier. No assert in here: the python -O child runs it."""
    from vllm.distributed.parallel_state import init_distributed_environment
    from vllm.utils.network_utils import get_distributed_init_method, get_open_port
    from vllm.v1.kv_offload.cpu.spec import _all_workers_barrier

    init_distributed_environment(
        world_size=1,
        rank=0,
        distributed_init_method=get_distributed_init_method(
            "127.0.0.1", get_open_port()
        ),
        local_rank=0,
        backend="gloo",
    )
    if parallel_state._INNER_DP_WORLD is not None:
        return "unexpected inner-DP world group in a single process"
    _all_workers_barrier()
    return "passed"


def test_barrier_falls_back_under_python_O():
    if sys.flags.optimize:
        pytest.skip("pytest already runs under python -O")
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
    assert child == {"optimize": 1, "vllm": vllm.__file__, "barrier": "passed"}


if __name__ == "__main__":
    # The python -O child: an assert would be stripped here, so check explicitly.
    if sys.flags.optimize != 1:
        raise SystemExit(f"expected python -O, got optimize={sys.flags.optimize}")
    result = {"optimize": sys.flags.optimize, "vllm": vllm.__file__}
    print(json.dumps({**result, "barrier": barrier_on_a_single_node()}))

# What 0002 adds to vLLM's tests/distributed/test_parallel_state.py. Sections, in
# order, after lines "# >>> ...": the imports that file already has (not in the
# patch; they let this file run alone), the lines added to its imports, the
# lines appended at its end (upstream/make_patches.py builds the hunks).
# >>> the file's own imports
# >>> added to the imports
import subprocess
import sys

# >>> appended at the end


def test_inner_dp_world_group_getter_raises_under_python_O():
    # CPU KV offload's _all_workers_barrier falls back to the world group on the
    # AssertionError this getter raises when no DP replica spans nodes.
    code = (
        "from vllm.distributed.parallel_state import get_inner_dp_world_group\n"
        "try:\n"
        "    print(get_inner_dp_world_group())\n"
        "except AssertionError as e:\n"
        "    print(f'AssertionError: {e}')\n"
    )
    out = subprocess.run(
        [sys.executable, "-O", "-c", code], capture_output=True, text=True, check=True
    ).stdout.splitlines()
    assert out[-1] == "AssertionError: inner dp world group is not initialized"

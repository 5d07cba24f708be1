# 0002's edit of vLLM's tests/v1/kv_offload/test_factory.py (upstream/make_patches.py
# makes it: each "# >>> KIND ANCHOR" line starts one edit).
# >>> after line import os
import subprocess
import sys
# >>> after line import uuid
from pathlib import Path
# >>> after def test_cpu_spec_replicated_disabled_without_shared_region
def test_all_workers_barrier_under_python_O():
    script = r"""
import sys
import vllm.distributed.parallel_state as ps
from vllm.utils.network_utils import get_open_port
from vllm.v1.kv_offload.cpu.spec import _all_workers_barrier

if sys.flags.optimize < 1:
    raise RuntimeError("subprocess is not running with optimization enabled")

def outcome(name, call=None):  # call: ps.get_{name}_group by default
    try:
        (call or getattr(ps, f"get_{name}_group"))()
        return f"{name} ok"
    except Exception as e:
        return f"{name} {type(e).__name__}"

# callers catch the getters' AssertionError outside a distributed run
outcomes = [outcome("world")]
ps.init_distributed_environment(1, 0, f"tcp://127.0.0.1:{get_open_port()}", 0, "gloo")
outcomes.append(outcome("barrier", _all_workers_barrier))  # no inner-DP group
outcomes += [outcome(name) for name in ("tp", "pp", "dcp", "pcp")]
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
    assert proc.stdout.splitlines()[-6:] == ["world AssertionError", "barrier ok"] + [
        f"{name} AssertionError" for name in ("tp", "pp", "dcp", "pcp")
    ]

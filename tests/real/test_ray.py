"""Multi-node reach (issue 4 item 5): a Ray worker is patched.

Ray runs from its own venv, built by scripts/build-venv from
locks/ray-0.29.0-py3.11.txt: the 0.29.0 venv's lock plus ray, every package the
two share pinned to the 0.29.0 lock's version (a machine that cannot build it
fails this test, never skips it). A local CPU-only Ray cluster (loopback, no
dashboard, 2 CPUs) starts; tasks and an actor are started with
``runtime_env={"env_vars": {"PYTHONPATH": <shim>, "PYTHONOPTIMIZE": "1"}}``,
which is how a vLLM deployment on Ray hands the shim to every worker of every
node. Each worker imports the real vllm.v1.kv_cache_interface and reports: the
shim loaded from PYTHONPATH, the merge wrapped once, and under optimized Python
the Kimi-K3 target + DSpark draft merge keeps the capability. The same worker
setup with KIMI_HOTFIX=0 shows vLLM's own -O bug in the same run.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from helpers import REPO, STANDINS, hermetic_env, json_lines, run_python

pytestmark = pytest.mark.releases("0.29.0")


def ray_python(release) -> str:
    """The python of the ray venv over ``release`` (built from its lock if needed)."""
    proc = subprocess.run([str(REPO / "scripts" / "build-venv"), "ray-" + release + "-py3.11"],
                          capture_output=True, text=True)
    assert proc.returncode == 0, f"could not build the ray venv:\n{proc.stderr[-4000:]}"
    return str(Path(proc.stdout.strip().splitlines()[-1]) / "bin" / "python")


DRIVER = """
import json, os, sys, time
import ray

sys.path.append(%(standins)r)
import mechanics


def probe():  # runs in the worker: imports there, not pickled from here
    import vllm.v1.kv_cache_interface as kv
    sys.path.append(%(standins)r)
    import mechanics as m
    return m.report(
        capability=m.mla_capability(kv),
        vllm_own_merge_capability=m.mla_capability(kv, original=True),
        worker_pythonpath=os.environ.get("PYTHONPATH"),
        worker_executable=sys.executable,
    )


@ray.remote(num_cpus=1, max_retries=0)
def task():
    return probe()


@ray.remote(num_cpus=1)
class Worker:
    def report(self):
        return probe()


shim = {"PYTHONPATH": %(repo)r, "PYTHONOPTIMIZE": "1"}
t0 = time.monotonic()
ray.init(num_cpus=2, include_dashboard=False, _node_ip_address="127.0.0.1",
         _temp_dir=%(tmp)r, object_store_memory=100 * 1024 * 1024, log_to_driver=True)
try:
    on = task.options(runtime_env={"env_vars": shim}).remote()
    off = task.options(runtime_env={"env_vars": dict(shim, KIMI_HOTFIX="0")}).remote()
    results = {"task": ray.get(on, timeout=600), "task_off": ray.get(off, timeout=600)}
    actor = Worker.options(runtime_env={"env_vars": shim}).remote()
    results["actor"] = ray.get(actor.report.remote(), timeout=600)
    results["driver"] = {"pid": os.getpid(), "vllm_loaded": "vllm" in sys.modules,
                         "bootstrap_loaded": "kimi_hotfix_sitecustomize" in sys.modules,
                         "seconds": round(time.monotonic() - t0, 1)}
finally:
    ray.shutdown()
mechanics.emit(results)
"""


def test_ray_workers_are_patched_via_runtime_env(tmp_path, release):
    python = ray_python(release)
    ray_tmp = Path("/tmp") / f"kh-ray-{os.getpid()}"  # AF_UNIX paths must stay short
    shutil.rmtree(ray_tmp, ignore_errors=True)
    script = tmp_path / "driver.py"
    script.write_text(DRIVER % {"standins": str(STANDINS), "repo": str(REPO), "tmp": str(ray_tmp)})
    env = hermetic_env(shim=False, RAY_USAGE_STATS_ENABLED="0", RAY_DISABLE_DOCKER_CPU_WARNING="1")
    try:
        proc = run_python([str(script)], python=python, env=env, cwd=tmp_path, timeout=1200)
    finally:
        shutil.rmtree(ray_tmp, ignore_errors=True)
    out = json_lines(proc.stdout)[0]
    driver = out["driver"]
    assert driver["vllm_loaded"] is False and driver["bootstrap_loaded"] is False  # no shim here
    for label in ("task", "actor"):
        worker = out[label]
        assert worker["pid"] != driver["pid"]
        assert worker["worker_executable"] == python
        assert worker["optimize"] == 1, worker  # PYTHONOPTIMIZE reached the worker
        assert worker["bootstrap_loaded"] is True and worker["armed_by"] == ["sitecustomize"]
        assert worker["kimi_hotfix_file"].startswith(str(REPO))
        assert worker["wrapped"]["MLAAttentionSpec.merge"] == {"patch": "kv_spec_merge", "layers": 1}
        assert all(v["layers"] == 1 for v in worker["wrapped"].values())
        assert worker["capability"] is True
        assert worker["vllm_own_merge_capability"] is False  # the bug, same worker
    off = out["task_off"]
    assert off["optimize"] == 1 and off["bootstrap_loaded"] is True
    assert off["wrapped"] == {} and off["capability"] is False  # KIMI_HOTFIX=0: the bug

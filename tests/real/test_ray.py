"""Multi-node reach (issue 4 item 5): a Ray worker is patched.

Ray is installed from the registry into a venv layered over the real vLLM 0.29.0
venv (cached under ~/.cache/kimi-hotfix/venvs; a machine that cannot install it
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

import fcntl
import os
import shutil
from pathlib import Path

import pytest

from harness import venv_python
from helpers import REPO, STANDINS, hermetic_env, json_lines, run_python
from standins.venvs import layered_venv, site_dirs

pytestmark = pytest.mark.releases("0.29.0")

RAY = "ray==2.58.0"
CACHE = Path(os.environ.get("KIMI_HOTFIX_CACHE", Path.home() / ".cache" / "kimi-hotfix"))


def ray_python(release) -> str:
    """The cached venv (vLLM venv packages + ray); built once, under a lock."""
    base = venv_python(release)
    prefix = Path(base).parents[1]
    venv = CACHE / "venvs" / f"ray-over-vllm-{release}"
    base_stamp = prefix / ".kimi-hotfix-stamp"
    stamp_text = f"{RAY} over {prefix}: {base_stamp.read_text().strip() if base_stamp.exists() else '?'}"
    stamp = venv / ".kimi-hotfix-stamp"
    venv.parent.mkdir(parents=True, exist_ok=True)
    with open(venv.parent / f".{venv.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if stamp.exists() and stamp.read_text() == stamp_text:
            return str(venv / "bin" / "python")
        shutil.rmtree(venv, ignore_errors=True)
        python = layered_venv(venv, base, site_dirs(base))
        # the vLLM venv's pip installs ray (and only what the vLLM venv lacks)
        run_python(
            ["-m", "pip", "--python", python, "install", "-q", "--disable-pip-version-check", RAY],
            python=base, env=hermetic_env(shim=False, PIP_ROOT_USER_ACTION="ignore"), timeout=900,
        )
        run_python(["-c", "import ray, vllm"], python=python, env=hermetic_env(shim=False))
        stamp.write_text(stamp_text)
        return python


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

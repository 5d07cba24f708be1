"""Helpers shared by both test tiers (stdlib only; Python 3.9+)."""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
STANDINS = REPO / "tests" / "standins"
JSON_MARK = "KIMI_JSON:"
OPT_FLAGS = {"plain": [], "O": ["-O"], "OO": ["-OO"]}
TOGGLES = ("KIMI_HOTFIX", "KIMI_HOTFIX_DISABLE", "KIMI_HOTFIX_FORCE", "KIMI_HOTFIX_STRICT",
           "KIMI_HOTFIX_LOG_LEVEL", "KIMI_HOTFIX_POD_FILES")
def _registry():
    """(patch names, their target modules), from the package's registry."""
    sys.path.insert(0, str(REPO))
    from kimi_hotfix.runtime import registry
    return registry.names(), tuple(p.target for p in registry.patches().values())


PATCHES, TARGETS = _registry()


def _standin_trees():
    """The stand-in vLLM trees (tests/standins/vllm_tree.py): built from each
    patch's standins.py, so a new patch brings its own."""
    spec = importlib.util.spec_from_file_location("vllm_tree", STANDINS / "vllm_tree.py")
    tree = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tree)
    return tree.build("complete"), tree.build("renamed")


VLLM_COMPLETE, VLLM_RENAMED = _standin_trees()


def copy_checkout(dest: Path) -> list:
    """Copy this checkout's files as git sees them (tracked and new, not
    ignored) to ``dest``; their relative paths."""
    out = subprocess.run(["git", "-C", str(REPO), "ls-files", "-z", "--cached", "--others",
                          "--exclude-standard"], check=True, capture_output=True, timeout=60)
    files = [rel for rel in out.stdout.decode().split("\0") if rel and (REPO / rel).is_file()]
    for rel in files:
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / rel, dest / rel)
    return files
VERSIONS_PY = REPO / "kimi_hotfix" / "runtime" / "versions.py"
SUMMARY = "kimi-hotfix {} (".format(re.search(r'^SHIM = "([^"]+)"', VERSIONS_PY.read_text(), re.M).group(1))


def sample_module(tmp_path, monkeypatch, name: str, source: str):
    """For a fixture to ``yield from``: ``source`` written as ``tmp_path/name.py``
    and imported (a stand-in module whose functions have real source files),
    removed from sys.modules after the test."""
    (tmp_path / f"{name}.py").write_text(source)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield importlib.import_module(name)
    sys.modules.pop(name, None)


def hermetic_env(shim: bool = True, **extra) -> dict:
    """Environment for a child interpreter: CPU vLLM, offline, no stray toggles."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("KIMI_HOTFIX") and k not in ("PYTHONPATH", "PYTHONOPTIMIZE",
                                                         "PYTHONHASHSEED")
    }
    env.update(
        VLLM_TARGET_DEVICE="cpu",
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        VLLM_NO_USAGE_STATS="1",
        VLLM_CACHE_ROOT=os.path.join(tempfile.gettempdir(), "kimi-hotfix-vllm-cache"),
        VLLM_LOGGING_LEVEL="ERROR",
    )
    env.pop("PYTHONDONTWRITEBYTECODE", None)  # let children cache -O/-OO bytecode
    if shim:
        env["PYTHONPATH"] = str(REPO)
    env.update({k: str(v) for k, v in extra.items() if v is not None})
    return env


def run_python(args, *, python=None, flags=(), env=None, cwd=None, timeout=900, check=True):
    """Run ``python [flags] args`` and return the CompletedProcess (text)."""
    cmd = [python or sys.executable, *flags, *args]
    proc = subprocess.run(cmd, env=hermetic_env() if env is None else env, cwd=cwd,
                          capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(
            f"{' '.join(map(str, cmd))[:500]} exited {proc.returncode}\n--- stdout\n"
            f"{proc.stdout[-6000:]}\n--- stderr\n{proc.stderr[-6000:]}"
        )
    return proc


def json_lines(stdout: str) -> list:
    """Objects printed as ``KIMI_JSON:{...}`` lines, in order."""
    return [json.loads(line[len(JSON_MARK):]) for line in stdout.splitlines()
            if line.startswith(JSON_MARK)]


def summary_lines(stderr: str) -> list:
    """Every summary line, in order (all processes)."""
    return [line for line in stderr.splitlines() if SUMMARY in line and " INFO " in line]


def line_states(line: str) -> dict:
    """patch -> its state's kind word(s) in a summary line ("applied",
    "not needed", "failed", ...: the text before any detail)."""
    body = line.split("): ", 1)[1]
    states = dict(part.split(": ", 1) for part in body.split(" | "))
    return {name: text.split(" (")[0].split(":")[0] for name, text in states.items()}


def summary_pid(line: str) -> int:
    return int(re.search(r"kimi-hotfix\[(\d+)\]", line).group(1))


def summaries(stderr: str) -> dict:
    """pid -> that process's summary lines (their message part), in order.
    Raises where a process logged the same line twice in a row: the line is
    logged again only when a state changes."""
    out: dict = {}
    for line in summary_lines(stderr):
        text = line[line.index(SUMMARY):]
        lines = out.setdefault(summary_pid(line), [])
        if lines and lines[-1] == text:
            raise AssertionError(f"the same summary line twice in a row:\n{text}")
        lines.append(text)
    return out


def final_summary(stderr: str) -> str:
    """The last summary line of the one process that logged any."""
    found = summaries(stderr)
    if len(found) != 1:
        raise AssertionError(f"summary lines from {len(found)} processes, not 1:\n{stderr[-3000:]}")
    return next(iter(found.values()))[-1]


def warning_lines(stderr: str) -> list:
    return [line for line in stderr.splitlines() if " WARNING " in line and "kimi-hotfix[" in line]


class OncePool:
    """Computes ``compute(key)`` at most once per key per session, in worker
    threads, at most ``workers`` at a time. ``prefetch`` starts keys early (in
    the order given); ``get`` waits for one; ``results`` are those that finished.
    Both tiers drive their expensive children with it: tests/real/harness.py
    (one vLLM child per configuration) and tests/e2e/runs.py (one server per run).
    With ``jump_queue``, ``get`` computes a key that is still waiting in the queue
    in the calling thread, now (the real tier: a test waits for its own child,
    not for the prefetched ones ahead of it, which another xdist worker may be
    computing); without it (the e2e tier: at most ``workers`` servers), it waits."""

    def __init__(self, workers: int, compute=None, name: str = "pool", jump_queue: bool = False):
        import threading

        self.workers, self.compute, self.name = workers, compute, name
        self.jump_queue = jump_queue
        self.futures: dict = {}
        self.lock = threading.Lock()
        self.executor = None

    def submit(self, key):
        import concurrent.futures

        with self.lock:
            if key not in self.futures:
                if self.executor is None:
                    self.executor = concurrent.futures.ThreadPoolExecutor(
                        self.workers, thread_name_prefix=self.name)
                self.futures[key] = self.executor.submit(self.compute, key)
            return self.futures[key]

    def prefetch(self, keys) -> None:
        for key in dict.fromkeys(keys):
            self.submit(key)

    def get(self, key):
        import concurrent.futures

        if self.jump_queue:
            with self.lock:
                queued = self.futures.get(key)
                here = queued is None or queued.cancel()  # not started: the caller runs it
                if here:  # running from now: another getter waits for it, cannot cancel it
                    self.futures[key] = concurrent.futures.Future()
                    self.futures[key].set_running_or_notify_cancel()
            if here:
                future = self.futures[key]
                try:
                    future.set_result(self.compute(key))
                except BaseException as exc:  # the caller and later getters see it raised
                    future.set_exception(exc)
                return future.result()
        return self.submit(key).result()

    def results(self) -> list:
        return [f.result() for f in self.futures.values()
                if f.done() and not f.cancelled() and not f.exception()]

    def shutdown(self, wait: bool) -> None:
        if self.executor is not None:
            self.executor.shutdown(wait=wait, cancel_futures=True)

"""Running vLLM's own tests (its release sdist's ``tests/``) in several modes, and
comparing them test by test. Used by test_vllm_suite.py; stdlib only.

A mode is an interpreter flag and whether the shim is on PYTHONPATH. Each mode is one
``python -m pytest`` over the selected files (selection.py) in the vLLM venv, all modes
at once, from a copy of the sdist's ``tests/`` (plus its pyproject.toml: vLLM's markers)
in a directory without ``vllm/``: the tests import the venv's installed wheel, never the
sdist's sources (each run records ``vllm.__file__``; the tier checks it). One process per
mode, every test in one fixed order: what a test leaves behind for the next one is the
same in every mode (pytest-xdist would hand tests to workers in a different order each
time).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
PLUGIN_DIR = HERE / "plugin"

RELEASE = "0.29.0"
HASH_SEED = "1"  # every mode; 0, 1 and random seeds gave the same outcomes (DEVELOPING.md)
TEST_TIMEOUT = 120  # seconds per test of vLLM's (kimi_suite_plugin: SuiteTimeout)
RUN_TIMEOUT = 1200  # seconds per mode
REPORT: list = []  # the summary's lines (test_vllm_suite.py fills them, conftest.py prints them)


@dataclass(frozen=True)
class Mode:
    name: str
    label: str
    flags: tuple
    shim: bool


PLAIN = Mode("plain", "plain, no shim", (), False)
O_OFF = Mode("O", "-O, no shim", ("-O",), False)
O_SHIM = Mode("O+shim", "-O, shim", ("-O",), True)
PLAIN_SHIM = Mode("plain+shim", "plain, shim", (), True)
MODES = (PLAIN, O_OFF, O_SHIM)

# what a child inherits from the caller: nothing that changes Python's, pytest's or
# vLLM's behaviour (the modes set their own)
_DROPPED_PREFIXES = ("KIMI_HOTFIX", "VLLM_", "PYTEST_", "HF_", "TRANSFORMERS_")
_DROPPED = {"PYTHONPATH", "PYTHONOPTIMIZE", "PYTHONHASHSEED", "PYTHONDONTWRITEBYTECODE",
            "PYTHONSTARTUP", "PYTHONHOME", "PYTHONSAFEPATH", "PYTHONWARNINGS", "VIRTUAL_ENV"}


def _script(*args) -> str:
    """The last stdout line of one of scripts/ (a venv's or the sdist's path)."""
    proc = subprocess.run([str(REPO / "scripts" / args[0]), *args[1:]], capture_output=True,
                          text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"scripts/{' '.join(args)} exited {proc.returncode}:\n{proc.stderr[-4000:]}")
    return proc.stdout.strip().splitlines()[-1]


def vllm_python(release: str = RELEASE) -> str:
    """The vLLM venv's python: scripts/test's (KIMI_HOTFIX_VENVS), else built here."""
    known = json.loads(os.environ.get("KIMI_HOTFIX_VENVS") or "{}")
    if release in known:
        return known[release]
    return str(Path(_script("build-venv", release)) / "bin" / "python")


def site_packages(venv: Path) -> Path:
    found = sorted(venv.glob("lib/python3.*/site-packages"))
    if len(found) != 1:
        raise RuntimeError(f"{venv}: expected one site-packages, found {found}")
    return found[0]


def suite_deps() -> Path:
    """site-packages of the suite-deps venv (tblib: vLLM's tests/conftest.py imports it)."""
    return site_packages(Path(_script("build-venv", "suite-deps")))


def sdist(release: str = RELEASE) -> Path:
    return Path(_script("get-sdist", release))


def run_tree(tree: Path, work: Path) -> Path:
    """A copy of the sdist's tests/ and pyproject.toml, without its vllm/."""
    root = work / "tree"
    shutil.copytree(tree / "tests", root / "tests")
    shutil.copy2(tree / "pyproject.toml", root / "pyproject.toml")
    if (root / "vllm").exists():
        raise RuntimeError("the run tree must not hold vllm/")
    return root


def child_env(mode: Mode, work: Path, deps: Path) -> dict:
    env = {k: v for k, v in os.environ.items()
           if k not in _DROPPED and not k.startswith(_DROPPED_PREFIXES)}
    path = [str(PLUGIN_DIR), str(deps)]
    if mode.shim:  # the repository root first on PYTHONPATH, as operators deploy it
        path.insert(0, str(REPO))
    env.update(
        PYTHONPATH=os.pathsep.join(path),
        PYTHONHASHSEED=HASH_SEED,
        VLLM_TARGET_DEVICE="cpu",
        VLLM_NO_USAGE_STATS="1",
        VLLM_CACHE_ROOT=str(work / f"vllm-cache-{mode.name}"),
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        HF_HOME=str(work / f"hf-home-{mode.name}"),  # empty: no model of this machine's cache
        KIMI_SUITE_OUT=str(work / f"{mode.name}.json"),
        KIMI_SUITE_TIMEOUT=str(TEST_TIMEOUT),
    )
    return env


@dataclass
class Run:
    mode: Mode
    argv: list
    rc: int = None
    cpu: float = 0.0  # user + system seconds of the pytest process and what it waited for
    wall: float = 0.0
    log: Path = None
    data: dict = field(default_factory=dict)

    @property
    def results(self) -> dict:
        return self.data.get("results", {})

    def outcome(self, nodeid) -> str:
        entry = self.results.get(nodeid)
        return entry["outcome"] if entry else "absent"

    def tail(self, n=3000) -> str:
        return self.log.read_text(errors="replace")[-n:] if self.log and self.log.exists() else ""


def run_modes(python: str, files: list, modes=MODES, *, work: Path, tree: Path, deps: Path) -> dict:
    """Run every mode at once; {mode name: Run}. Each run's CPU comes from wait4."""
    runs, procs = {}, {}
    for mode in modes:
        argv = [python, *mode.flags, "-m", "pytest", "-p", "no:cacheprovider", "-p",
                "kimi_suite_plugin", "-q", "--tb=no", "--continue-on-collection-errors",
                "-o", "addopts=", *files]
        run = runs[mode.name] = Run(mode, argv, log=work / f"{mode.name}.log")
        with open(run.log, "wb") as log:
            procs[mode.name] = (subprocess.Popen(argv, cwd=tree, env=child_env(mode, work, deps),
                                                 stdout=log, stderr=subprocess.STDOUT,
                                                 start_new_session=True), time.monotonic())

    def reap(name):
        proc, t0 = procs[name]
        timer = threading.Timer(RUN_TIMEOUT, lambda: os.killpg(proc.pid, signal.SIGKILL))
        timer.start()
        try:
            _, status, usage = os.wait4(proc.pid, 0)
        finally:
            timer.cancel()
        proc.returncode = os.waitstatus_to_exitcode(status)
        run = runs[name]
        run.rc, run.wall = proc.returncode, time.monotonic() - t0
        run.cpu = usage.ru_utime + usage.ru_stime
        out = work / f"{name}.json"
        run.data = json.loads(out.read_text()) if out.exists() else {}

    threads = [threading.Thread(target=reap, args=(name,)) for name in procs]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return runs


def differences(base: Run, other: Run) -> dict:
    """{nodeid: (base outcome, other outcome, other's failure line, vLLM frame)} for
    every test (or file that failed to collect) whose outcome differs."""
    diff = {}
    for nodeid in sorted(set(base.results) | set(other.results)):
        a, b = base.outcome(nodeid), other.outcome(nodeid)
        if a != b:
            entry = other.results.get(nodeid) or base.results.get(nodeid)
            diff[nodeid] = (a, b, entry["line"], entry["vllm"])
    errors_a, errors_b = (r.data.get("collect_errors", {}) for r in (base, other))
    for path in sorted(set(errors_a) ^ set(errors_b)):
        diff[path] = ("collected" if path not in errors_a else "collection error",
                      "collected" if path not in errors_b else "collection error",
                      errors_b.get(path) or errors_a.get(path), "")
    return diff


def counts(run: Run) -> dict:
    found: dict = {}
    for entry in run.results.values():
        key = entry["outcome"].split(" ")[0]  # "error in setup" -> "error"
        found[key] = found.get(key, 0) + 1
    return found


def describe(run: Run) -> str:
    c = counts(run)
    parts = ", ".join(f"{c[k]} {k}" for k in ("passed", "failed", "error", "skipped", "xfailed",
                                               "xpassed") if c.get(k))
    errors = len(run.data.get("collect_errors", {}))
    return (f"{sum(c.values())} tests ({parts})" + (f", {errors} files not collected" if errors else "")
            + f"; {run.cpu:.0f} CPU-s, {run.wall:.0f} s")


if __name__ == "__main__":  # a quick look by hand: python tests/vllm_suite/suite.py FILE...
    import tempfile

    with tempfile.TemporaryDirectory(prefix="kimi-suite-") as tmp:
        work = Path(tmp)
        found = run_modes(vllm_python(), sys.argv[1:] or ["tests/v1/core"], work=work,
                          tree=run_tree(sdist(), work), deps=suite_deps())
        for r in found.values():
            print(f"{r.mode.label}: rc {r.rc}; {describe(r)}")
        for name, r in found.items():
            if name != PLAIN.name:
                for nodeid, d in differences(found[PLAIN.name], r).items():
                    print(f"  {name}: {nodeid}: {d[0]} -> {d[1]}: {d[2][:150]} [{d[3]}]")

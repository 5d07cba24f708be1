"""The real-vLLM tier: one pytest session drives children in every vLLM venv.

Releases (``release`` parameter; ``--release R`` picks, default all):
  0.28.0, 0.29.0, 0.30.0, 0.33.0   Python 3.11 venvs
  0.29.0-py3.12                    vLLM 0.29.0 on Python 3.12 (vLLM's own image)

A test says which releases it is for with ``@pytest.mark.releases(...)``; it is
parametrized over those and the others are deselected (never skipped). The
venvs come from ``KIMI_HOTFIX_VENVS`` (JSON release -> python, set by
scripts/test) or are built here with scripts/build-venv.

Importing vLLM costs seconds, so a configuration (release, scenario, -O level,
hash seed) runs ``child.py`` once and every test reads its sections
(``child(release, "on", "O", 0)``). ``PLAN`` lists the configurations the tests
read; the session starts them all at once, for the releases it runs, in a
pool of worker threads (one child each), while the tests run. Results are also
kept as JSON under ``KIMI_HOTFIX_TEST_CACHE`` when set, for one session only.

scripts/test runs the tier with pytest-xdist (``-n auto``): each worker process
has its own pool, and the JSON files (one lock each) make every child run once
for all of them: a worker that wants a child another is computing waits for it
and reads its file. The workers share the cores: each has ``cores // workers``
pool threads, and each starts the plan at its own offset (``prefetch_order``),
so two workers do not queue behind the same child.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import subprocess
import threading
import time
from pathlib import Path

import pytest

from helpers import OPT_FLAGS, REPO, OncePool, hermetic_env, json_lines  # noqa: E402

RELEASES = ("0.28.0", "0.29.0", "0.30.0", "0.33.0", "0.29.0-py3.12")
DEFAULT_RELEASES = ("0.29.0", "0.30.0", "0.33.0")
CHILD = Path(__file__).resolve().parent / "child.py"
# what the tests read, per release: "scenario:opt:seed"
# Each child costs an interpreter and a vLLM import (about 12 s of CPU): a
# configuration is here only where its result can differ, and a claim that only
# needs some process of a kind rides in a child that runs anyway. The shim's
# merges raise before vLLM's set.pop(), so more hash seeds and PYTHONOPTIMIZE
# earn their cost on one release (0.29.0), where PYTHONOPTIMIZE's run imports
# the targets from three threads at once; -OO
# differs from -O in bytecode, so every release has it (Python 3.12 too); the
# unpatched -O seed 1 shows the other set.pop() outcome on each release, on
# 0.29.0 with every patch disabled by name (KIMI_HOTFIX_DISABLE=*) rather than
# by the kill switch. Strict mode rides in the -O child's failures section, the
# strict "cannot tell" in the ctor child's last section, the plugin loader, a
# reload and another library's wrappers at the end of 0.29.0's children
# (child_spec); garbage in every toggle at once and strict without wrapt are the
# shim's own mechanics (tests/unit/test_faults.py); the overlay's -O seed-0 run
# is the shim's (it steps aside: nothing of it runs). Issue 30 took 4 children
# and 6 own processes out this way.
SHIM_RUNS = ("on:plain:0", "on:O:0", "pyoptimize:plain:1", "on:OO:3")
SHIM_RUNS_SHORT = ("on:plain:0", "on:O:0", "on:OO:3")
UNPATCHED = ("off:plain:0", "off:O:0", "off:O:1")
UNPATCHED_O = ("off:O:0", "off:O:1", "disable:O:1")  # the -O reproductions
PLAN = {
    "0.28.0": ("on:plain:0", "on:O:0"),
    "0.29.0": SHIM_RUNS + ("off:plain:0", "off:O:0", "disable:O:1",
                           "no_source:plain:0", "no_source:O:0", "late:O:0", "stale:O:0"),
    "0.30.0": SHIM_RUNS_SHORT + UNPATCHED,
    "0.33.0": SHIM_RUNS_SHORT + UNPATCHED + ("ctor:plain:0", "ctor:O:0", "upstream:O:0",
                                             "upstream_off:O:1", "upstream_off:OO:3"),
    "0.29.0-py3.12": SHIM_RUNS_SHORT,
}
# scenario name -> (environment on top of hermetic_env(), child spec)
SCENARIOS = {
    "on": ({}, {}),
    "off": ({"KIMI_HOTFIX": "0"}, {}),
    "disable": ({"KIMI_HOTFIX_DISABLE": "*"}, {}),
    "pyoptimize": ({"PYTHONOPTIMIZE": "1"}, {"threads": True}),  # -O through the environment
    "no_source": ({}, {"no_source": True}),
    "ctor": ({}, {"fail_mla_ctor": True}),
    # vLLM with upstream/'s patch applied, through an overlay first on PYTHONPATH
    "upstream": ({}, {"overlay": True}),
    "upstream_off": ({"KIMI_HOTFIX": "0"}, {"overlay": True}),
    # an APM launcher's sitecustomize first on PYTHONPATH shadows the bootstrap: vLLM's
    # plugin loader arms the shim after every target was imported (test_launcher.py);
    # vLLM from the stale tree, no bytecode written: -O parity's late path decides by
    # Python's own rule which code ran (issue 36 item 1)
    "late": ({"PYTHONDONTWRITEBYTECODE": "1"},
             {"late": True, "stale": True,
              "sections": ["process", "wrapped", "kv", "plans", "kda"]}),
    # issue 36 item 1's container: vLLM's files copied with a later mtime than their
    # .pyc records (a copy, a layer rebuild), no bytecode written (PYTHONDONTWRITEBYTECODE)
    "stale": ({"PYTHONDONTWRITEBYTECODE": "1"}, {"stale": True, "sections": [
        "process", "wrapped", "kv"]}),
}
# vLLM's modules the stale tree holds as copies (a later mtime than their .pyc records)
STALE = ("vllm/v1/kv_cache_interface.py", "vllm/distributed/parallel_state.py",
         "vllm/config/vllm.py")


def child_spec(name, opt, seed, release=None) -> dict:
    """The scenario's spec, plus what some configurations also run: ``python -m
    kimi_hotfix check`` first thing in the shim's seed-0 plain and -O children (what
    docs/samples show, and check's text), the -O parity cases in the unpatched
    seed-0 children (test_o_parity.py)."""
    spec = dict(SCENARIOS[name][1])
    if name == "on" and seed == 0 and opt in ("plain", "O"):
        spec["cli"] = True
    if name == "off" and seed == 0:
        spec["o_parity"] = True
    # claims that ride at the end of a child that runs anyway (issue 30): vLLM's plugin
    # loader after the bootstrap (on and off), a reload and re-import, and another
    # library wrapping what the shim wrapped (PYTHONOPTIMIZE=1 is -O's level)
    if (release, opt, seed) == ("0.29.0", "O", 0) and name in ("on", "off"):
        spec["plugins"] = True
        spec["reimport"] = name == "on"
    if (release, name, opt, seed) == ("0.29.0", "pyoptimize", "plain", 1):
        spec["coexist"] = True
    return spec


UPSTREAM_PATCH = REPO / "upstream" / "0001-kv-cache-spec-merge-explicit-checks.patch"
UPSTREAM_PATCHES = sorted((REPO / "upstream").glob("000*.patch"))  # every fix for vLLM


def parse_key(release, name="on", opt="plain", seed=0):
    if release not in RELEASES or name not in SCENARIOS or opt not in OPT_FLAGS:
        raise ValueError(f"unknown configuration {(release, name, opt, seed)}")
    return (release, name, opt, int(seed))


# -- venvs ---------------------------------------------------------------------

_venv_lock = threading.Lock()
_venvs: dict = {}


def venv_python(release: str) -> str:
    """The python of the venv holding ``release`` (built if needed)."""
    with _venv_lock:
        if release not in _venvs:
            known = json.loads(os.environ.get("KIMI_HOTFIX_VENVS") or "{}")
            if release in known:
                _venvs[release] = known[release]
            else:
                version, _, py = release.partition("-py")
                args = [str(REPO / "scripts" / "build-venv"), version]
                if py:
                    args += ["--python", py]
                proc = subprocess.run(args, capture_output=True, text=True)
                if proc.returncode != 0:
                    pytest.fail(f"could not build the venv for {release}:\n{proc.stderr[-4000:]}")
                _venvs[release] = str(Path(proc.stdout.strip().splitlines()[-1]) / "bin" / "python")
        return _venvs[release]


# -- children ------------------------------------------------------------------


# lines for the end of the session (conftest.py prints them, through xdist's
# controller when the tier runs in workers)
REPORT_LINES: list = []
COUNTS: dict = {}  # what a module counted for the report (the fault tier's drivers and cases)


class Run:
    """One child's output: ``sections`` by name, ``stderr`` split at the failures
    section (``stderr`` is what came before it), the return code; ``ran_here``:
    this process ran it (not read from another worker's file)."""

    def __init__(self, key, proc, seconds, cpu=None, ran_here=True):
        self.key, self.rc, self.seconds, self.cpu = key, proc.returncode, seconds, cpu
        self.ran_here = ran_here
        self.stderr, _, self.failures_stderr = proc.stderr.partition("KIMI_SECTION:failures")
        self.failures_stderr = self.failures_stderr.partition("KIMI_SECTION:")[0]  # its own only
        self.full_stderr = proc.stderr
        # what the process logged before its first section: start-up, imports, arming
        self.start_stderr = proc.stderr.partition("KIMI_SECTION:")[0]
        found = json_lines(proc.stdout)
        self.out = found[-1] if found else {}
        self.sections = self.out.get("sections", {})

    def section_stderr(self, name) -> str:
        """What the child logged while its section ``name`` ran."""
        return self.full_stderr.partition(f"KIMI_SECTION:{name}\n")[2].partition("KIMI_SECTION:")[0]

    def __getitem__(self, name):
        if self.rc != 0 or name not in self.sections:
            raise AssertionError(f"child {self.key} exited {self.rc}, no section {name!r}:\n"
                                 f"{self.stderr[-6000:]}")
        value = self.sections[name]
        if isinstance(value, dict) and set(value) == {"error"}:
            raise AssertionError(f"child {self.key}: section {name} failed:\n{value['error']}")
        return value

    @property
    def states(self):
        return {name: s["text"] for name, s in self["process"]["states"].items()}

    @property
    def kinds(self):
        return {name: s["kind"] for name, s in self["process"]["states"].items()}


_overlay_lock = threading.Lock()
_overlays: dict = {}


def vllm_location(python) -> Path:
    """The directory that holds the ``vllm`` package of ``python``'s venv."""
    proc = subprocess.run([python, "-c", "import importlib.util as u; "
                           "print(list(u.find_spec('vllm').submodule_search_locations)[0])"],
                          capture_output=True, text=True, check=True,
                          env=hermetic_env(shim=False))
    return Path(proc.stdout.strip()).parent


def _overlay_module():
    """upstream/overlay.py, loaded as a module (it is a script, not a package)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("kimi_upstream_overlay",
                                                  REPO / "upstream" / "overlay.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _session_root() -> Path:
    """Where a session's shared trees go: the test cache every xdist worker sees,
    else a directory of this process's own."""
    import tempfile

    shared = os.environ.get("KIMI_HOTFIX_TEST_CACHE")
    return Path(shared) if shared else Path(tempfile.mkdtemp())


def upstream_overlay(release) -> dict:
    """Every patch in upstream/ applied to ``release``'s vLLM in an overlay (built
    once): one file concatenating them, which ``patch -p1`` applies in turn."""
    with _overlay_lock:
        if release not in _overlays:
            module, site = _overlay_module(), vllm_location(venv_python(release))
            # one overlay per session: every xdist worker uses the one the first built
            # (so the children that run on it are cached like the others)
            root = _session_root()
            dest = root / f"overlay-{release}"
            with open(root / f"overlay-{release}.lock", "w") as lock:
                fcntl.flock(lock, fcntl.LOCK_EX)
                record = root / f"overlay-{release}.json"
                if record.exists():  # built by another worker: what it measured before
                    saved = json.loads(record.read_text())
                    touched, before = saved["touched"], saved["hashes_before"]
                else:
                    combined = root / f"upstream-{release}.patch"
                    combined.write_text("".join(p.read_text() for p in UPSTREAM_PATCHES))
                    touched = module.patch_paths(combined)
                    before = {rel: module.sha256(site / rel) for rel in touched}
                    module.make_overlay(site, combined, dest)
                    record.write_text(json.dumps({"touched": touched, "hashes_before": before}))
            _overlays[release] = {"path": dest, "site": site, "touched": touched,
                                  "hashes_before": before, "module": module}
        return _overlays[release]


_stale_trees: dict = {}


def stale_tree(release) -> Path:
    """vLLM as installed, linked file by file (bytecode too: upstream/overlay.py's
    tree), but for real copies of ``STALE``: each with a modification time a
    minute later than the one its ``.pyc`` files (plain, -O, -OO, compiled here
    from the same bytes) record, as a copy or a layer rebuild leaves them. The
    venv is not touched. Built once per session."""
    with _overlay_lock:
        if release not in _stale_trees:
            import shutil

            module, site = _overlay_module(), vllm_location(venv_python(release))
            root = _session_root()
            dest = root / f"stale-{release}"
            with open(root / f"stale-{release}.lock", "w") as lock:
                fcntl.flock(lock, fcntl.LOCK_EX)
                if not (dest / "vllm").exists():
                    dest.mkdir(parents=True, exist_ok=True)
                    module._link_tree(site / "vllm", dest / "vllm", set())
                    compile_them = []
                    for rel in STALE:
                        (dest / rel).unlink()
                        shutil.copy2(site / rel, dest / rel)  # the same bytes and mtime
                        cache, prefix = module._bytecode_of(rel)
                        for old in (dest / cache).glob(prefix + "*"):
                            old.unlink()  # links to the venv's: compiled afresh below
                        compile_them.append(str(dest / rel))
                    code = ("import py_compile, sys\n"
                            "for path in sys.argv[1:]:\n"
                            "    for level in (0, 1, 2):\n"
                            "        py_compile.compile(path, doraise=True, optimize=level)\n")
                    subprocess.run([venv_python(release), "-c", code, *compile_them], check=True,
                                   env=hermetic_env(shim=False), timeout=300)
                    for path in compile_them:  # now a minute later than the .pyc records
                        info = os.stat(path)
                        os.utime(path, (info.st_atime, info.st_mtime + 60))
            _stale_trees[release] = dest
        return _stale_trees[release]


def _compute(key):
    release, name, opt, seed = key
    extra, _ = SCENARIOS[name]
    spec = child_spec(name, opt, seed, release)
    env = hermetic_env(PYTHONHASHSEED=seed, **extra)
    if spec.get("overlay"):
        env["PYTHONPATH"] = os.pathsep.join([str(upstream_overlay(release)["path"]), str(REPO)])
    if spec.get("stale"):
        first = [str(REPO / "tests" / "standins" / "apm_site")] if spec.get("late") else []
        env["PYTHONPATH"] = os.pathsep.join([*first, str(stale_tree(release)), str(REPO)])
    cache = os.environ.get("KIMI_HOTFIX_TEST_CACHE")
    path = None
    if cache:
        digest = hashlib.sha256(json.dumps(key).encode()).hexdigest()[:16]
        path = Path(cache) / f"child-{digest}.json"
    cmd = [venv_python(release), *OPT_FLAGS[opt], str(CHILD), json.dumps(spec)]
    lock = open(f"{path}.lock", "w") if path else None
    try:
        if lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
        if path and path.exists():
            saved = json.loads(path.read_text())
            proc = subprocess.CompletedProcess(cmd, saved["rc"], saved["stdout"], saved["stderr"])
            return Run(key, proc, saved["seconds"], saved.get("cpu"), ran_here=False)
        t0 = time.monotonic()
        proc = subprocess.run(cmd, env=env, cwd=str(REPO), capture_output=True, text=True,
                              timeout=900)
        seconds = time.monotonic() - t0
        found = json_lines(proc.stdout)
        cpu = found[-1].get("cpu") if found else None  # the child's own, as it printed
        if path:
            path.write_text(json.dumps({"rc": proc.returncode, "stdout": proc.stdout,
                                        "stderr": proc.stderr, "seconds": seconds, "cpu": cpu}))
        return Run(key, proc, seconds, cpu)
    finally:
        if lock:
            lock.close()


def xdist_worker() -> tuple:
    """(this worker's index, the number of workers): (0, 1) without xdist."""
    name = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    return int(name[2:] or 0), int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))


def prefetch_order(keys: list) -> list:
    """``keys`` rotated to this worker's share: worker i of n starts i/n of the way in."""
    index, count = xdist_worker()
    start = len(keys) * index // count
    return keys[start:] + keys[:start]


POOL = OncePool(max(1, min(4, os.cpu_count() or 1) // xdist_worker()[1]), _compute,
                name="vllm-child", jump_queue=True)


def child(release, name="on", opt="plain", seed=0) -> Run:
    """The output of child.py for one configuration (computed once per session)."""
    return POOL.get(parse_key(release, name, opt, seed))


def reference() -> Run:
    """vLLM 0.33.0 as released, plain Python, the shim off: the grouping and KDA reference."""
    return child("0.33.0", "off")


def plan_reference() -> Run:
    """vLLM 0.30.0 as released, plain Python, the shim off: the capture-plan reference."""
    return child("0.30.0", "off")

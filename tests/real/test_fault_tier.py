"""The fault tier (issue 20): a fault in any file of the shim never takes vLLM
down, and no state it reports is untrue. What the cases are, where they run
and why: tests/real/fault_tier.py; the driver: tests/real/fault_child.py.

For every file a process loads (measured from a healthy run of each mode),
made missing, given a syntax error, made to raise at import, deployed through
PYTHONPATH, the bundle and the plugin, plain and -O:

- vLLM imports and works as in the healthy run;
- every patch reads as in the healthy run or ``failed`` with the cause; where
  the core itself cannot load, one INACTIVE line names the cause;
- a line with the shim's prefix names the cause (where the host loads the
  file itself, before any shim code: the host's own error does);
- ``python -m kimi_hotfix status`` prints a report naming the cause and exits
  non-zero;
- in strict mode the import raises, with the cause.

docs/fault-matrix.md's generated table is rendered from these results
(``render_matrix``); scripts/docs rewrites it.
"""

from __future__ import annotations

import atexit
import os
import shutil
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import fault_child as fc
import fault_tier as ft
import pytest

from harness import COUNTS, REPORT_LINES, venv_python
from helpers import PATCHES, REPO, VLLM_COMPLETE, OncePool, hermetic_env, line_states, summaries

pytestmark = pytest.mark.releases("0.29.0")
DRIVERS = list(ft.DRIVERS)  # in this order: real -O preloads what real plain measured
MATRIX = REPO / "docs" / "fault-matrix.md"

_masters_lock = threading.Lock()
_masters: dict = {}


def workdir() -> Path:
    """A new directory under the session's cache (scripts/test removes it),
    else under the temporary directory, removed when this process exits."""
    root = os.environ.get("KIMI_HOTFIX_TEST_CACHE")
    path = Path(tempfile.mkdtemp(prefix="fault-tier-", dir=root or None))
    if not root:
        atexit.register(shutil.rmtree, path, True)
    return path


def masters(release: str) -> dict:
    with _masters_lock:
        if release not in _masters:
            _masters[release] = ft.build_masters(REPO, venv_python(release), workdir(),
                                                 ("pythonpath", "bundle", "plugin"))
        return _masters[release]


def run_driver(key) -> dict:
    release, target, opt = key
    deps = None
    if (target, opt) == ("real", "O"):  # vLLM's dependencies, as the plain driver measured them
        plain = POOL.futures.get((release, "real", "plain"))
        if plain is not None and (plain.running() or plain.done()):
            deps = plain.result()["deps_list"]
    return ft.run_driver(driver_python(release, target), masters(release), target, opt,
                         workdir(), VLLM_COMPLETE, hermetic_env(shim=False), deps)


def driver_python(release, target) -> str:
    """The release's venv; for the stand-in, this interpreter where it is the same
    Python (it has wrapt; with far fewer distributions, status reads less metadata)."""
    python = venv_python(release)
    if target == "standin":
        same = subprocess.run([python, "-c", "import sys; print(sys.version)"],
                              capture_output=True, text=True).stdout.strip() == sys.version
        if same:
            return sys.executable
    return python


POOL = OncePool(2, run_driver, name="fault-driver")


def results(release: str = "0.29.0") -> list:
    POOL.prefetch((release, *d) for d in DRIVERS)
    return [POOL.get((release, *d)) for d in DRIVERS]


def driver(target, opt, release="0.29.0") -> dict:
    results(release)
    return POOL.get((release, target, opt))


@pytest.fixture(scope="module", autouse=True)
def report_cost():
    """After the module: the fault tier's cases and child-seconds, per driver."""
    yield
    done = [f.result() for f in POOL.futures.values() if f.done() and not f.exception()]
    COUNTS["fault drivers"] = len(done)
    COUNTS["fault cases"] = sum(len(r["cases"]) + len(r["baselines"]) + ("chain" in r)
                                + ("fork" in r) for r in done)
    if done:
        parts = ", ".join(f"{r['target']} {r['opt']}: {len(r['cases'])} cases {r['cpu_seconds']} s"
                          for r in done)
        REPORT_LINES.append(f"fault tier: {parts}; {sum(r['cpu_seconds'] for r in done):.0f} "
                            "child-seconds (CPU)")


def failures(found: dict) -> str:
    return "\n\n".join(f"{case}:\n  " + "\n  ".join(p) for case, p in found.items())


@pytest.mark.parametrize("target,opt", DRIVERS, ids=["-".join(d) for d in DRIVERS])
def test_healthy_runs_and_every_loaded_file_is_a_case(release, target, opt):
    out = driver(target, opt, release)
    # what the driver preloads for its cases: the targets and the standard library
    # it names must load; only vLLM's other dependencies may fail (issue 30 item 9)
    named = set(fc.STDLIB) | set(fc.PLUGIN_TARGETS) | set(fc.STANDIN_TARGETS)
    assert not named & set(out["preload_failed"]), out["preload_failed"]
    for mode, healthy in out["baselines"].items():
        assert healthy["import_error"] is None, healthy["import_traceback"]
        assert ft.WARNING.search(healthy["stderr"]) is None, healthy["stderr"][-3000:]
        states = healthy["states"]
        assert states and not [s for s in states.values() if s.startswith("failed")], states
        if opt == "plain":  # the stand-in vLLM has no distribution: status says idle (exit 3)
            expected = 0 if target == "real" else 3
            assert healthy["status"]["rc"] == expected, healthy["status"]
            assert "BROKEN" not in healthy["status"]["stdout"], healthy["status"]
        files = out["files"][mode]
        shim, vllm, status = (set(files["all"]) & set(files[k]) for k in ("all", "vllm", "status"))
        if opt == "plain":  # (status runs in the plain drivers)
            # what a vLLM process loads of the shim, status loads too (it sees it broken) ...
            assert vllm - set(ft.ENTRY[mode]) <= status, mode
        assert {"kimi_hotfix/runtime/core.py", "kimi_hotfix/runtime/registry.py"} <= vllm
        # ... and every file of the shim either loads is a candidate, run as the plan says
        assert files["cases"] == sorted(vllm | status)
        ran = {(c["rel"], c["fault"], c["strict"]) for c in out["cases"] if c["mode"] == mode}
        assert ran == set(ft.plan(target, opt, mode, files["cases"]))
        if target == "standin" and mode == "pythonpath" and opt == "plain":
            faults = {(rel, f) for rel, f, strict in ran if not strict}
            assert faults == {(rel, f) for rel in files["cases"] for f in ft.FAULTS}


@pytest.mark.parametrize("target", ["standin", "real"])
def test_every_file_a_process_loads_is_a_case(release, target):
    """Across the drivers of a target, each file of the shim a healthy vLLM
    process of a mode loads has a fault case in that mode (the real vLLM's
    PYTHONPATH and bundle: every third file, by the plan); each mode has
    strict cases (the stand-in's PYTHONPATH: one for every file)."""
    runs = [r for r in results(release) if r["target"] == target]
    for mode in ft.MODES:
        loaded = set().union(*(set(r["files"][mode]["vllm"]) & set(r["files"][mode]["all"])
                               for r in runs if mode in r["files"]))
        if not loaded:
            continue
        ran = [c for r in runs for c in r["cases"] if c["mode"] == mode]
        if target == "standin" or mode == "plugin":
            assert loaded <= {c["rel"] for c in ran if not c["strict"]}, mode
        strict = {c["rel"] for c in ran if c["strict"]}
        assert loaded <= strict if (target, mode) == ("standin", "pythonpath") else strict, mode


@pytest.mark.parametrize("target,opt", DRIVERS, ids=["-".join(d) for d in DRIVERS])
def test_a_fault_never_takes_vllm_down_and_every_state_is_true(release, target, opt):
    out = driver(target, opt, release)
    found = {}
    for case in out["cases"]:
        if case["strict"]:
            continue
        baseline = out["baselines"][case["mode"]]
        wrong = ft.problems(case, baseline, status=opt == "plain")
        if wrong:
            found[case["id"]] = wrong + [case["stderr"][-1500:]]
    assert not found, failures(found)


@pytest.mark.parametrize("target,opt", DRIVERS, ids=["-".join(d) for d in DRIVERS])
def test_strict_mode_raises_with_the_cause(release, target, opt):
    out = driver(target, opt, release)
    strict = [c for c in out["cases"] if c["strict"]]
    assert strict
    found = {}
    for case in strict:
        wrong = ft.strict_problems(case, out["baselines"][case["mode"]])
        if wrong:
            found[case["id"]] = wrong + [case["stderr"][-1500:]]
    assert not found, failures(found)


def test_the_fault_matrix_doc_is_generated_from_these_runs(release):
    text = MATRIX.read_text()
    assert ft.render_into(text, results(release)) == text, (
        "docs/fault-matrix.md differs from the fault tier's results: run scripts/docs --faults")


@pytest.mark.releases("0.29.0")
def test_the_installed_plugin_alone_arms_on_the_real_vllm(release):
    """pip's layout, no PYTHONPATH, vLLM 0.29.0 imported under -O before vLLM's
    own plugin loader runs (the -O driver's healthy plugin run; it was a process
    of its own in test_plugin.py): the plugin arms the shim, every target is
    wrapped once, and the merge keeps the draft capability that vLLM's own -O
    merge drops, in the same process."""
    healthy = driver("real", "O", release)["baselines"]["plugin"]
    out = healthy["plugin_report"]
    assert out["armed_before"] is False and out["bootstrap_loaded"] is False
    assert out["armed_by"] == ["vllm-plugin"]
    assert out["kimi_hotfix_file"] == os.path.join(out["tree"], "kimi_hotfix", "__init__.py")
    assert set(out["kinds"].values()) == {"applied"}, out["states"]
    assert {v["patch"] for v in out["wrapped"].values()} == set(PATCHES), out["wrapped"]
    assert all(v["layers"] == 1 for v in out["wrapped"].values()), out["wrapped"]
    # vLLM's own merge, given plain code in place by -O parity's late path: it refuses the pair
    assert out["capability"] is True and out["vllm_own_merge_capability"] == "AssertionError"
    (lines,) = summaries(healthy["stderr"]).values()  # armed after the imports: one line
    assert line_states(lines[-1]) == dict.fromkeys(PATCHES, "applied"), lines

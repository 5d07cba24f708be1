"""The pytest plugin loaded (``-p kimi_suite_plugin``) into each run of vLLM's own
tests by tests/vllm_suite: it selects, it makes the runs cheap, it records.

- Asserts of vLLM's test helpers (``tests.*``: tests/utils.py, tests/v1/core/utils.py)
  are rewritten like the test modules' (``register_assert_rewrite``): under ``-O`` the
  tests and their helpers still check, and only vLLM's own asserts are stripped.
- Where a file marks tests ``cpu_test`` (vLLM's CPU CI runs ``-m cpu_test``), its
  unmarked tests are deselected; a file without the mark runs whole.
- vLLM's autouse cleanup after each test (``cleanup_dist_env_and_memory``: the envs
  cache reset, the parallel groups destroyed, then a full ``gc.collect()`` over torch
  and vLLM) runs with a collection of the youngest generation instead of the full one
  (the automatic collections go on as usual): the full one costs about 0.3 s of CPU
  per test here, ten times the tests themselves. The rest of the cleanup stays, as
  vLLM's CI runs it (vLLM's own ``skip_global_cleanup`` mark would drop it all).
- A test that runs longer than ``KIMI_SUITE_TIMEOUT`` seconds fails with
  ``SuiteTimeout`` (an assert stripped under ``-O`` can leave a loop running).
- At the end it writes ``KIMI_SUITE_OUT`` (JSON): each test's outcome, the first line of
  its failure and the deepest frame in vLLM's installed package that it went through,
  plus what this process was (``vllm.__file__``, the optimize flag, the hash seed, the
  shim's states when it is loaded) and the processes the tests started.
"""

from __future__ import annotations

import gc
import json
import os
import signal
import subprocess
import sys
import time

import pytest

pytest.register_assert_rewrite("tests")

_results: dict = {}
_collect_errors: dict = {}
_deselected = [0]
# commands: program -> count; where: (the test running or "import", argv's start), the first 20
_started = {"forks": 0, "subprocesses": 0, "commands": {}, "where": []}
_t0 = time.monotonic()


class SuiteTimeout(Exception):
    pass


def _count_fork():
    _started["forks"] += 1


os.register_at_fork(after_in_parent=_count_fork)
_popen_init = subprocess.Popen.__init__


def _counting_init(self, args, *rest, **kwargs):
    _started["subprocesses"] += 1
    argv = [args] if isinstance(args, (str, bytes, os.PathLike)) else list(args)
    program = os.path.basename(str(argv[0]).split()[0]) if argv else "?"
    _started["commands"][program] = _started["commands"].get(program, 0) + 1
    if len(_started["where"]) < 20:
        test = os.environ.get("PYTEST_CURRENT_TEST", "import or collection")
        _started["where"].append([test, [str(a)[:80] for a in argv[:4]]])
    _popen_init(self, args, *rest, **kwargs)


subprocess.Popen.__init__ = _counting_init


def _first_line(report) -> str:
    longrepr = report.longrepr
    crash = getattr(longrepr, "reprcrash", None)
    if crash is not None:
        text = crash.message
    elif isinstance(longrepr, tuple):  # a skip: (path, line, reason)
        text = longrepr[2]
    else:
        text = str(longrepr)
    lines = [line for line in str(text).splitlines() if line.strip()]
    return lines[0][:400] if lines else ""


def _vllm_frame(excinfo) -> str:
    """'vllm/x/y.py:LINE in function' of the deepest frame in the installed vllm."""
    import vllm

    root = os.path.dirname(vllm.__file__)
    found = ""
    tb = excinfo.tb if excinfo else None
    while tb is not None:
        path = tb.tb_frame.f_code.co_filename
        if path.startswith(root + os.sep):
            rel = "vllm/" + os.path.relpath(path, root)
            found = f"{rel}:{tb.tb_lineno} in {tb.tb_frame.f_code.co_name}"
        tb = tb.tb_next
    return found


class _YoungCollections:
    """``gc`` for vllm.distributed.parallel_state: ``collect()`` collects generation 0
    only (where the garbage a test just made is); everything else is the gc module."""

    def __getattr__(self, name):
        return getattr(gc, name)

    calls = 0

    def collect(self, generation=1):
        _YoungCollections.calls += 1
        return gc.collect(0)


def pytest_collection_finish(session):
    """After vLLM's conftest imported vLLM: its cleanup's full collection made young
    (the tier checks that it ran: ``cleanups`` in the record)."""
    from vllm.distributed import parallel_state

    if parallel_state.gc is not gc:
        raise RuntimeError(f"vllm.distributed.parallel_state.gc is {parallel_state.gc!r}")
    parallel_state.gc = _YoungCollections()


def pytest_collection_modifyitems(config, items):
    marked_files = {item.nodeid.split("::", 1)[0] for item in items
                    if item.get_closest_marker("cpu_test")}
    keep, drop = [], []
    for item in items:
        path = item.nodeid.split("::", 1)[0]
        if path in marked_files and not item.get_closest_marker("cpu_test"):
            drop.append(item)
        else:
            keep.append(item)
    if drop:
        _deselected[0] += len(drop)
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    entry = _results.setdefault(item.nodeid, {"outcome": None, "line": "", "vllm": "",
                                              "seconds": 0.0})
    entry["seconds"] = round(entry["seconds"] + report.duration, 4)
    if report.when == "call":
        if hasattr(report, "wasxfail"):
            result = "xfailed" if report.skipped else "xpassed"
        else:
            result = report.outcome
        if entry["outcome"] in (None, "passed"):
            entry["outcome"] = result
    elif report.failed:  # setup or teardown
        if entry["outcome"] in (None, "passed"):
            entry["outcome"] = f"error in {report.when}"
    elif report.skipped and report.when == "setup":
        entry["outcome"] = "xfailed" if hasattr(report, "wasxfail") else "skipped"
    if (report.failed or report.skipped) and not entry["line"]:
        entry["line"] = _first_line(report)
        if report.failed:
            entry["vllm"] = _vllm_frame(call.excinfo)


def pytest_collectreport(report):
    if report.failed:
        _collect_errors[report.nodeid] = _first_line(report)


def _alarm(signum, frame):
    raise SuiteTimeout(f"over {os.environ.get('KIMI_SUITE_TIMEOUT')} s (kimi_suite_plugin)")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    limit = int(os.environ.get("KIMI_SUITE_TIMEOUT") or 0)
    if limit:
        signal.signal(signal.SIGALRM, _alarm)
        signal.alarm(limit)
    try:
        yield
    finally:
        if limit:
            signal.alarm(0)


def _shim() -> dict:
    if "kimi_hotfix" not in sys.modules:
        return {"loaded": False}
    core = sys.modules.get("kimi_hotfix.runtime.core")
    if core is None:
        return {"loaded": True, "armed": False}
    try:
        states = {name: {"kind": str(state.kind), "text": str(state)}
                  for name, state in core.states().items()}
        return {"loaded": True, "armed": True, "states": states, "line": core.summary_line()}
    except Exception as exc:  # report, never hide: the tier checks the states
        return {"loaded": True, "armed": True, "error": repr(exc)}


def pytest_sessionfinish(session, exitstatus):
    out = os.environ.get("KIMI_SUITE_OUT")
    if not out:
        return
    import vllm

    record = {
        "results": _results, "collect_errors": _collect_errors, "deselected": _deselected[0],
        "vllm_file": vllm.__file__, "optimize": sys.flags.optimize,
        "hash_seed": os.environ.get("PYTHONHASHSEED"), "shim": _shim(),
        "started": dict(_started), "exitstatus": int(exitstatus),
        "cleanups": _YoungCollections.calls,
        "seconds": round(time.monotonic() - _t0, 1),
    }
    with open(out + ".tmp", "w") as f:
        json.dump(record, f, indent=0, sort_keys=True)
    os.replace(out + ".tmp", out)

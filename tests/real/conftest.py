"""Hooks of the real-vLLM tier; the machinery is in harness.py (see there)."""

from __future__ import annotations

import os
import re
import resource
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # harness, cases, child

from harness import (  # noqa: E402
    COUNTS,
    DEFAULT_RELEASES,
    PLAN,
    POOL,
    RELEASES,
    REPORT_LINES,
    parse_key,
    prefetch_order,
)

# the modules whose tests (nearly) only read harness children
READS_CHILDREN = ("test_check", "test_container", "test_docs", "test_kv_spec_merge", "test_o_parity",
                  "test_recoverssm", "test_upstream")
# scripts/test runs the tier in pytest-xdist workers, a test at a time, except
# these modules: their tests share what one process computes once (a module-scoped
# fixture or cache: Ray's two-node cluster, the bundles, the pip-installed venv,
# the audits, the hostile-host tier's two namespaces, vLLM's pytest runs in the
# upstream PRs' release tree; the fault tier's drivers,
# which test_chain_real and test_fork_real read too), so each group runs whole on
# one worker. (xdist's own loadgroup cannot do this here: it renames
# item._nodeid, which pytest 9 no longer reads.)
GROUPS = {"test_fault_tier": "fault tier", "test_chain_real": "fault tier",
          "test_fork_real": "fault tier", "test_ray": "ray", "test_bundle": "bundle",
          "test_fleet": "fleet", "test_plugin": "plugin", "test_audit": "audit",
          "test_fourth_patch": "fourth patch", "test_hostile": "hostile host",
          "test_upstream_pr": "upstream PRs"}


def pytest_xdist_make_scheduler(config, log):
    """xdist's scope scheduler, a scope being a test or one of GROUPS (whole)."""
    from xdist.scheduler import LoadScopeScheduling

    class Grouped(LoadScopeScheduling):
        def _split_scope(self, nodeid):
            module = nodeid.split("::", 1)[0].rsplit("/", 1)[-1][:-len(".py")]
            return GROUPS.get(module, nodeid)

    return Grouped(config, log)


def pytest_addoption(parser):
    parser.addoption("--release", action="append", default=[], choices=RELEASES,
                     help="run the real-vLLM tests of these releases only (repeatable)")


def pytest_configure(config):
    config.addinivalue_line("markers", "releases(*names): the vLLM releases a test is for")


def selected(config) -> tuple:
    """The releases this session runs: those named with --release, else all.
    Only the command line narrows the tier (never the environment): a
    deselected test is not a skip, so a narrowing nobody typed would go unseen."""
    return tuple(config.getoption("--release") or RELEASES)


def pytest_report_header(config):
    chosen = selected(config)
    how = "--release" if chosen != RELEASES else "all"
    return f"real vLLM releases ({how}): {', '.join(chosen)}"


def pytest_generate_tests(metafunc):
    if "release" in metafunc.fixturenames:
        marker = metafunc.definition.get_closest_marker("releases")
        releases = marker.args if marker else DEFAULT_RELEASES
        metafunc.parametrize("release", releases, ids=[r.replace(".", "") for r in releases])


def pytest_collection_modifyitems(config, items):
    chosen = selected(config)
    keep, drop = [], []
    for item in items:
        params = item.callspec.params if hasattr(item, "callspec") else {}
        release = params.get("release")
        planned = params.get("config") in PLAN.get(release, ()) if "config" in params else True
        # a (release, configuration) pair the plan does not run is not a test here
        (drop if release and (release not in chosen or not planned) else keep).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep
    # Modules whose tests start processes of their own run first, while the pool
    # computes the children; the modules that read children run after. Both cores
    # stay busy to the end instead of the own-process tests running alone at the
    # tail. Only the order changes (a stable sort: each module stays contiguous).
    items.sort(key=lambda item: item.module.__name__ in READS_CHILDREN)
    if config.option.collectonly or os.environ.get("KIMI_HOTFIX_PREFETCH", "1") == "0":
        return  # nothing runs: start no vLLM child
    used = {item.callspec.params["release"] for item in items
            if getattr(item, "callspec", None) and "release" in item.callspec.params}
    if used:
        references = [parse_key("0.33.0", "off"), parse_key("0.30.0", "off")]
        keys = references + [parse_key(r, *c.split(":")) for r in RELEASES if r in used
                             for c in PLAN[r]]
        POOL.prefetch(prefetch_order(list(dict.fromkeys(keys))))


# Every process this worker starts on a vLLM venv's interpreter (a harness child, a
# fault-tier driver, an own-process test, a status or check command) is counted at
# its start: the suite's cost is counted in processes that import vLLM (issue 30).
VLLM_PYTHON = re.compile(r"/(vllm|ray|suite)-\d+\.\d+\.\d+-py3\.\d+/bin/python[0-9.]*$")
STARTED = {"on a vLLM venv": 0}
_popen_init = subprocess.Popen.__init__


def _counting_init(self, args, *rest, **kwargs):
    argv = [args] if isinstance(args, (str, bytes, os.PathLike)) else list(args)
    if any(VLLM_PYTHON.search(str(arg)) for arg in argv[:12]):
        STARTED["on a vLLM venv"] += 1
    _popen_init(self, args, *rest, **kwargs)


subprocess.Popen.__init__ = _counting_init


def pytest_sessionfinish(session, exitstatus):
    POOL.shutdown(wait=False)
    # the children this process ran (not those it read from another worker's file)
    ran = [r for r in POOL.results() if getattr(r, "ran_here", False)]
    report = {"lines": list(REPORT_LINES),
              "children": [len(ran), sum(r.seconds for r in ran), sum(r.cpu or 0 for r in ran)],
              "counts": {**STARTED, **COUNTS}}
    if hasattr(session.config, "workeroutput"):  # an xdist worker: the controller prints it
        session.config.workeroutput["kimi_report"] = report
    else:
        write_report(session.config, [report])


_from_workers: list = []


def pytest_testnodedown(node, error):  # xdist's controller: a worker finished
    report = getattr(node, "workeroutput", {}).get("kimi_report")
    if report:
        _from_workers.append(report)


def pytest_terminal_summary(terminalreporter, config):
    if _from_workers:
        write_report(config, _from_workers)


def write_report(config, reports) -> None:
    """Each process's lines, then one line for the children they ran together."""
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    if reporter is None:
        return
    for report in reports:
        for line in report["lines"]:
            reporter.write_line(line)
    count, seconds, cpu = (sum(r["children"][i] for r in reports) for i in range(3))
    if count:
        reporter.write_line(f"vLLM children: {count}, {seconds:.0f} s of child time, "
                            f"{cpu:.0f} s of their CPU")
    total = {k: sum(r.get("counts", {}).get(k, 0) for r in reports)
             for k in ("on a vLLM venv", "fault drivers", "fault cases")}
    if not (count or any(total.values())):
        return  # xdist's controller at its own session's end: the workers' report follows
    own = total["on a vLLM venv"] - count - total["fault drivers"]
    # this process and what it waited for: under xdist the controller, after its workers
    cpu = sum(getattr(resource.getrusage(who), f) for who in (resource.RUSAGE_SELF,
              resource.RUSAGE_CHILDREN) for f in ("ru_utime", "ru_stime"))
    reporter.write_line(
        f"real tier, processes that import vLLM: {count} harness children, "
        f"{total['fault cases']} fault-tier cases (forks of {total['fault drivers']} drivers), "
        f"{own} other processes started on a vLLM venv's interpreter (own-process tests, "
        f"status and check commands, pip; Ray's workers not counted); {cpu:.0f} CPU-s")

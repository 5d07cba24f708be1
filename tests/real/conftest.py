"""Hooks of the real-vLLM tier; the machinery is in harness.py (see there)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # harness, cases, child

from harness import DEFAULT_RELEASES, PLAN, POOL, RELEASES, parse_key  # noqa: E402

# the modules whose tests (nearly) only read harness children
READS_CHILDREN = ("test_check", "test_docs", "test_kv_spec_merge", "test_o_parity",
                  "test_recoverssm", "test_upstream")


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
        POOL.prefetch(references + [parse_key(r, *c.split(":")) for r in RELEASES if r in used
                                    for c in PLAN[r]])


def pytest_sessionfinish(session, exitstatus):
    POOL.shutdown(wait=False)
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    children = [r for r in POOL.results() if hasattr(r, "seconds")]
    if reporter and children:
        total = sum(r.seconds for r in children)
        cpu = sum(r.cpu or 0 for r in children)
        reporter.write_line(f"vLLM children: {len(children)}, {total:.0f} s of child time, "
                            f"{cpu:.0f} s of their CPU")



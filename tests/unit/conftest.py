"""The unit tier's own plumbing: no test can hang (issue 39).

Every unit test runs under an alarm: past ``LIMIT`` seconds it fails with the
stacks of every thread (faulthandler) instead of blocking the tier until
someone kills it. The tier's tests take seconds; the limit is for a child that
never answers, a lock never released, a queue never filled.
"""

from __future__ import annotations

import faulthandler
import signal
import sys

import pytest

LIMIT = 600  # seconds: the container matrix's driver fixture is the longest, about 2 minutes

# tests/unit/test_new_patch.py runs the whole unit tier on a scaffolded copy:
# once, on the tools Python 3.11 (3.9 and 3.13 run the same tests on the same
# files); a skip would fail the run (tests/conftest.py), so it is not collected.
collect_ignore = [] if sys.version_info[:2] == (3, 11) else ["test_new_patch.py"]


def pytest_configure(config):
    config.addinivalue_line("markers", "limit(seconds): this test's alarm, above LIMIT")


class TestHung(Exception):
    pass


def _alarm(signum, frame):
    raise TestHung("the test ran past its limit: the stacks of every thread are on stderr")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    marker = item.get_closest_marker("limit")
    limit = marker.args[0] if marker else LIMIT
    previous = signal.signal(signal.SIGALRM, _alarm)
    faulthandler.dump_traceback_later(limit - 1, exit=False, file=sys.stderr)
    signal.alarm(limit)
    try:
        yield
    finally:
        signal.alarm(0)
        faulthandler.cancel_dump_traceback_later()
        signal.signal(signal.SIGALRM, previous)

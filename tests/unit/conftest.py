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


class TestHung(Exception):
    pass


def _alarm(signum, frame):
    raise TestHung(f"the test ran past {LIMIT} s: the stacks of every thread are on stderr")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    previous = signal.signal(signal.SIGALRM, _alarm)
    faulthandler.dump_traceback_later(LIMIT - 1, exit=False, file=sys.stderr)
    signal.alarm(LIMIT)
    try:
        yield
    finally:
        signal.alarm(0)
        faulthandler.cancel_dump_traceback_later()
        signal.signal(signal.SIGALRM, previous)

"""Test plumbing shared by both tiers (stdlib and pytest only; Python 3.9+).

tests/unit  the shim's own mechanics: any Python 3.9 to 3.13 with pytest and
            wrapt, no vLLM, no torch (stand-ins under tests/standins).
tests/real  every claim about vLLM, against the real released wheels in cached
            CPU-only venvs (see tests/real/conftest.py).

Everything that depends on interpreter flags runs in child interpreters
(``-O``/``-OO``, PYTHONHASHSEED and the sitecustomize bootstrap are real). A
skipped test fails the run: a suite that cannot run must not pass quietly.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # helpers, standins
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # kimi_hotfix of this checkout


def pytest_sessionfinish(session, exitstatus):
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    skipped = len(reporter.stats.get("skipped", [])) if reporter else 0
    if skipped and session.exitstatus == 0:
        session.exitstatus = 1
        if reporter:
            reporter.write_line(f"FAILED: {skipped} test(s) skipped; skips are not allowed here")

"""The vLLM-suite tier: vLLM's own CPU tests three ways (test_vllm_suite.py).

    scripts/test --suite                      # this tier alone (after the venvs it needs)
    python -m pytest tests/vllm_suite         # the same, with the tools venv's python
    ... --plain-shim                          # a fourth run: plain Python with the shim

Its summary (tests per mode, the differences, the cost in processes and CPU-seconds)
is printed at the end of the session.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # suite, selection

import suite  # noqa: E402


def pytest_addoption(parser):
    parser.addoption("--plain-shim", action="store_true", default=False,
                     help="also run plain Python with the shim, compared with plain without it")


def pytest_collection_modifyitems(config, items):
    """The plain-with-the-shim comparison runs only when asked for: deselected (not
    skipped) otherwise."""
    if config.getoption("--plain-shim"):
        return
    drop = [item for item in items if item.name == "test_plain_python_with_the_shim"]
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = [item for item in items if item not in drop]


def pytest_terminal_summary(terminalreporter, config):
    for line in suite.REPORT:
        terminalreporter.write_line(line)

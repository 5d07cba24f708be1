"""scripts/demo prints the command it really ran (issue 21 item 5).

The demo runs its preflight through ``shown`` (scripts/shown.sh), which prints
the command line, the variables it sets included, shell-quoted, and runs that
same argument vector. Checked here with values that need quoting: the printed
line, pasted into a shell, runs the same thing with the same variables; and the
demo's preflight goes through ``shown`` with every variable it sets. The demo
itself, end to end: tests/real/test_check.py::test_demo_shows_the_probes_side_by_side.
"""

from __future__ import annotations

import re
import subprocess
import sys

from helpers import REPO

SHOWN = REPO / "scripts" / "shown.sh"
PRINT_ENV = "import os, sys; print(repr([os.environ.get('A'), os.environ.get('B'), sys.argv[1:]]))"


def bash(script: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=60,
                          check=True)


def test_shown_prints_the_command_it_runs_and_the_line_runs_the_same():
    args = f"A=1 'B=x y$z' -- {sys.executable} -c \"{PRINT_ENV}\" 'an arg' '*'"
    proc = bash(f"source {SHOWN}; shown {args}")
    printed, output = proc.stdout.splitlines()
    assert output == repr(["1", "x y$z", ["an arg", "*"]])
    assert printed.startswith("$ A=1 B=x\\ y\\$z ") and f" {sys.executable} -c " in printed
    again = bash(printed[2:])  # the printed line, as a shell runs it
    assert again.stdout.strip() == output


def test_the_demo_runs_its_preflight_through_shown_with_every_variable():
    demo = (REPO / "scripts" / "demo").read_text()
    assert "source scripts/shown.sh" in demo
    # the one command that runs the preflight, continuation lines joined
    joined = demo.replace("\\\n", " ")
    (line,) = [ln for ln in joined.splitlines() if "-m kimi_hotfix check" in ln
               and not ln.lstrip().startswith("#")]
    assert re.match(r"\s*shown (\S+=\S+ +)+-- +\"\$venv/bin/python\" -O -m kimi_hotfix check ",
                    line), line
    for variable in ("VLLM_TARGET_DEVICE", "PYTHONPATH", "HF_HUB_OFFLINE", "VLLM_CACHE_ROOT"):
        assert f" {variable}=" in line, variable
    assert not re.search(r"^\s*(env|export) ", joined, re.M)  # nothing set around it

"""The docs derive from the code: docs/samples are what the commands print,
compared with fresh runs of the same commands (``python [-O] -m kimi_hotfix
status|check`` in the release's venv, PYTHONHASHSEED=0, run once per session in
the harness pool). Regenerate with scripts/docs.
"""

from __future__ import annotations

import pytest

import samples
from harness import child, command, venv_python
from helpers import REPO, run_python, summaries

CHECKS = [n for n, (_, _, command) in samples.SAMPLES.items() if command == "check"]


@pytest.mark.parametrize("name", CHECKS)
def test_check_samples_are_what_check_prints(name):
    release, flags, command_name = samples.SAMPLES[name]
    proc = command(release, flags, command_name)
    assert proc.returncode in (0, 1), proc.stderr[-3000:]
    expected = samples.render(name, proc.stdout, venv_python(release))
    assert (samples.DOCS / name).read_text() == expected, "rerun scripts/docs"


def test_status_sample_is_what_status_prints():
    name = "status-0.29.0.txt"
    release, flags, command = samples.SAMPLES[name]
    python = venv_python(release)
    proc = run_python([*flags, "-m", "kimi_hotfix", command], python=python, cwd=REPO)
    assert (samples.DOCS / name).read_text() == samples.render(name, proc.stdout, python), (
        "rerun scripts/docs")


def test_readme_shows_the_summary_lines_as_logged():
    (logged,) = summaries(child("0.29.0", "on", "O").stderr).values()
    readme = (REPO / "README.md").read_text()
    shown = [line.split(" INFO ", 1)[1] for line in readme.splitlines()
             if line.startswith("kimi-hotfix[") and " INFO " in line]
    assert len(shown) >= 2 and all(line in logged for line in shown), (shown, logged)

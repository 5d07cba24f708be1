"""The docs derive from the code: docs/samples are what the commands print,
compared with runs of the same commands in this session, in the release's venv
(PYTHONHASHSEED=0, the shim on PYTHONPATH). ``status`` runs as a command of its
own; ``check`` is what ``python [-O] -m kimi_hotfix check`` printed as the first
thing done by the release's child of that optimize level, before anything else
was imported (tests/real/child.py, section "cli"). Regenerate with scripts/docs.
"""

from __future__ import annotations

import pytest

import samples
from harness import child, venv_python
from helpers import REPO, run_python, summaries

CHECKS = [n for n, (_, _, command) in samples.SAMPLES.items() if command == "check"]


@pytest.mark.parametrize("name", CHECKS)
def test_check_samples_are_what_check_prints(name):
    release, flags, _ = samples.SAMPLES[name]
    cli = child(release, "on", {(): "plain", ("-O",): "O"}[tuple(flags)])["cli"]
    assert cli["rc"] in (0, 1), cli
    expected = samples.render(name, cli["stdout"], venv_python(release))
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

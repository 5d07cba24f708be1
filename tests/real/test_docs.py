"""The docs derive from the code: docs/samples are what the commands print.

``status`` samples are compared with a fresh run of the same command; ``check``
samples with the same command's output in this run's children (the child runs
``cli.main(["check"])`` with fd 1 captured, exactly what ``python -m
kimi_hotfix check`` prints). Regenerate with scripts/docs.
"""

from __future__ import annotations

import pytest

import samples
from harness import child, venv_python
from helpers import REPO, run_python, summary_lines

CHECKS = [n for n, (_, _, command) in samples.SAMPLES.items() if command == "check"]


@pytest.mark.parametrize("name", CHECKS)
def test_check_samples_are_what_check_prints(name):
    release, flags, _ = samples.SAMPLES[name]
    run = child(release, "on", "O" if flags else "plain")
    expected = samples.render(name, run["check"]["text"], venv_python(release))
    assert (samples.DOCS / name).read_text() == expected, "rerun scripts/docs"


def test_status_sample_is_what_status_prints():
    name = "status-0.29.0.txt"
    release, flags, command = samples.SAMPLES[name]
    python = venv_python(release)
    proc = run_python([*flags, "-m", "kimi_hotfix", command], python=python, cwd=REPO)
    assert (samples.DOCS / name).read_text() == samples.render(name, proc.stdout, python), (
        "rerun scripts/docs")


def test_readme_shows_the_summary_line_as_logged():
    (line,) = summary_lines(child("0.29.0", "on", "O").stderr)
    logged = line.split(" INFO ", 1)[1]
    assert f"\n{logged}\n" in (REPO / "README.md").read_text()

"""The sample outputs under docs/samples: which command, on which release.

scripts/docs runs these commands and writes the files; tests/real/test_docs.py
fails when a file no longer matches what the command prints (for ``check`` it
compares with the same command's output from the run's children). Paths that
differ between machines are written as /opt/kimi-hotfix and /opt/venv.
"""

from __future__ import annotations

import os
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DOCS = REPO / "docs" / "samples"
# file -> (release, interpreter flags, command)
SAMPLES = {
    "status-0.29.0.txt": ("0.29.0", [], "status"),
    "check-0.28.0.txt": ("0.28.0", [], "check"),
    "check-0.29.0-O.txt": ("0.29.0", ["-O"], "check"),
    "check-0.30.0.txt": ("0.30.0", [], "check"),
    "check-0.33.0.txt": ("0.33.0", [], "check"),
    "check-0.33.0-O.txt": ("0.33.0", ["-O"], "check"),
}


def header(name) -> str:
    release, flags, command = SAMPLES[name]
    python = " ".join(["python", *flags])
    # the hash seed fixes which cache_dtype_str vLLM's -O merge keeps without the patch
    seed = "PYTHONHASHSEED=0 " if command == "check" else ""
    return (f"$ {seed}PYTHONPATH=/opt/kimi-hotfix {python} -m kimi_hotfix {command}"
            f"    # vLLM {release}\n")


def normalize(text: str, python: str) -> str:
    venv = os.path.dirname(os.path.dirname(python))
    for path, shown in sorted({str(REPO): "/opt/kimi-hotfix", venv: "/opt/venv"}.items(),
                              key=lambda item: -len(item[0])):  # the longer first: a
        text = text.replace(path, shown)  # checkout's path may be a prefix of the cache's
    return text


def render(name, stdout, python) -> str:
    return header(name) + normalize(stdout, python)

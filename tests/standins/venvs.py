"""Throwaway venvs layered over a vLLM venv (test side helpers).

``layered_venv`` makes ``python -m venv`` environments whose site-packages hold
one ``.pth`` line naming an overlay directory: symlinks to every entry of the
given site-packages directories except the hidden ones. So the real vLLM, torch
and friends import from the cached vLLM venv, while a hidden package (wrapt) is
genuinely absent: ``import wrapt`` raises ModuleNotFoundError, exactly as in a
container that never installed it.

The cached vLLM venvs (scripts/build-venv) are plain venvs built by uv from
their lock files: ``site_dirs`` returns their site-packages and any directory a
``.pth`` file there adds (none today); pass them as ``layers``, so that a venv
layered over one sees what it sees.
"""

from __future__ import annotations

import fnmatch
import os
import subprocess
import sys
from pathlib import Path


def site_packages(python: str) -> Path:
    out = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True, text=True, check=True, env={"PATH": os.environ.get("PATH", "")},
    )
    return Path(out.stdout.strip())


_SITE_DIRS = """
import os, sys, sysconfig
paths = sysconfig.get_paths()
own = {os.path.realpath(paths[k]) for k in ("purelib", "platlib")}
real = [os.path.realpath(p) for p in sys.path]
first = min(i for i, p in enumerate(real) if p in own)
print("\\n".join(dict.fromkeys(p for p in real[first:] if os.path.isdir(p))))
"""


def site_dirs(python: str) -> list:
    """Every site directory of ``python``'s environment, in import order: its
    purelib (and platlib) and the directories ``.pth`` files add after it."""
    out = subprocess.run(
        [python, "-c", _SITE_DIRS],
        capture_output=True, text=True, check=True, env={"PATH": os.environ.get("PATH", "")},
    )
    return [Path(line) for line in out.stdout.splitlines() if line]


def visible(python: str, names) -> dict:
    """name -> whether ``python`` (no PYTHONPATH) finds that top-level module,
    without importing it (importing vLLM costs seconds)."""
    out = subprocess.run(
        [python, "-c", "import importlib.util as u, sys\n"
                       "print(' '.join(str(u.find_spec(m) is not None) for m in sys.argv[1:]))",
         *names], capture_output=True, text=True, check=True, env={"PATH": os.environ.get("PATH", "")},
    )
    return dict(zip(names, (word == "True" for word in out.stdout.split())))


def overlay(dest: Path, sources, hide=()) -> Path:
    """A directory of symlinks to the entries of ``sources``, minus ``hide``
    (fnmatch patterns on entry names)."""
    dest.mkdir(parents=True, exist_ok=True)
    for source in sources:
        for entry in sorted(Path(source).iterdir()):
            if entry.suffix == ".pth" or any(fnmatch.fnmatch(entry.name, p) for p in hide):
                continue
            link = dest / entry.name
            if not link.exists():
                link.symlink_to(entry)
    return dest


def layered_venv(dest: Path, base_python: str, layers=(), hide=(), pip=False) -> str:
    """Create a venv at ``dest`` (from ``base_python``'s base interpreter) that
    sees ``layers`` (site-packages dirs) minus ``hide``; return its python."""
    dest = Path(dest)
    args = [base_python, "-m", "venv", str(dest)]
    if not pip:
        args.insert(3, "--without-pip")
    subprocess.run(args, check=True, capture_output=True, env={"PATH": os.environ.get("PATH", "")})
    python = str(dest / "bin" / "python")
    if layers:
        ov = overlay(dest / "overlay", layers, hide)
        (site_packages(python) / "_kimi_hotfix_test_layer.pth").write_text(f"{ov}\n")
    return python


def vllm_site_packages() -> Path:
    """site-packages (purelib) of the vLLM venv that runs this pytest process."""
    return site_packages(sys.executable)


def vllm_site_dirs() -> list:
    """All site dirs of the vLLM venv that runs this pytest process: what a
    venv layered over it must see."""
    return site_dirs(sys.executable)

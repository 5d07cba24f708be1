"""Throwaway venvs layered over a vLLM venv (test side helpers).

``layered_venv`` makes ``python -m venv`` environments whose site-packages hold
one ``.pth`` line naming an overlay directory: symlinks to every entry of the
given site-packages directories except the hidden ones. So the real vLLM, torch
and friends import from the cached vLLM venv, while a hidden package (wrapt) is
genuinely absent: ``import wrapt`` raises ModuleNotFoundError, exactly as in a
container that never installed it.
"""

from __future__ import annotations

import fnmatch
import os
import subprocess
from pathlib import Path


def site_packages(python: str) -> Path:
    out = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True, text=True, check=True, env={"PATH": os.environ.get("PATH", "")},
    )
    return Path(out.stdout.strip())


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


def site_dirs(python: str) -> list:
    """Every directory ``python`` gets its packages from: its purelib, then the
    directories named by the .pth files there (a venv layered over others)."""
    purelib = site_packages(python)
    found = [purelib]
    for pth in sorted(purelib.glob("*.pth")):
        for line in pth.read_text().splitlines():
            line = line.strip()
            if line and not line.startswith(("#", "import")) and Path(line).is_dir():
                found.append(Path(line))
    return found

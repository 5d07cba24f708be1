"""Two trees of the shim for a side-by-side bench (bench/loaded.py,
bench/serve_cost.py): an older revision extracted from git, and a checkout
copied once, each compiled so that neither side pays for compiling. Stdlib only.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SHIM = ("sitecustomize.py", "kimi_hotfix", "kimi_hotfix-*.dist-info")  # what a deployment holds


def _fail(what: str):
    raise SystemExit(f"bench/{Path(sys.argv[0]).name}: {what}")


def extract(rev: str, dest: Path) -> str:
    """The tree at ``rev`` (git archive) in ``dest``; returns the full commit id."""
    commit = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--verify", f"{rev}^{{commit}}"],
                            capture_output=True, text=True)
    if commit.returncode != 0:
        _fail(f"no commit {rev!r} in {REPO}: {commit.stderr.strip()}")
    dest.mkdir()
    archive = subprocess.Popen(["git", "-C", str(REPO), "archive", "--format=tar", rev],
                               stdout=subprocess.PIPE)
    untar = subprocess.run(["tar", "-x", "-C", str(dest)], stdin=archive.stdout)
    archive.stdout.close()
    if archive.wait() != 0 or untar.returncode != 0:
        _fail(f"git archive {rev} | tar -x failed")
    return commit.stdout.strip()


def snapshot(tree: Path, dest: Path) -> Path:
    """A copy of the shim in ``tree`` (sitecustomize.py, kimi_hotfix/, its
    dist-info; no bytecode), taken once: a run measures one tree even while
    someone edits the checkout."""
    dest.mkdir()
    shutil.copy2(tree / "sitecustomize.py", dest)
    skip = shutil.ignore_patterns("__pycache__", "*.pyc")
    shutil.copytree(tree / "kimi_hotfix", dest / "kimi_hotfix", ignore=skip)
    infos = sorted(tree.glob(SHIM[2]))
    if not infos:
        _fail(f"{tree} has no {SHIM[2]}")
    for info in infos:
        shutil.copytree(info, dest / info.name, ignore=skip)
    return dest


def describe(tree: Path) -> str:
    """What ``tree`` holds: its commit and how many paths of the shim differ from it."""
    head = subprocess.run(["git", "-C", str(tree), "rev-parse", "--short", "HEAD"],
                          capture_output=True, text=True)
    if head.returncode != 0:
        return "not a git checkout"
    dirty = subprocess.run(["git", "-C", str(tree), "status", "--porcelain", "--", *SHIM],
                           capture_output=True, text=True).stdout.splitlines()
    return f"HEAD {head.stdout.strip()}, {len(dirty)} shim paths changed or untracked"


def compile_tree(python: str, tree: Path, env=None) -> None:
    """Bytecode for every optimize level (as scripts/bundle ships it), by ``python``."""
    proc = subprocess.run([python, "-m", "compileall", "-q", "-o", "0", "-o", "1", "-o", "2",
                           str(tree)], capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        _fail(f"compileall {tree} failed:\n{(proc.stdout + proc.stderr)[-4000:]}")

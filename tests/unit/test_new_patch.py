"""Adding a patch is one folder and two generated lines (issue 39), proven.

In a copy of this checkout, ``scripts/new-patch`` scaffolds a call-through of
a vLLM function: it writes kimi_hotfix/patches/NAME/ (the patch, its about.py,
its stand-ins), the table's row and the README's generated row, nothing else.
Then the whole unit tier runs in the copy, with nothing else edited, and
passes: the registry, the README's tables, the stand-in trees, the fault and
fork tables and every per-patch check derive from what the scaffold wrote.

It runs once, on the tools Python 3.11 (tests/unit/conftest.py): the unit tier
it runs is a few minutes of CPU, and 3.9 and 3.13 run the same tests on the
same files in the outer tier.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from helpers import copy_checkout

pytestmark = pytest.mark.limit(1500)
# a module no patch declares (a stand-in tree takes one declaration per module), a method
NAME, TARGET = "sixth_standin", "vllm.v1.sixth_standin:Planner.plan"


def snapshot(root, files) -> dict:
    return {rel: (root / rel).read_text(errors="replace") for rel in files}


@pytest.fixture(scope="module")
def scaffolded(tmp_path_factory):
    root = tmp_path_factory.mktemp("newcomer") / "tree"
    files = copy_checkout(root)
    before = snapshot(root, files)
    proc = subprocess.run([sys.executable, str(root / "scripts" / "new-patch"), NAME, TARGET],
                          cwd=root, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return root, files, before


def test_the_scaffold_writes_one_folder_and_two_generated_lines(scaffolded):
    root, files, before = scaffolded
    folder = root / "kimi_hotfix" / "patches" / NAME
    written = sorted(p.name for p in folder.iterdir() if p.name != "__pycache__")  # the docs run imports it
    assert written == ["__init__.py", "about.py", "standins.py"]
    after = snapshot(root, files)
    changed = {rel: (before[rel].splitlines(), after[rel].splitlines())
               for rel in files if before[rel] != after[rel]}
    assert sorted(changed) == ["README.md", "kimi_hotfix/patches/__init__.py"]
    for rel, (old, new) in changed.items():
        added = [line for line in new if line not in old]
        assert len(new) == len(old) + 1 and len(added) == 1, (rel, added)
        assert NAME in added[0], (rel, added)
    new_files = sorted(p for p in root.rglob("*") if p.is_file() and ".generated" not in p.parts
                       and "__pycache__" not in p.parts and str(p.relative_to(root)) not in files)
    assert new_files == sorted(p for p in folder.iterdir() if p.name != "__pycache__")


def test_the_unit_tier_passes_on_the_scaffolded_tree(scaffolded, tmp_path):
    root, _, _ = scaffolded
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "KIMI_HOTFIX"))}
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-x",
         "--basetemp", str(tmp_path / "basetemp"), "tests/unit",
         "--deselect", "tests/unit/test_new_patch.py"],
        cwd=root, env=env, capture_output=True, text=True, timeout=1400)
    tail = proc.stdout[-6000:] + proc.stderr[-2000:]
    assert proc.returncode == 0, tail
    assert " passed" in proc.stdout.splitlines()[-1] and " failed" not in proc.stdout, tail
    assert f"[{NAME}]" in _collected(root, env)  # the per-patch tests ran on it too


def _collected(root, env) -> str:
    """The ids the scaffolded tier collects (the new patch is among them)."""
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q",
                           "--collect-only", "tests/unit/test_registry.py"],
                          cwd=root, env=env, capture_output=True, text=True, timeout=300).stdout

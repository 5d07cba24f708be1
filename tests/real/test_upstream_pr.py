"""upstream/ is ready to send: each patch, its regression test and its PR text.

- Each patch is a ``git format-patch`` with a ``[Bugfix]`` subject and a DCO
  ``Signed-off-by:`` of its author, and is what upstream/make_patches.py builds
  from vLLM 0.33.0's files and upstream/tests/ (nothing edited by hand since).
- Each PR text follows vLLM's template (``## Purpose``, ``## Test Plan``,
  ``## Test Result``), carries the patch's title, and every path it cites
  exists in the patched vLLM tree: the installed 0.33.0 package plus the files
  the patch adds. It cites nothing of this project.
- Each regression test, run as its PR says (``pytest tests/...`` from a tree
  laid out as vLLM's repository, upstream/overlay.py), passes with its fix and
  fails without it, on the released wheel.
"""

from __future__ import annotations

import functools
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from harness import upstream_overlay, venv_python, vllm_location
from helpers import REPO, hermetic_env

pytestmark = pytest.mark.releases("0.33.0")
UPSTREAM = REPO / "upstream"
PATCHES = sorted(UPSTREAM.glob("000*.patch"))
PR_TEXT = {"0001": UPSTREAM / "PR.md", "0002": UPSTREAM / "PR-0002.md",
           "0003": UPSTREAM / "PR-0003.md"}
TEMPLATE = ("## Purpose", "## Test Plan", "## Test Result")
# A path in vLLM's tree, not part of a longer one (".../vllm/x.py" in an excerpt is not a citation)
CITED = re.compile(r"(?<![\w/.~-])((?:vllm|tests)/[\w./-]*\w)")
FOREIGN = ("kimi_hotfix", "kimi-hotfix", "~/.cache", "upstream/", "tests/real", "tests/unit")


def overlay_module():
    return upstream_overlay("0.33.0")["module"]


def number(patch: Path) -> str:
    return patch.name[:4]


def subject(patch: Path) -> str:
    text = patch.read_text()
    found = re.search(r"^Subject: \[PATCH\] (.*?)\n(?! )", text, re.M | re.S)
    assert found, patch.name
    return " ".join(found.group(1).split())


def test_there_is_one_pr_text_per_patch():
    assert [number(p) for p in PATCHES] == sorted(PR_TEXT)
    assert all(path.is_file() for path in PR_TEXT.values())


@pytest.mark.parametrize("patch", PATCHES, ids=number)
def test_patch_is_signed_off_under_bugfix(patch, release):
    text = patch.read_text()
    author = re.search(r"^From: (.*?)\n(?! )", text, re.M | re.S).group(1)
    author = " ".join(author.split())
    assert subject(patch).startswith("[Bugfix] ")
    head = text[:text.index("\n---\n")]
    assert f"Signed-off-by: {author}" in head, "DCO sign-off missing"


def test_patches_are_what_make_patches_builds(release):
    tree = vllm_location(venv_python(release))
    proc = subprocess.run([sys.executable, str(UPSTREAM / "make_patches.py"), str(tree), "--check"],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr


@functools.cache
def patched_tree(patch_name: str) -> Path:
    dest = Path(tempfile.mkdtemp(prefix="kimi-upstream-")) / "vllm-tree"
    site = vllm_location(venv_python("0.33.0"))
    overlay_module().make_overlay(site, UPSTREAM / patch_name, dest)
    return dest


@pytest.mark.parametrize("patch", PATCHES, ids=number)
def test_patch_adds_its_regression_test_verbatim(patch, release):
    added = overlay_module().added_paths(patch)
    assert added and all(rel.startswith("tests/") and rel.endswith("_optimized.py") for rel in added)
    for rel in added:
        assert (patched_tree(patch.name) / rel).read_text() == (UPSTREAM / rel).read_text()


@pytest.mark.parametrize("patch", PATCHES, ids=number)
def test_pr_text_follows_the_template_and_cites_only_vllm_paths(patch, release):
    text = PR_TEXT[number(patch)].read_text()
    assert text.splitlines()[0] == f"# {subject(patch)}"
    headings = [line for line in text.splitlines() if line.startswith("## ")]
    assert [h for h in headings if h in TEMPLATE] == list(TEMPLATE)
    assert not [word for word in FOREIGN if word in text]
    cited = set(CITED.findall(text))
    assert cited, "a PR text with no path"
    tree = patched_tree(patch.name)
    missing = sorted(path for path in cited if not (tree / path).exists())
    assert missing == [], f"{PR_TEXT[number(patch)].name} cites paths not in the patched tree"
    test_files = overlay_module().added_paths(patch)
    assert f"pytest {' '.join(test_files)} -v" in text  # the Test Plan's command


def test_first_pr_names_its_issue_and_its_relatives(release):
    text = PR_TEXT["0001"].read_text()
    purpose = text[text.index("## Purpose"):text.index("## Test Plan")]
    assert "\nFixes #54649\n" in purpose
    assert "#55234" in purpose and "#55187" in purpose
    assert "Why `AssertionError` stays" in purpose
    assert "Fixes #54649" in PATCHES[0].read_text()


def _pytest(tree: Path, tests, release) -> subprocess.CompletedProcess:
    return subprocess.run([venv_python(release), "-m", "pytest", *tests, "-v", "-p", "no:cacheprovider"],
                          cwd=str(tree), env=hermetic_env(shim=False), capture_output=True, text=True,
                          timeout=900)


def _outcomes(stdout: str) -> dict:
    return dict(re.findall(r"::(\w+) (PASSED|FAILED|SKIPPED|ERROR)", stdout))


@pytest.mark.parametrize("patch", PATCHES, ids=number)
def test_regression_test_passes_with_the_fix_and_fails_without(patch, release, tmp_path):
    module = overlay_module()
    tests = module.added_paths(patch)
    fixed = _pytest(patched_tree(patch.name), tests, release)
    assert fixed.returncode == 0, fixed.stdout[-4000:] + fixed.stderr[-2000:]
    with_fix = _outcomes(fixed.stdout)
    assert len(with_fix) == 3 and set(with_fix.values()) == {"PASSED"}, with_fix
    released = module.make_tree(vllm_location(venv_python(release)), tmp_path / "released",
                                {rel: (UPSTREAM / rel).read_text() for rel in tests})
    broken = _pytest(released, tests, release)
    without = _outcomes(broken.stdout)
    assert broken.returncode == 1, broken.stdout[-4000:]
    # the plain-Python behaviour holds on the release; the AST guard and the -O child do not
    assert list(without.values()) == ["PASSED", "FAILED", "FAILED"], without
    assert [name for name in without][1].startswith("test_no_assert")
    assert "optimized" in [name for name in without][2]

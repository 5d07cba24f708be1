"""One patch, one module: the registry, the patch modules' headers, and the one
source of patch metadata (the README's table is generated from it)."""

from __future__ import annotations

import ast
import re

import pytest

from kimi_hotfix import base, core, status
from kimi_hotfix.patches import PATCH_MODULES, UNREGISTERED

from helpers import REPO

PACKAGE = REPO / "kimi_hotfix"
HEADER = ("Why:", "What it changes:", "Upstream:", "Needed when")


def test_registry_lists_every_patch_module_once():
    on_disk = sorted(p.name for p in (PACKAGE / "patches").iterdir()
                     if p.is_dir() and (p / "__init__.py").exists()
                     or p.suffix == ".py" and p.name != "__init__.py")
    assert sorted(PATCH_MODULES + UNREGISTERED) == sorted(n[:-3] if n.endswith(".py") else n
                                                          for n in on_disk)
    assert list(core.patch_names()) == list(PATCH_MODULES)


def test_no_patch_name_outside_the_patches():
    """core, cli, preflight, status, probing ... name no patch: a patch's
    knowledge lives in its own module (or subpackage)."""
    offenders = []
    for path in PACKAGE.rglob("*.py"):
        if "patches" in path.relative_to(PACKAGE).parts or path == PACKAGE / "audit" / "reviewed.py":
            continue  # the audit's reviewed table names the patch that covers a site
        text = path.read_text()
        offenders += [f"{path.relative_to(REPO)}: {n}" for n in PATCH_MODULES if n in text]
    assert offenders == []


@pytest.mark.parametrize("name", PATCH_MODULES)
def test_each_patch_module_documents_itself(name):
    init = PACKAGE / "patches" / name / "__init__.py"
    doc = ast.get_docstring(ast.parse(init.read_text()))
    assert doc.startswith(f"{name}: ")
    for section in HEADER:
        assert section in doc, f"{name}: header lacks {section!r}"
    patch = core.patches()[name]
    assert isinstance(patch, base.Patch) and patch.name == name
    for attr in ("target", "upstream", "summary", "decides", "probe_title"):
        assert getattr(patch, attr), f"{name}.{attr} is empty"
    assert patch.wraps and patch.symptoms
    assert patch.fixed_in in doc and patch.upstream.split()[0] in doc


def test_no_assert_in_the_package():
    """python -O strips assert: the package raises instead."""
    found = [f"{p.relative_to(REPO)}:{n.lineno}" for p in PACKAGE.rglob("*.py")
             for n in ast.walk(ast.parse(p.read_text())) if isinstance(n, ast.Assert)]
    assert found == []


def test_readme_patch_table_is_generated_from_the_patches():
    readme = (REPO / "README.md").read_text()
    match = re.search(r"<!-- patch-table -->\n(.*?)<!-- /patch-table -->", readme, re.S)
    assert match, "README.md lacks the generated patch table markers"
    assert match.group(1) == status.patch_table(), "run: scripts/docs (regenerates it)"

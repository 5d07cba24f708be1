"""One patch, one module: the registry, the patch modules' headers, the one
source of patch metadata and of log lines (the README's tables are generated
from them), and the package's structure rules."""

from __future__ import annotations

import ast
import re

import pytest

from kimi_hotfix.patches import PATCHES
from kimi_hotfix.runtime import messages, patching, registry
from kimi_hotfix.tools import about, docs

from helpers import REPO

PACKAGE = REPO / "kimi_hotfix"
HEADER = ("Why:", "What it changes:", "Upstream:", "Needed when")


def test_registry_lists_every_patch_module_once():
    on_disk = sorted(p.name for p in (PACKAGE / "patches").iterdir()
                     if not p.name.startswith("_") and (
                         p.is_dir() and (p / "__init__.py").exists() or p.suffix == ".py"))
    assert sorted(PATCHES) == sorted(n[:-3] if n.endswith(".py") else n for n in on_disk)
    assert list(registry.names()) == list(PATCHES)


def test_the_table_names_each_patch_and_its_own_target():
    """Arming reads the table (kimi_hotfix.patches.PATCHES), not the modules:
    each row is its module's PATCH, with that PATCH's own target."""
    from kimi_hotfix.runtime import registry
    for name, target in PATCHES.items():
        patch = registry.get(name)
        assert (patch.name, patch.target) == (name, target), name


def test_no_patch_name_outside_the_patches():
    """core, cli, preflight, status, probing ... name no patch: a patch's
    knowledge lives in its own module (or subpackage)."""
    offenders = []
    for path in PACKAGE.rglob("*.py"):
        if "patches" in path.relative_to(PACKAGE).parts:
            continue  # the audit's covered rows live with their patch (patches/*/covers.py)
        text = path.read_text()
        offenders += [f"{path.relative_to(REPO)}: {n}" for n in PATCHES if n in text]
    assert offenders == []


@pytest.mark.parametrize("name", PATCHES)
def test_each_patch_module_documents_itself(name):
    init = PACKAGE / "patches" / name / "__init__.py"
    doc = ast.get_docstring(ast.parse(init.read_text()))
    assert doc.startswith(f"{name}: ")
    for section in HEADER:
        assert section in doc, f"{name}: header lacks {section!r}"
    patch = registry.patches()[name]
    assert isinstance(patch, patching.Patch) and patch.name == name, patch
    info = about.of(name)  # its fields are About's to require (kimi_hotfix.tools.about)
    assert not isinstance(info, about.Unknown), info.why
    upstream_says(name, info, doc)


RELEASE = r"\d+\.\d+\.\d+"


def upstream_says(name, patch, doc):
    """The header's Upstream: paragraph agrees with what the README table and
    ``check`` show (``patch``: its About): the PR it cites; the release that
    fixes it, or, with no fixed release, that none does (up to which release);
    the file under upstream/ proposing the fix, where it names one, exists."""
    found = re.search(r"^Upstream:(.*?)(?=^Needed when)", doc, re.S | re.M)
    assert found, f"{name}: no Upstream: paragraph before Needed when"
    says = " ".join(found.group(1).split())
    for pr in re.findall(r"PR #\d+", patch.upstream):
        assert pr in says, f"{name}: header does not cite {pr}: {says}"
    files = [patch.proposed] if patch.proposed else []
    for rel in files:
        assert (REPO / rel).is_file(), f"{name}: {rel} does not exist"
        assert rel in says, f"{name}: header does not name {rel}: {says}"
    if patch.fixed_in:
        assert re.fullmatch(RELEASE, patch.fixed_in), patch.fixed_in
        assert re.search(r"PR #\d+", patch.upstream), f"{name}: fixed, but cites no PR"
        assert re.search(rf"(?<![\d.]){re.escape(patch.fixed_in)}(?!\.?\d)", says), (
            f"{name}: header does not name {patch.fixed_in}: {says}")
        assert not re.search(r"no release|not fixed|no PR", says), f"{name}: {says}"
    else:
        assert re.search(rf"no release up to {RELEASE}", says), (
            f"{name}: no fixed release, and the header does not say so: {says}")
        if patch.upstream.startswith("no PR"):
            assert says.startswith("no PR yet"), f"{name}: {says}"


def _imports(path):
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            yield from ((node.module or "") + "." + a.name for a in node.names)


def test_no_patch_imports_core():
    """A patch gets what it needs through ``apply(module, ctx)``."""
    found = [f"{p.relative_to(REPO)}: {name}" for p in (PACKAGE / "patches").rglob("*.py")
             for name in _imports(p)
             if name.startswith(("kimi_hotfix.runtime.core", "kimi_hotfix.runtime.state"))]
    assert found == []


def test_a_patch_class_refuses_to_be_defined_without_what_it_needs():
    """The required parts are the class's to enforce (not a test's regexes):
    ``decide``, ``apply`` and ``wraps`` (qualified names); ``probe`` has a default."""
    with pytest.raises(TypeError):
        patching.Patch()

    def body(**parts):
        decide = lambda self, module, optimize: patching.needed("x")  # noqa: E731
        apply = lambda self, module, ctx: None  # noqa: E731
        return {"decide": decide, "apply": apply, "wraps": ("Thing.method",), **parts}

    for missing in ("decide", "apply"):
        parts = body()
        del parts[missing]
        with pytest.raises(TypeError, match=f"does not define {missing}"):
            type("Lacking", (patching.Patch,), parts)
    for wraps, says in (((), "non-empty tuple"), (["f"], "non-empty tuple"),
                        (("a b",), "not a qualified name"), ((3,), "not a qualified name")):
        with pytest.raises(TypeError, match=says):
            type("BadWraps", (patching.Patch,), body(wraps=wraps))
    minimal = type("Minimal", (patching.Patch,), body())()
    result = minimal.probe()  # no probe.py beside it: says so, runs nothing
    assert result.ok is None and result.error.startswith("no probe"), result


LOG_METHODS = {"debug", "info", "warning", "warn", "error", "exception", "critical", "log"}


def test_the_package_logs_only_through_the_catalog():
    """Every line the shim can log is in kimi_hotfix.runtime.messages (and so in the
    troubleshooting table, docs/troubleshooting.md): no other logging call in the package."""
    found = []
    for path in [*PACKAGE.rglob("*.py"), REPO / "sitecustomize.py"]:
        if path.name == "messages.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and node.func.attr in LOG_METHODS and not (
                        path.name in ("sitecustomize.py", "plugin.py")
                        and ast.unparse(node.args[0]) == "INACTIVE")):
                receiver = ast.unparse(node.func.value)
                if "log" in receiver.lower():
                    found.append(f"{path.relative_to(REPO)}:{node.lineno}: {ast.unparse(node)[:80]}")
    assert found == []


def test_every_catalog_message_is_used():
    used = "\n".join(p.read_text() for p in PACKAGE.rglob("*.py") if p.name != "messages.py")
    names = [n for n, v in vars(messages).items() if isinstance(v, messages.Message)]
    assert sorted(names) == sorted(n for n in names if vars(messages)[n] in messages.CATALOG)
    unused = [n for n in names if n != "INACTIVE" and f"messages.{n}" not in used]
    assert unused == []


def test_the_bootstrap_logs_the_catalogs_inactive_line():
    """The bootstrap and the plugin's entry point log INACTIVE themselves (the
    package may be what is broken): the catalog's text, the catalog's prefix
    (FORMAT), by one and the same function."""
    functions = []
    for path in (REPO / "sitecustomize.py", PACKAGE / "plugin.py"):
        tree = ast.parse(path.read_text())
        consts = {ast.unparse(n.targets[0]): n.value.value for n in tree.body
                  if isinstance(n, ast.Assign) and isinstance(n.value, ast.Constant)}
        assert consts["INACTIVE"] == messages.INACTIVE.text, path
        assert consts["FORMAT"] == messages.FORMAT, path
        (func,) = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "inactive"]
        functions.append(ast.dump(func))
    assert functions[0] == functions[1]


def test_no_assert_in_the_package():
    """python -O strips assert: the package raises instead."""
    found = [f"{p.relative_to(REPO)}:{n.lineno}" for p in PACKAGE.rglob("*.py")
             for n in ast.walk(ast.parse(p.read_text())) if isinstance(n, ast.Assert)]
    assert found == []


def test_readme_tables_are_generated():
    assert sorted(m for markers in docs.PAGES.values() for m in markers) == sorted(docs.TABLES)
    for name, markers in docs.PAGES.items():
        page = (REPO / name).read_text()
        for marker in markers:
            assert f"<!-- {marker} -->" in page and f"<!-- /{marker} -->" in page, (name, marker)
        assert docs.render(page) == page, "run: scripts/docs --table (regenerates them)"
    troubleshooting = (REPO / "docs" / "troubleshooting.md").read_text()
    for message in messages.CATALOG:  # the troubleshooting table lists every line
        assert message.shown.replace("|", "\\|") in troubleshooting, message.shown

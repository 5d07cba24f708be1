"""docs/security.md holds: every test it names exists, and every function of
the package that writes or removes files is named in it (a new file the shim
writes gets a row, and so a test)."""

from __future__ import annotations

import ast
import re

from helpers import REPO

DOC = REPO / "docs" / "security.md"
# calls that write or remove files: os.open with O_CREAT, open() for writing, and these
WRITES = {"mkdtemp", "mkstemp", "replace", "unlink", "rmtree", "mkdir", "makedirs", "write_text",
          "write_bytes", "rename", "symlink", "remove", "rmdir", "NamedTemporaryFile"}


def writers() -> set:
    """``module.function`` of every function in kimi_hotfix/ that writes or removes a file."""
    found = set()
    for path in sorted((REPO / "kimi_hotfix").rglob("*.py")):
        if "_vendor" in path.parts:
            continue
        module = ".".join(path.relative_to(REPO).with_suffix("").parts).replace(".__init__", "")

        def visit(node, where):
            for child in ast.iter_child_nodes(node):
                inner = where
                if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                    inner = f"{where}.{child.name}"
                if isinstance(child, ast.Call):
                    func = child.func
                    name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
                    owner = getattr(getattr(func, "value", None), "id", "")
                    if name == "open" and owner == "os" and "O_CREAT" in ast.dump(child):
                        found.add(inner)
                    elif name == "open" and not owner:
                        modes = child.args[1:2] + [k.value for k in child.keywords if k.arg == "mode"]
                        mode = modes[0].value if modes and isinstance(modes[0], ast.Constant) else ""
                        if set(str(mode)) & set("wax+"):
                            found.add(inner)
                    elif name in WRITES and (owner in ("os", "shutil", "tempfile")
                                             or name in ("write_text", "write_bytes", "mkdir")
                                             or (not owner and name in ("mkdtemp", "mkstemp", "rmtree"))):
                        found.add(inner)
                visit(child, inner)

        visit(ast.parse(path.read_text()), module)
    return found


def test_every_function_that_writes_files_has_a_row():
    named = set(re.findall(r"`(kimi_hotfix\.[\w.]+)`", DOC.read_text()))
    missing = writers() - named
    assert not missing, f"docs/security.md has no row for {sorted(missing)}"
    assert writers(), "the scan found nothing: it is broken"


def test_every_test_named_exists():
    named = re.findall(r"`(tests/[\w/]+\.py)::(\w+)`", DOC.read_text())
    assert len(named) >= 15
    missing = [f"{path}::{name}" for path, name in named
               if not re.search(rf"^def {name}\(", (REPO / path).read_text(), re.M)]
    assert missing == []


def test_every_row_names_a_test():
    rows = [line for line in DOC.read_text().splitlines()
            if line.startswith("| ") and not line.startswith(("| what |", "|---"))]
    assert len(rows) >= 15
    assert [row for row in rows if "tests/" not in row] == []

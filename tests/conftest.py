"""Shared test plumbing.

``scripts/test`` runs pytest once inside each cached vLLM venv (0.29.0, 0.30.0,
0.33.0) with KIMI_HOTFIX_VLLM set to that venv's release. A test module says which
releases it is for with ``pytestmark = pytest.mark.vllm("0.29.0", ...)``; other
passes deselect it (deselected, never skipped). A skipped test fails the run:
a vLLM suite that cannot run must not pass quietly.

Everything that claims vLLM behaviour runs in subprocesses of real interpreters
(so ``-O``/``-OO``, PYTHONHASHSEED and the sitecustomize bootstrap are real).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
VLLM_VERSION = os.environ.get("KIMI_HOTFIX_VLLM", "")
JSON_MARK = "KIMI_JSON:"
OPT_FLAGS = ([], ["-O"], ["-OO"])
OPT_IDS = ("plain", "O", "OO")


def pytest_configure(config):
    config.addinivalue_line("markers", "vllm(*versions): run only in these vLLM venv passes")
    if not VLLM_VERSION:
        raise pytest.UsageError(
            "run the suite with scripts/test (it sets KIMI_HOTFIX_VLLM and builds the venvs)"
        )
    from importlib.metadata import version

    installed = version("vllm")
    if installed != VLLM_VERSION:
        raise pytest.UsageError(f"KIMI_HOTFIX_VLLM={VLLM_VERSION} but vllm {installed} is installed")


def pytest_collection_modifyitems(config, items):
    keep, drop = [], []
    for item in items:
        marker = item.get_closest_marker("vllm")
        if marker is None or VLLM_VERSION in marker.args:
            keep.append(item)
        else:
            drop.append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


def pytest_sessionfinish(session, exitstatus):
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    skipped = len(reporter.stats.get("skipped", [])) if reporter else 0
    if skipped and session.exitstatus == 0:
        session.exitstatus = 1
        if reporter:
            reporter.write_line(f"FAILED: {skipped} test(s) skipped; skips are not allowed here")


def venv_python(version: str) -> str:
    """The python of the cached venv with vLLM ``version``; built if missing."""
    if version == VLLM_VERSION:
        return sys.executable
    proc = subprocess.run(
        [str(REPO / "scripts" / "build-venv"), version], capture_output=True, text=True
    )
    if proc.returncode != 0:
        pytest.fail(f"could not build the vLLM {version} venv:\n{proc.stderr[-4000:]}")
    return str(Path(proc.stdout.strip().splitlines()[-1]) / "bin" / "python")


def hermetic_env(shim: bool = True, **extra) -> dict:
    """Environment for a child interpreter: CPU vLLM, offline, no stray toggles."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("KIMI_HOTFIX") and k not in ("PYTHONPATH", "PYTHONOPTIMIZE")
    }
    env.update(
        VLLM_TARGET_DEVICE="cpu",
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        VLLM_NO_USAGE_STATS="1",
        VLLM_CACHE_ROOT=os.path.join(tempfile.gettempdir(), "kimi-hotfix-vllm-cache"),
        VLLM_LOGGING_LEVEL="ERROR",
    )
    if shim:
        env["PYTHONPATH"] = str(REPO)
    env.update({k: str(v) for k, v in extra.items() if v is not None})
    return env


def run_python(args, *, python=None, flags=(), env=None, cwd=None, timeout=900, check=True):
    """Run ``python [flags] args`` and return the CompletedProcess (text)."""
    cmd = [python or sys.executable, *flags, *args]
    proc = subprocess.run(
        cmd,
        env=hermetic_env() if env is None else env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if check and proc.returncode != 0:
        raise AssertionError(
            f"{' '.join(cmd)} exited {proc.returncode}\n--- stdout\n{proc.stdout[-6000:]}"
            f"\n--- stderr\n{proc.stderr[-6000:]}"
        )
    return proc


def json_lines(stdout: str) -> list:
    """Objects printed as ``KIMI_JSON:{...}`` lines, in order."""
    return [json.loads(line[len(JSON_MARK):]) for line in stdout.splitlines() if line.startswith(JSON_MARK)]


@pytest.fixture
def vllm_version():
    return VLLM_VERSION

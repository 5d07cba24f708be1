"""The vLLM plugin path (issue 4 item 3), with a real ``pip install``.

The project is pip-installed (non-editable, from a copy of the source tree, so
nothing is written into the checkout) into a throwaway venv that sees the real
vLLM 0.29.0 venv's packages through a .pth line. There is no PYTHONPATH: vLLM's
own plugin loader, ``vllm.plugins.load_general_plugins()``, reads the
``vllm.general_plugins`` entry point and arms the shim (that run is the fault
tier's: tests/real/test_fault_tier.py). With the PYTHONPATH bootstrap active as
well, each target is still wrapped once (the harness's -O child). ``python -m
kimi_hotfix status`` and the ``kimi-hotfix`` script run from the installed copy.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from harness import child, venv_python
from helpers import PATCHES, REPO, hermetic_env, run_python, summaries
from standins.venvs import layered_venv, site_dirs, site_packages

pytestmark = pytest.mark.releases("0.29.0")



def python_cwd(python):
    """A working directory without a kimi_hotfix/ in it (``-c`` and ``-m`` put
    the working directory first on sys.path; the checkout's copy must not
    stand in for the installed one)."""
    return str(Path(python).parents[1])


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """(python, site-packages) of a venv with kimi-hotfix pip-installed."""
    root = tmp_path_factory.mktemp("plugin")
    src = root / "src"
    shutil.copytree(
        REPO, src,
        ignore=shutil.ignore_patterns(".git", "tests", "bench", "__pycache__", "build",
                                      "*.egg-info", "bundle*", "_vendor"),
    )
    base = venv_python("0.29.0")
    python = layered_venv(root / "venv", base, site_dirs(base))
    # the vLLM venv's pip installs into the new venv (--python); no network:
    # no dependencies (wrapt comes from the vLLM venv), setuptools from there too
    run_python(
        ["-m", "pip", "--python", python, "install", "-q", "--no-deps", "--no-build-isolation",
         "--no-index", str(src)],
        python=base, env=hermetic_env(shim=False), timeout=600,
    )
    site = site_packages(python)
    return python, site


def test_pip_install_lays_out_the_package_and_entry_point(release, installed):
    python, site = installed
    assert (site / "kimi_hotfix" / "runtime" / "core.py").is_file()
    assert not (site / "sitecustomize.py").exists()  # never hijack the image's sitecustomize
    dist = [p for p in site.glob("kimi_hotfix-*.dist-info")]
    assert len(dist) == 1
    eps = (dist[0] / "entry_points.txt").read_text()
    assert "[vllm.general_plugins]" in eps and "kimi_hotfix = kimi_hotfix.plugin:register" in eps


def test_vllm_plugin_loader_after_the_bootstrap_wraps_once_and_off_wraps_nothing(release):
    """vLLM's plugin loader in a process the bootstrap armed (PYTHONPATH: the
    dist-info beside the package carries the entry point): it adds "vllm-plugin",
    wraps nothing twice and logs no line; with KIMI_HOTFIX=0 it arms and wraps
    nothing, and vLLM's -O bug is there. Both ride at the end of the 0.29.0 -O
    children (harness.child_spec); the plugin alone, pip's layout without
    PYTHONPATH, is the fault tier's -O plugin run
    (test_fault_tier.py::test_the_installed_plugin_alone_arms_on_the_real_vllm)."""
    on = child(release, "on", "O")
    out = on["plugins"]
    before = out["before"]["armed_by"]  # the bootstrap first (then check's own arming calls)
    assert before[0] == "sitecustomize" and "vllm-plugin" not in before, before
    assert out["armed_by"] == [*before, "vllm-plugin"]
    assert out["wrapped"] == out["before"]["wrapped"]  # the same wrappers, not one more
    assert {v["patch"] for v in out["wrapped"].values()} == set(PATCHES)
    assert all(v["layers"] == 1 for v in out["wrapped"].values())
    assert {k: v["patch"] for k, v in out["wrapped"].items()} == out["recorded"]
    # vLLM's own merge, plain under -O parity: its assert refuses the target + draft pair
    assert out["capability"] is True and out["vllm_own_merge_capability"] == "AssertionError"
    logged = on.section_stderr("plugins")
    assert summaries(logged) == {}, logged  # the plugin's arming changed nothing: no line
    off = child(release, "off", "O")["plugins"]
    assert off["armed_by"][-1] == "vllm-plugin" and off["wrapped"] == {} and off["recorded"] == {}
    assert set(off["kinds"].values()) == {"disabled"}
    assert off["capability"] is False  # the kill switch through the plugin: vLLM's -O bug


def test_installed_status_command(release, installed):
    python, site = installed
    proc = run_python(["-m", "kimi_hotfix", "status", "--json"], python=python,
                      env=hermetic_env(shim=False), cwd=python_cwd(python))
    status = json.loads(proc.stdout)
    assert status["kimi_hotfix"]["path"] == str(site / "kimi_hotfix")
    assert status["plugin"]["installed"] is True and status["plugin"]["loads"] is True
    assert status["shim"]["sitecustomize_loaded"] is False
    assert status["vllm"]["version"] == "0.29.0"
    assert status["active"] is True and proc.returncode == 0
    # the plugin alone: the shim arms when vLLM loads its plugins, not at ``import vllm``
    assert status["active_reason"].startswith("arms when vLLM loads its plugins (via vLLM plugin)")
    assert status["plugin"]["source"] == "installed"
    # VLLM_PLUGINS without our name: status says the plugin will not load
    proc = run_python(["-m", "kimi_hotfix", "status", "--json"], python=python,
                      env=hermetic_env(shim=False, VLLM_PLUGINS="someone_else"), cwd=python_cwd(python),
                      check=False)
    status = json.loads(proc.stdout)
    assert status["plugin"]["loads"] is False and "VLLM_PLUGINS" in status["plugin"]["why"]
    assert proc.returncode == 3 and status["active"] is False  # the gate
    assert status["active_reason"].startswith("INACTIVE")
    # the console script
    script = Path(python).parent / "kimi-hotfix"
    proc = run_python(["status"], python=str(script), env=hermetic_env(shim=False),
                      cwd=python_cwd(python))
    assert "installed: vLLM arms the shim in every process it starts" in proc.stdout

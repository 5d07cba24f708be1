"""The vLLM plugin path (issue 4 item 3), with a real ``pip install``.

The project is pip-installed (non-editable, from a copy of the source tree, so
nothing is written into the checkout) into a throwaway venv that sees the real
vLLM 0.29.0 venv's packages through a .pth line. There is no PYTHONPATH: vLLM's
own plugin loader, ``vllm.plugins.load_general_plugins()``, reads the
``vllm.general_plugins`` entry point and arms the shim. With the PYTHONPATH
bootstrap active as well, each target is still wrapped once. ``python -m
kimi_hotfix status`` and the ``kimi-hotfix`` script run from the installed copy.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from harness import venv_python
from helpers import PATCHES, REPO, STANDINS, hermetic_env, json_lines, line_states, run_python, summaries
from standins.venvs import layered_venv, site_dirs, site_packages

pytestmark = pytest.mark.releases("0.29.0")

PRELUDE = f"import sys; sys.path.append({str(STANDINS)!r}); import mechanics\n"
LOAD_PLUGINS = (
    "import sys\n"
    "import vllm.v1.kv_cache_interface as kv\n"
    + PRELUDE
    + "before = {'core': 'kimi_hotfix.core' in sys.modules,\n"
    "          'wrapped': hasattr(vars(kv.MLAAttentionSpec)['merge'], '_self_kimi_hotfix_patch')}\n"
    "import vllm.plugins\n"
    "vllm.plugins.load_general_plugins()\n"  # what every vLLM process does at start
    "mechanics.emit(mechanics.report(before=before, capability=mechanics.mla_capability(kv),\n"
    "    vllm_own_merge_capability=mechanics.mla_capability(kv, original=True)))\n"
)


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
    assert (site / "kimi_hotfix" / "core.py").is_file()
    assert not (site / "sitecustomize.py").exists()  # never hijack the image's sitecustomize
    dist = [p for p in site.glob("kimi_hotfix-*.dist-info")]
    assert len(dist) == 1
    eps = (dist[0] / "entry_points.txt").read_text()
    assert "[vllm.general_plugins]" in eps and "kimi_hotfix = kimi_hotfix.plugin:register" in eps


def test_vllm_plugin_loader_arms_without_pythonpath(release, installed):
    python, site = installed
    runs = {}
    for label, extra in (("on", {}), ("off", {"KIMI_HOTFIX": "0"})):
        proc = run_python(["-c", LOAD_PLUGINS], python=python, flags=["-O"],
                          env=hermetic_env(shim=False, **extra), cwd=python_cwd(python))
        runs[label] = (json_lines(proc.stdout)[0], proc.stderr)
    out, stderr = runs["on"]
    assert out["before"] == {"core": False, "wrapped": False}  # vLLM alone loads no plugin
    assert out["bootstrap_loaded"] is False
    assert out["kimi_hotfix_file"].startswith(str(site))
    assert out["armed_by"] == ["vllm-plugin"]
    assert out["states"]["kv_spec_merge"] == "applied"
    assert out["wrapped"]["MLAAttentionSpec.merge"] == {"patch": "kv_spec_merge", "layers": 1}
    assert all(v["layers"] == 1 for v in out["wrapped"].values())
    assert out["capability"] is True and out["vllm_own_merge_capability"] is False
    (lines,) = summaries(stderr).values()  # armed by the plugin after the import: one line
    first, last = line_states(lines[0]), line_states(lines[-1])
    assert (first["kv_spec_merge"], first["capture_workspace"], first["kda_overlong_rows"]) == (
        "applied", "pending", "pending"), lines
    assert (last["capture_workspace"], last["kda_overlong_rows"]) == ("not loaded",) * 2, lines
    # the same installed plugin with KIMI_HOTFIX=0: vLLM's -O bug reproduces
    off, _ = runs["off"]
    assert off["armed_by"] == ["vllm-plugin"] and off["wrapped"] == {}
    assert off["capability"] is False


def test_plugin_and_pythonpath_bootstrap_wrap_once(release, installed):
    python, _ = installed
    proc = run_python(["-c", LOAD_PLUGINS], python=python, flags=["-O"], env=hermetic_env(),
                      cwd=python_cwd(python))
    out = json_lines(proc.stdout)[0]
    assert out["before"] == {"core": True, "wrapped": True}  # the bootstrap armed first
    assert out["armed_by"] == ["sitecustomize", "vllm-plugin"]
    assert out["wrapped"]["MLAAttentionSpec.merge"] == {"patch": "kv_spec_merge", "layers": 1}
    assert all(v["layers"] == 1 for v in out["wrapped"].values())
    assert {k: v["patch"] for k, v in out["wrapped"].items()} == out["recorded"]
    assert out["capability"] is True
    (lines,) = summaries(proc.stderr).values()  # a line per change; the plugin added none
    assert line_states(lines[0]) == dict.fromkeys(PATCHES, "pending")  # the bootstrap armed
    states = [line_states(line) for line in lines]
    assert sum(s["kv_spec_merge"] == "applied" for s in states) == len(states) - 1
    assert (states[-1]["capture_workspace"], states[-1]["kda_overlong_rows"]) == ("not loaded",) * 2


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

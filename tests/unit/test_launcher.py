"""Arming under a launcher whose sitecustomize shadows the bootstrap (issue 32), without vLLM.

The shim's directory carries ``kimi_hotfix-<version>.dist-info`` with the
``vllm.general_plugins`` entry point: where an APM launcher's sitecustomize
(``opentelemetry-instrument``) runs first and never chains the next one, vLLM's
plugin loader arms the shim instead (tests/real/test_launcher.py on the real
vLLM, tests/e2e ``sf-O-otel`` under the real launcher). Here:

- the dist-info is the package's: its version, setup.cfg's entry point, no
  requirement (``pip check`` stays clean in an image without wrapt);
- ``status`` names the sitecustomize that ran, says the bootstrap is shadowed
  and that the shim arms through the plugin, and what that covers; it still
  exits 3 where the plugin would not load either (VLLM_PLUGINS);
- a dist-info whose entry_points.txt cannot be parsed makes vLLM's plugin
  loader raise (``importlib.metadata.entry_points()`` fails for every plugin):
  ``status`` reports the shim BROKEN there and exits 1.
"""

from __future__ import annotations

import configparser
import json
import os
import shutil

import pytest

from helpers import REPO, STANDINS, hermetic_env, run_python

PACKAGE_DIR = str(REPO / "kimi_hotfix")
APM_SITE = STANDINS / "apm_site"


def version():
    from kimi_hotfix import __version__
    return __version__


def dist_info():
    return REPO / f"kimi_hotfix-{version()}.dist-info"


def test_the_dist_info_is_the_packages():
    info = dist_info()
    assert sorted(p.name for p in info.iterdir()) == ["METADATA", "entry_points.txt"]
    meta = (info / "METADATA").read_text()
    assert "Name: kimi-hotfix\n" in meta and f"Version: {version()}\n" in meta
    headers = meta.split("\n\n", 1)[0]
    assert "Requires-Dist:" not in headers  # wrapt: the image's, or the bundle's private copy
    ours = configparser.ConfigParser()
    ours.read_string((info / "entry_points.txt").read_text())
    setup = configparser.ConfigParser()
    setup.read(REPO / "setup.cfg")
    declared = dict(line.split(" = ") for line in
                    setup["options.entry_points"]["vllm.general_plugins"].strip().splitlines())
    assert ours.sections() == ["vllm.general_plugins"]
    assert dict(ours["vllm.general_plugins"]) == declared
    assert len(list(REPO.glob("kimi_hotfix-*.dist-info"))) == 1  # renamed with the version


@pytest.fixture
def stand_in_vllm(tmp_path):
    """A ``vllm`` package with its distribution metadata (status reads only that)."""
    root = tmp_path / "site"
    (root / "vllm").mkdir(parents=True)
    (root / "vllm" / "__init__.py").write_text("raise ImportError('status imported vllm')\n")
    info = root / "vllm-0.29.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: vllm\nVersion: 0.29.0\n")
    return root


def status(path, *args, **env):
    proc = run_python(["-m", "kimi_hotfix", "status", *args],
                      env=hermetic_env(PYTHONPATH=os.pathsep.join(map(str, path)), **env),
                      cwd=str(APM_SITE.parent), check=False)
    return proc.returncode, (json.loads(proc.stdout) if "--json" in args else proc.stdout)


def test_status_under_a_shadowing_sitecustomize(stand_in_vllm):
    path = [APM_SITE, REPO, stand_in_vllm]
    rc, report = status(path, "--json")
    apm = str(APM_SITE / "sitecustomize.py")
    shim, plugin = report["shim"], report["plugin"]
    assert rc == 0 and report["active"] is True, report["active_reason"]
    assert shim["sitecustomize_loaded"] is False and shim["sitecustomize_ran"] == [apm]
    assert shim["shadowed_by"] == apm and shim["why"].startswith("SHADOWED: ")
    assert plugin["source"] == "pythonpath" and plugin["dist_info"] == str(dist_info())
    assert plugin["loads"] is True
    assert report["active_reason"] == (
        f"arms when vLLM loads its plugins (via vLLM plugin; the bootstrap is shadowed by {apm}): "
        "servers, engine cores, workers and LLM() load them; a script that only imports vLLM "
        "modules runs unpatched")
    _, text = status(path)
    flat = " ".join(text.split())
    assert f"sitecustomize that ran here: {apm}" in flat and "SHADOWED:" in flat, text
    assert f"from the dist-info below\n{' ' * 13}{dist_info()}\n" in text, text
    # the plugin refused by VLLM_PLUGINS: nothing arms, and status says why, shadowing included
    rc, report = status(path, "--json", VLLM_PLUGINS="someone_else")
    assert rc == 3 and report["active_reason"].startswith("INACTIVE: sitecustomize SHADOWED")
    # the bootstrap first: it runs and chains the launcher's; both arm (one arming, tests/real)
    rc, report = status([REPO, APM_SITE, stand_in_vllm], "--json")
    assert rc == 0 and report["shim"]["sitecustomize_ran"] == [str(REPO / "sitecustomize.py"), apm]
    assert report["shim"]["shadowed_by"] is None
    assert report["active_reason"] == "arms when vLLM is imported (via sitecustomize and vLLM plugin)"


ENTRY_POINTS = "[vllm.general_plugins]\nkimi_hotfix = kimi_hotfix.plugin:register\n"
LOADER = ("import sys\nfrom importlib.metadata import entry_points\n"
          "try:\n    found = entry_points()\n"  # what vLLM's loader asks (3.10+: with group=)
          "    list(found.select(group='vllm.general_plugins') if hasattr(found, 'select')\n"
          "         else found.get('vllm.general_plugins', ()))\n"
          "except Exception as exc:\n    print(type(exc).__name__)\nelse:\n    print('ok')\n")


@pytest.mark.parametrize("cut", [len(ENTRY_POINTS), len("[vllm.general_plugins]\nkimi_hot")])
def test_a_dist_info_vllm_cannot_read_is_reported_broken(tmp_path, stand_in_vllm, cut):
    """A copy of the shim whose entry_points.txt is cut inside the entry's name
    (an interrupted copy): importlib.metadata raises in vLLM's loader for every
    plugin; status says so, names the file, exits 1. The whole file: healthy."""
    copy = tmp_path / "shim"
    copy.mkdir()
    shutil.copy(REPO / "sitecustomize.py", copy)
    shutil.copytree(REPO / "kimi_hotfix", copy / "kimi_hotfix",
                    ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(dist_info(), copy / dist_info().name)
    (copy / dist_info().name / "entry_points.txt").write_text(ENTRY_POINTS[:cut])
    path = [APM_SITE, copy, stand_in_vllm]
    env = hermetic_env(PYTHONPATH=os.pathsep.join(map(str, path)))
    loader = run_python(["-c", LOADER], env=env, cwd=str(tmp_path)).stdout.strip()
    proc = run_python([str(copy / "kimi_hotfix"), "status", "--json"], env=env,
                      cwd=str(tmp_path), check=False)
    report = json.loads(proc.stdout)
    if cut == len(ENTRY_POINTS):
        assert loader == "ok" and proc.returncode == 0 and report["broken"] == []
        return
    # vLLM's load_plugins_by_group asks the same: TypeError (3.10+), ParsingError (3.9)
    assert loader in ("TypeError", "ParsingError"), loader
    assert proc.returncode == 1 and report["active_reason"].startswith("BROKEN"), report
    (item,) = report["broken"]
    assert item["module"] == str(copy / dist_info().name) and loader in item["error"]
    assert report["plugin"]["why"].startswith("vLLM's plugin loader will raise")

"""The drop-in bundle (issue 4 item 4): scripts/bundle, for every Python here.

For each Python version this machine can run (pyenv 3.9 to 3.13) a bundle is
built (wrapt from the registry for that version and manylinux2014_x86_64) and
put on PYTHONPATH of a fresh venv of that version that has NO wrapt. The shim
arms from the bundle alone: wrapt resolves from the bundle, and with
PYTHONDONTWRITEBYTECODE=1 every bundle module loads from its precompiled .pyc.
vLLM itself exists only for Python 3.11 here: that bundle runs the real vLLM
0.29.0 (a wrapt-less venv layered over the 0.29.0 venv); the others use the
stand-in vllm package (shim mechanics only). A bundle that cannot be built (no
registry, no wheel) fails the test. Children run in a temporary working
directory: ``python -c`` puts the working directory first on sys.path, and the
checkout's own kimi_hotfix/ must not stand in for the bundle's.
"""

from __future__ import annotations

import glob
import hashlib
import json
import re
import sys
import tarfile
from pathlib import Path

import pytest

from conftest import REPO, hermetic_env, json_lines, run_python
from standins.venvs import layered_venv, vllm_site_packages

pytestmark = pytest.mark.vllm("0.29.0")

STANDINS = REPO / "tests" / "standins"
PRELUDE = f"import sys; sys.path.append({str(STANDINS)!r}); import mechanics\n"
VERSIONS = ("3.9", "3.10", "3.11", "3.12", "3.13")
TARGETS = (
    "vllm.v1.kv_cache_interface",
    "vllm.v1.worker.gpu.cudagraph_utils",
    "vllm.models.kimi_k3.nvidia.kda_metadata",
)


def pyenv_python(version):
    found = sorted(glob.glob(f"/root/.pyenv/versions/{version}.*/bin/python"))
    assert found, f"no Python {version} on this machine"
    return found[-1]


def build_bundle(version, out):
    proc = run_python([str(REPO / "scripts" / "bundle"), "--python-version", version, "--out", str(out)],
                      env=hermetic_env(shim=False, PIP_ROOT_USER_ACTION="ignore"), timeout=600)
    bundle, archive = (Path(p) for p in proc.stdout.split()[-2:])
    return bundle, archive


def pyc_loads(stderr, root):
    """(modules from .pyc, modules compiled from source) under ``root``, from -v."""
    pyc, src = [], []
    for line in stderr.splitlines():
        m = re.match(r"# code object from '?([^']+?)'?$", line)
        if m and m.group(1).startswith(str(root)):
            (pyc if m.group(1).endswith(".pyc") else src).append(m.group(1))
    return pyc, src


def check_manifest_and_tarball(bundle, archive, version, tmp_path):
    manifest = json.loads((bundle / "MANIFEST.json").read_text())
    assert manifest["python_version"] == version
    assert manifest["platform"] == "manylinux2014_x86_64"
    assert (bundle / "VERSION").read_text().strip() == manifest["kimi_hotfix"]
    assert manifest["wrapt"]["compiled_extension"] is True  # x86_64 wheels exist for 3.9-3.13
    assert manifest["bytecode"]["optimize_levels"] == [0, 1, 2]
    files = manifest["files"]
    for rel in ("sitecustomize.py", "kimi_hotfix/core.py", "wrapt/__init__.py"):
        assert rel in files
    tag = "cpython-" + version.replace(".", "")
    assert f"__pycache__/sitecustomize.{tag}.opt-1.pyc" in files
    for rel, digest in files.items():
        assert hashlib.sha256((bundle / rel).read_bytes()).hexdigest() == digest, rel
    # the tarball holds the same files under one top-level directory
    with tarfile.open(archive) as tar:
        names = {n for n in tar.getnames() if tar.getmember(n).isfile()}
    assert names == {f"{bundle.name}/{rel}" for rel in [*files, "MANIFEST.json"]}


@pytest.mark.parametrize("version", VERSIONS)
def test_bundle_arms_in_a_venv_without_wrapt(tmp_path, version):
    bundle, archive = build_bundle(version, tmp_path / "out")
    check_manifest_and_tarball(bundle, archive, version, tmp_path)
    python = layered_venv(tmp_path / "venv", pyenv_python(version))
    missing = run_python(["-c", "import wrapt"], python=python, env=hermetic_env(shim=False), check=False)
    assert "No module named 'wrapt'" in missing.stderr
    env = hermetic_env(shim=False, PYTHONDONTWRITEBYTECODE="1")
    env["PYTHONPATH"] = f"{bundle}:{STANDINS / 'vllm_complete'}"
    code = (
        "".join(f"import {t}\n" for t in TARGETS)
        + "import wrapt, sitecustomize\n"
        + PRELUDE
        + "mechanics.emit(mechanics.report(wrapt=wrapt.__file__, version=sys.version,\n"
        "    sitecustomize=sitecustomize.__file__))\n"
    )
    proc = run_python(["-c", code], python=python, flags=["-O", "-v"], env=env, cwd=tmp_path)
    out = json_lines(proc.stdout)[0]
    assert out["version"].startswith(version + ".")
    assert out["wrapt"].startswith(str(bundle))
    assert out["sitecustomize"] == str(bundle / "sitecustomize.py")
    assert out["kimi_hotfix_file"].startswith(str(bundle))
    assert out["armed_by"] == ["sitecustomize"]
    assert out["states"] == {p: "applied" for p in out["states"]} and len(out["states"]) == 3
    assert out["wrapped"] and all(v["layers"] == 1 for v in out["wrapped"].values())
    pyc, src = pyc_loads(proc.stderr, bundle)
    assert src == [], src  # no bundle module compiled at start-up
    assert str(bundle / "__pycache__" / f"sitecustomize.cpython-{version.replace('.', '')}.opt-1.pyc") in pyc


def test_bundle_with_real_vllm_in_a_venv_without_wrapt(tmp_path):
    """Python 3.11: the real vLLM 0.29.0, wrapt only from the bundle, under -O."""
    version = "%d.%d" % sys.version_info[:2]
    bundle, _ = build_bundle(version, tmp_path / "out")
    python = layered_venv(tmp_path / "venv", sys.executable, [vllm_site_packages()],
                          hide=("wrapt", "wrapt-*"))
    missing = run_python(["-c", "import vllm, wrapt"], python=python, env=hermetic_env(shim=False), check=False)
    assert "No module named 'wrapt'" in missing.stderr
    env = hermetic_env(shim=False)
    env["PYTHONPATH"] = str(bundle)
    code = (
        "import vllm.v1.kv_cache_interface as kv, wrapt\n"
        + PRELUDE
        + "mechanics.emit(mechanics.report(wrapt=wrapt.__file__,\n"
        "    capability=mechanics.mla_capability(kv),\n"
        "    vllm_own_merge_capability=mechanics.mla_capability(kv, original=True)))\n"
    )
    out = json_lines(run_python(["-c", code], python=python, flags=["-O"], env=env, cwd=tmp_path).stdout)[0]
    assert out["wrapt"].startswith(str(bundle))
    assert out["kimi_hotfix_file"].startswith(str(bundle))
    assert out["states"]["kv_spec_merge"] == "applied"
    assert out["wrapped"]["MLAAttentionSpec.merge"] == {"patch": "kv_spec_merge", "layers": 1}
    assert out["capability"] is True and out["vllm_own_merge_capability"] is False

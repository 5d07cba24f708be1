"""The drop-in bundle (issue 4 item 4, issue 9): scripts/bundle, for every Python here.

The bundle carries wrapt privately, as kimi_hotfix._vendor.wrapt, and must change
nothing it does not name: with the bundle on PYTHONPATH, user code's
``import wrapt`` gives the container's own wrapt (1.14.1 in one venv, 2.x already
imported in another) or still fails where there is none, before and after vLLM
is imported and the shim armed, while the shim arms from its private copy
(wrapt 1.x), with wrapt's C extension loaded under the private name and no
top-level wrapt imported.

For each Python version this machine can run (pyenv 3.9 to 3.13) a bundle is
built (wrapt from the registry for that version and manylinux2014_x86_64) and
put on PYTHONPATH of a fresh venv of that version that has NO wrapt, with the
stand-in vllm package (shim mechanics only: the bundle's files and bytecode per
Python). The shim arms from the bundle alone, and with PYTHONDONTWRITEBYTECODE=1
every bundle module (the private wrapt included) loads from its precompiled
.pyc; start-up imports no kimi_hotfix module besides the bootstrap. The Python
3.11 bundle then runs the real vLLM 0.29.0 wheel three ways: in a venv without
wrapt, in one with wrapt 1.14.1 (both layered over the 0.29.0 venv, its wrapt
hidden), and in the 0.29.0 venv itself, whose wrapt 2.x user code imported
first. A bundle that cannot be built (no registry, no wheel) fails the test.
Children run in a temporary working directory: ``python -c`` puts the working
directory first on sys.path, and the checkout's own kimi_hotfix/ must not stand
in for the bundle's.
"""

from __future__ import annotations

import hashlib
import json
import re
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from harness import venv_python
from helpers import PATCHES, REPO, STANDINS, TARGETS, VLLM_COMPLETE, hermetic_env, json_lines, run_python
from standins.venvs import layered_venv, site_dirs, site_packages, visible

pytestmark = pytest.mark.releases("0.29.0")

PRELUDE = f"import sys; sys.path.append({str(STANDINS)!r}); import mechanics\n"
VERSIONS = ("3.9", "3.10", "3.11", "3.12", "3.13")
PRIVATE = "kimi_hotfix._vendor.wrapt"
NO_WRAPT = "ModuleNotFoundError: No module named 'wrapt'"

# Child side, after the shim armed: which wrapt the shim used, and what user
# code's ``import wrapt`` gives (last: it may load a top-level wrapt).
PROBE = f"""
def wrapt_probe():
    from kimi_hotfix.runtime import state
    private = sys.modules.get({PRIVATE!r})
    out = {{
        "top_level_modules": sorted(m for m in sys.modules if m.split(".")[0] == "wrapt"),
        "private_file": getattr(private, "__file__", None),
        "hook_finders": [type(f).__module__ for f in sys.meta_path
                         if type(f).__name__ == "ImportHookFinder"],
        "wrappers": {{f"{{r.owner.__name__}}.{{r.attr}}": "private FunctionWrapper"
                     if private is not None and isinstance(r.wrapper, private.FunctionWrapper)
                     else type(r.wrapper).__name__
                     for records in state.all_records().values() for r in records}},
    }}
    if private is not None:
        extension = sys.modules.get({PRIVATE!r} + "._wrappers")
        out["extension_file"] = getattr(extension, "__file__", None)
        # the C types are the ones in use, not wrapt's pure-Python fallback
        out["c_extension"] = extension is not None and private.FunctionWrapper is getattr(
            extension, "FunctionWrapper", None)
    try:
        import wrapt
    except ImportError as exc:
        out["import_wrapt"] = type(exc).__name__ + ": " + str(exc)
    else:
        out["import_wrapt"] = wrapt.__version__
        out["import_wrapt_file"] = wrapt.__file__
    return out
"""


def pyenv_python(version):
    """A Python ``version`` (X.Y) found as scripts/build-venv finds one (pythonX.Y
    on PATH, else the newest ~/.pyenv/versions/X.Y.*): no machine's path written in."""
    sys.path.insert(0, str(REPO / "scripts"))
    try:
        import venvlock
    finally:
        sys.path.remove(str(REPO / "scripts"))
    found = venvlock.find_python(version)
    assert found, f"no Python {version} on this machine"
    return found[0]


def build_bundle(version, out):
    proc = run_python([str(REPO / "scripts" / "bundle"), "--python-version", version, "--out", str(out)],
                      env=hermetic_env(shim=False, PIP_ROOT_USER_ACTION="ignore"), timeout=600)
    bundle, archive = (Path(p) for p in proc.stdout.split()[-2:])
    return bundle, archive


@pytest.fixture(scope="module")
def bundle_for(tmp_path_factory):
    """version -> (bundle, tarball), each built once per module."""
    built = {}

    def get(version):
        if version not in built:
            built[version] = build_bundle(version, tmp_path_factory.mktemp(f"bundle-{version}"))
        return built[version]

    return get


def pyc_loads(stderr, root):
    """(modules from .pyc, modules compiled from source) under ``root``, from -v."""
    pyc, src = [], []
    for line in stderr.splitlines():
        m = re.match(r"# code object from '?([^']+?)'?$", line)
        if m and m.group(1).startswith(str(root)):
            (pyc if m.group(1).endswith(".pyc") else src).append(m.group(1))
    return pyc, src


def check_manifest_and_tarball(bundle, archive, version):
    manifest = json.loads((bundle / "MANIFEST.json").read_text())
    assert manifest["python_version"] == version
    assert manifest["platform"] == "manylinux2014_x86_64"
    assert (bundle / "VERSION").read_text().strip() == manifest["kimi_hotfix"]
    wrapt = manifest["wrapt"]
    assert wrapt["private"] is True and wrapt["import_name"] == PRIVATE
    assert wrapt["path"] == "kimi_hotfix/_vendor/wrapt"
    assert wrapt["dist_info"] == f"kimi_hotfix/_vendor/wrapt-{wrapt['version']}.dist-info"
    assert wrapt["compiled_extension"] is True  # x86_64 wheels exist for 3.9-3.13
    assert wrapt["version"].startswith("1.") and wrapt["requirement"] == "wrapt>=1.14,<2"
    # built here for this machine: the private copy was imported once, C extension and all
    assert wrapt["checked"]["c_extension_used"] is True
    assert wrapt["checked"]["top_level_wrapt_imported"] is False
    assert manifest["bytecode"]["optimize_levels"] == [0, 1, 2]
    files = manifest["files"]
    for rel in ("sitecustomize.py", "kimi_hotfix/runtime/core.py", "kimi_hotfix/runtime/_wrapt.py",
                "kimi_hotfix/_vendor/__init__.py", "kimi_hotfix/_vendor/wrapt/__init__.py",
                f"{wrapt['dist_info']}/METADATA", f"{wrapt['dist_info']}/licenses/LICENSE"):
        assert rel in files, rel
    assert any(re.fullmatch(r"kimi_hotfix/_vendor/wrapt/_wrappers\.cpython-.*\.so", rel) for rel in files)
    # nothing wrapt-related at the top level: the container's `import wrapt` is its own;
    # the dist-info carries the vLLM plugin entry point (arming under an APM launcher)
    info = f"kimi_hotfix-{manifest['kimi_hotfix']}.dist-info"
    assert {rel.split("/")[0] for rel in files} == {"sitecustomize.py", "__pycache__",
                                                    "kimi_hotfix", info, "VERSION"}
    assert sorted(p.name for p in bundle.iterdir()) == [
        "MANIFEST.json", "VERSION", "__pycache__", "kimi_hotfix", info, "sitecustomize.py"]
    assert (bundle / info / "entry_points.txt").read_text() == (REPO / info / "entry_points.txt").read_text()
    tag = "cpython-" + version.replace(".", "")
    assert f"__pycache__/sitecustomize.{tag}.opt-1.pyc" in files
    assert f"kimi_hotfix/_vendor/wrapt/__pycache__/__init__.{tag}.opt-1.pyc" in files
    for rel, digest in files.items():
        assert hashlib.sha256((bundle / rel).read_bytes()).hexdigest() == digest, rel
    # the tarball holds the same files under one top-level directory
    with tarfile.open(archive) as tar:
        names = {n for n in tar.getnames() if tar.getmember(n).isfile()}
    assert names == {f"{bundle.name}/{rel}" for rel in [*files, "MANIFEST.json"]}
    return manifest


def check_private_wrapt(out, bundle):
    """The shim armed from the bundle's private wrapt, C extension included,
    and imported no top-level wrapt module to do it."""
    private = bundle / "kimi_hotfix" / "_vendor" / "wrapt"
    assert out["private_file"] == str(private / "__init__.py")
    assert out["c_extension"] is True
    assert out["extension_file"].startswith(str(private / "_wrappers."))
    assert out["hook_finders"] == [f"{PRIVATE}.importer"]  # the post-import hooks are the private copy's
    assert "private FunctionWrapper" in out["wrappers"].values(), out["wrappers"]
    assert set(out["wrappers"].values()) <= {"private FunctionWrapper", "function"}, out["wrappers"]


def importtime_names(python, env, cwd):
    """Modules ``python -X importtime -c pass`` imports at start-up."""
    proc = run_python(["-X", "importtime", "-c", "pass"], python=python, env=env, cwd=cwd)
    rows = [line.split("|") for line in proc.stderr.splitlines() if line.startswith("import time:")]
    return [r[2].strip() for r in rows if r[0].split(":")[1].strip().isdigit()]


@pytest.mark.parametrize("version", VERSIONS)
def test_bundle_arms_privately_in_a_venv_without_wrapt(tmp_path, release, bundle_for, version):
    """The bundle arms the shim where the container has no wrapt, and user code's
    ``import wrapt`` still fails, before and after vLLM (stand-in) is imported."""
    bundle, archive = bundle_for(version)
    check_manifest_and_tarball(bundle, archive, version)
    python = layered_venv(tmp_path / "venv", pyenv_python(version))
    missing = run_python(["-c", "import wrapt"], python=python, env=hermetic_env(shim=False), check=False)
    assert "No module named 'wrapt'" in missing.stderr
    env = hermetic_env(shim=False, PYTHONDONTWRITEBYTECODE="1")
    env["PYTHONPATH"] = f"{bundle}:{VLLM_COMPLETE}"
    # start-up: the bootstrap only; the private wrapt waits for vLLM
    names = importtime_names(python, env, tmp_path)
    assert "sitecustomize" in names
    assert [n for n in names if n.split(".")[0] in ("kimi_hotfix", "wrapt", "vllm")] == [], names
    code = (
        "try:\n    import wrapt\nexcept ImportError as exc:\n"
        "    before = type(exc).__name__ + ': ' + str(exc)\nelse:\n    before = wrapt.__file__\n"
        + "".join(f"import {t}\n" for t in TARGETS)
        + "import sitecustomize\n"
        + PRELUDE
        + PROBE
        + "mechanics.emit(mechanics.report(version=sys.version, before=before,\n"
        "    sitecustomize=sitecustomize.__file__, **wrapt_probe()))\n"
    )
    proc = run_python(["-c", code], python=python, flags=["-O", "-v"], env=env, cwd=tmp_path)
    out = json_lines(proc.stdout)[0]
    assert out["version"].startswith(version + ".")
    assert out["before"] == NO_WRAPT and out["import_wrapt"] == NO_WRAPT
    assert out["top_level_modules"] == []
    check_private_wrapt(out, bundle)
    assert out["sitecustomize"] == str(bundle / "sitecustomize.py")
    assert out["kimi_hotfix_file"].startswith(str(bundle))
    assert out["armed_by"] == ["sitecustomize"]
    assert out["kinds"] == {p: "applied" for p in PATCHES}, out["states"]
    assert out["wrapped"] and all(v["layers"] == 1 for v in out["wrapped"].values())
    pyc, src = pyc_loads(proc.stderr, bundle)
    assert src == [], src  # no bundle module compiled at start-up or when arming
    tag = version.replace(".", "")
    assert str(bundle / "__pycache__" / f"sitecustomize.cpython-{tag}.opt-1.pyc") in pyc
    private_pycache = bundle / "kimi_hotfix" / "_vendor" / "wrapt" / "__pycache__"
    assert str(private_pycache / f"importer.cpython-{tag}.opt-1.pyc") in pyc


def test_bundle_leaves_the_containers_wrapt_1_14_alone(tmp_path, release, bundle_for):
    """The real vLLM 0.29.0 in a venv with wrapt 1.14.1 installed (layered over the
    0.29.0 venv, its own wrapt hidden): user code imports that wrapt, after the shim
    armed from its private copy; both work side by side, and ``status`` names the
    private copy without importing it."""
    bundle, _ = bundle_for("3.11")
    base = venv_python(release)
    python = layered_venv(tmp_path / "venv", base, site_dirs(base), hide=("wrapt", "wrapt-*"))
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
                    "--no-deps", "--only-binary=:all:", "--target", str(site_packages(python)),
                    "wrapt==1.14.1"], check=True, capture_output=True,
                   env=hermetic_env(shim=False, PIP_ROOT_USER_ACTION="ignore"))
    assert visible(python, ["vllm", "wrapt"]) == {"vllm": True, "wrapt": True}
    env = hermetic_env(shim=False)
    env["PYTHONPATH"] = str(bundle)
    code = (
        "".join(f"import {t}\n" for t in TARGETS)
        + PRELUDE
        + PROBE
        + "probe = wrapt_probe()\n"  # imports the container's wrapt last
        "import wrapt\n"
        "fired = []\n"
        "wrapt.register_post_import_hook(lambda m: fired.append(m.__name__), 'json.tool')\n"
        "import json.tool\n"
        "double = wrapt.FunctionWrapper(len, lambda wrapped, instance, args, kwargs: 2 * wrapped(*args))\n"
        "mechanics.emit(mechanics.report(user_hook_fired=fired, user_wrapper=double('abc'),\n"
        "    vllm_file=sys.modules['vllm'].__file__,\n"
        f"    user_wrapper_private=isinstance(double, sys.modules[{PRIVATE!r}].FunctionWrapper), **probe))\n"
    )
    out = json_lines(run_python(["-c", code], python=python, flags=["-O"], env=env, cwd=tmp_path).stdout)[0]
    assert out["vllm_file"].startswith(str(tmp_path / "venv" / "overlay" / "vllm"))  # the wheel's
    assert out["top_level_modules"] == []  # arming imported none of the container's wrapt
    assert out["import_wrapt"] == "1.14.1"
    assert out["import_wrapt_file"] == str(site_packages(python) / "wrapt" / "__init__.py")
    check_private_wrapt(out, bundle)
    assert out["kinds"] == {p: "applied" for p in PATCHES}, out["states"]
    assert out["user_hook_fired"] == ["json.tool"] and out["user_wrapper"] == 6
    assert out["user_wrapper_private"] is False
    # status: the private copy, named and not imported
    code = (
        "import io, sys\n"
        "from kimi_hotfix.tools.status import print_status, status_report\n"
        "report = status_report()\n"
        "text = io.StringIO(); print_status(report, text)\n"
        + PRELUDE
        + "mechanics.emit({'wrapt': report['wrapt'], 'line': [l for l in text.getvalue().splitlines()\n"
        "    if l.strip().startswith('wrapt ')], 'loaded': sorted(m for m in sys.modules if 'wrapt' in m)})\n"
    )
    out = json_lines(run_python(["-c", code], python=python, env=env, cwd=tmp_path).stdout)[0]
    manifest = json.loads((bundle / "MANIFEST.json").read_text())
    assert out["wrapt"] == {"installed": True, "version": manifest["wrapt"]["version"], "source": "vendored",
                            "path": str(bundle / "kimi_hotfix" / "_vendor" / "wrapt")}
    assert "private copy" in out["line"][0], out["line"]
    assert out["loaded"] == ["kimi_hotfix.runtime._wrapt"]


def test_bundle_with_the_containers_wrapt_2_already_imported(tmp_path, release, bundle_for):
    """The 0.29.0 venv has its own wrapt 2.x, and user code imported it (its
    ``wrapt.exceptions`` too) before the real vLLM: arming from the private copy
    leaves every top-level wrapt module as it was."""
    python = venv_python(release)
    bundle, _ = bundle_for("3.11")
    env = hermetic_env(shim=False)
    env["PYTHONPATH"] = str(bundle)
    code = (
        "import sys, wrapt, wrapt.exceptions\n"
        "theirs = {m: id(mod) for m, mod in sys.modules.items() if m.split('.')[0] == 'wrapt'}\n"
        + "".join(f"import {t}\n" for t in TARGETS)
        + PRELUDE
        + PROBE
        + "after = {m: id(mod) for m, mod in sys.modules.items() if m.split('.')[0] == 'wrapt'}\n"
        "mechanics.emit(mechanics.report(unchanged=after == theirs, theirs=sorted(theirs),\n"
        "    theirs_file=wrapt.__file__, vllm_file=sys.modules['vllm'].__file__, **wrapt_probe()))\n"
    )
    out = json_lines(run_python(["-c", code], python=python, flags=["-O"], env=env,
                                cwd=tmp_path).stdout)[0]
    assert any(out["vllm_file"] == str(d / "vllm" / "__init__.py") for d in site_dirs(python))
    assert out["unchanged"] is True and "wrapt.exceptions" in out["theirs"]
    assert any(out["theirs_file"] == str(d / "wrapt" / "__init__.py") for d in site_dirs(python))
    assert out["import_wrapt_file"] == out["theirs_file"]
    check_private_wrapt(out, bundle)
    assert out["kinds"] == {p: "applied" for p in PATCHES}, out["states"]


def test_bundle_with_real_vllm_in_a_venv_without_wrapt(tmp_path, release, bundle_for):
    """Python 3.11: the real vLLM 0.29.0 under -O, top-level wrapt unimportable
    (hidden from a venv layered over the 0.29.0 venv): every patch applies from
    the private copy, and ``import wrapt`` still fails afterwards."""
    bundle, _ = bundle_for("3.11")
    base = venv_python(release)
    python = layered_venv(tmp_path / "venv", base, site_dirs(base), hide=("wrapt", "wrapt-*"))
    assert visible(python, ["vllm", "wrapt"]) == {"vllm": True, "wrapt": False}
    env = hermetic_env(shim=False)
    env["PYTHONPATH"] = str(bundle)
    code = (
        "".join(f"import {t}\n" for t in TARGETS)
        + "import vllm.v1.kv_cache_interface as kv\n"
        + PRELUDE
        + PROBE
        + "mechanics.emit(mechanics.report(capability=mechanics.mla_capability(kv),\n"
        "    vllm_own_merge_capability=mechanics.mla_capability(kv, original=True), **wrapt_probe()))\n"
    )
    out = json_lines(run_python(["-c", code], python=python, flags=["-O"], env=env, cwd=tmp_path).stdout)[0]
    assert out["kimi_hotfix_file"].startswith(str(bundle))
    assert out["kinds"] == {p: "applied" for p in PATCHES}, out["states"]
    assert out["wrapped"]["MLAAttentionSpec.merge"] == {"patch": "kv_spec_merge", "layers": 1}
    # vLLM's own merge, plain under -O parity: its assert refuses the target + draft pair
    assert out["capability"] is True and out["vllm_own_merge_capability"] == "AssertionError"
    assert out["top_level_modules"] == [] and out["import_wrapt"] == NO_WRAPT
    check_private_wrapt(out, bundle)


def test_repository_keeps_wrapt_a_plain_dependency(release):
    """The checkout and the pip package use the top-level wrapt: no _vendor in
    git (ignored, and left out of the package), wrapt in install_requires."""
    from kimi_hotfix.runtime import _wrapt
    assert not (REPO / "kimi_hotfix" / "_vendor").exists()
    tracked = subprocess.run(["git", "-C", str(REPO), "ls-files", "kimi_hotfix/_vendor"],
                             capture_output=True, text=True, check=True).stdout
    assert tracked == ""
    ignored = subprocess.run(["git", "-C", str(REPO), "check-ignore", "-q",
                              "kimi_hotfix/_vendor/wrapt/__init__.py"])
    assert ignored.returncode == 0
    setup = (REPO / "setup.cfg").read_text()
    assert re.search(r"install_requires =\s+wrapt>=", setup)
    assert re.search(r"exclude =\s+kimi_hotfix\._vendor", setup)
    import wrapt

    assert _wrapt.load() is wrapt
    from kimi_hotfix.tools.status import find_wrapt

    found = find_wrapt()
    assert found["source"] == "top-level" and found["path"] == str(Path(wrapt.__file__).parent)
    assert found["version"] == wrapt.__version__

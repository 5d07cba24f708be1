"""The fleet recipe (issue 21 item 6): deploy/kubernetes/ against the README and
a real bundle.

One bundle is built by scripts/bundle for this Python (wrapt from the registry,
as an operator builds it) and its tarball is extracted with the README's own
``tar`` line: one top directory, ``kimi-hotfix/``, the path the README, the
Dockerfile and the Deployment use. The Deployment is parsed as YAML (PyYAML of
the 0.29.0 venv) and its steps run on that bundle with the paths a mount would
give: the copy, then the verify script (passes with the real pin; refuses a
wrong pin, a changed file, an extra file), then ``status`` with the server's
PYTHONPATH in the real vLLM 0.29.0 venv (exit 0: the shim arms). The vLLM
container merges PYTHONPATH with the image's and mounts the bundle read-only.
Cost: one bundle build (pip install from the local index, compileall) and a
few short children, no vLLM import.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from harness import venv_python
from helpers import REPO, hermetic_env, run_python

pytestmark = pytest.mark.releases("0.29.0")

DEPLOY = REPO / "deploy" / "kubernetes"
MOUNT = "/opt/kimi-hotfix"
TOP = "kimi-hotfix"
VERSIONS_PY = REPO / "kimi_hotfix" / "runtime" / "versions.py"
VERSION = re.search(r'^SHIM = "([^"]+)"', VERSIONS_PY.read_text(), re.M)[1]
THIS = f"{sys.version_info[0]}.{sys.version_info[1]}"


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """(bundle dir, tarball) from scripts/bundle for this Python."""
    out = tmp_path_factory.mktemp("fleet-bundle")
    proc = run_python([str(REPO / "scripts" / "bundle"), "--out", str(out)],
                      env=hermetic_env(shim=False, PIP_ROOT_USER_ACTION="ignore"), timeout=600)
    bundle, archive = (Path(p) for p in proc.stdout.split()[-2:])
    return bundle, archive


@pytest.fixture(scope="module")
def deployment():
    """The Deployment, parsed by a real YAML parser."""
    code = ("import json, sys, yaml\n"
            "print(json.dumps(list(yaml.safe_load_all(open(sys.argv[1])))))\n")
    proc = run_python(["-c", code, str(DEPLOY / "vllm-kimi-hotfix.yaml")],
                      python=venv_python("0.29.0"), env=hermetic_env(shim=False))
    (doc,) = json.loads(proc.stdout)
    return doc


def pod(doc):
    return doc["spec"]["template"]["spec"]


def container(doc, name):
    spec = pod(doc)
    (found,) = [c for c in spec.get("initContainers", []) + spec["containers"] if c["name"] == name]
    return found


def test_the_tarball_extracts_to_the_directory_the_readme_names(built, tmp_path):
    bundle, archive = built
    readme = (REPO / "README.md").read_text()
    (line,) = re.findall(r"`(tar -xzf \S+ -C /opt)`", readme)
    shown = shlex.split(line)[2]
    assert re.fullmatch(rf"kimi-hotfix-{re.escape(VERSION)}-py3\.\d+-manylinux2014_x86_64\.tar\.gz",
                        shown), shown
    assert archive.name == f"kimi-hotfix-{VERSION}-py{THIS}-manylinux2014_x86_64.tar.gz"
    assert f"gives `{MOUNT}`" in readme and f"PYTHONPATH={MOUNT}" in readme
    assert bundle.name == TOP
    # the README's command, with this archive and a directory standing in for /opt
    opt = tmp_path / "opt"
    opt.mkdir()
    argv = shlex.split(line)
    argv[2], argv[-1] = str(archive), str(opt)
    subprocess.run(argv, check=True)
    assert sorted(p.name for p in opt.iterdir()) == [TOP]
    extracted = opt / TOP
    manifest = json.loads((extracted / "MANIFEST.json").read_text())
    assert manifest["kimi_hotfix"] == (extracted / "VERSION").read_text().strip() == VERSION
    assert manifest["usage"].startswith(f"tar -xzf {archive.name} -C /opt; PYTHONPATH={MOUNT} ")
    for rel, digest in manifest["files"].items():
        assert hashlib.sha256((extracted / rel).read_bytes()).hexdigest() == digest, rel
    # a second version extracts over the same path: nothing versioned at the top
    with __import__("tarfile").open(archive) as tar:
        assert {name.split("/")[0] for name in tar.getnames()} == {TOP}


def test_the_recipe_matches_the_readme_and_the_bundle_layout(deployment):
    readme = (REPO / "README.md").read_text()
    assert "[deploy/kubernetes/](deploy/kubernetes/)" in readme
    volumes = {v["name"]: v for v in pod(deployment)["volumes"]}
    assert "emptyDir" in volumes["kimi-hotfix"]
    copy, verify = container(deployment, "kimi-hotfix-copy"), container(deployment, "kimi-hotfix-verify")
    vllm = container(deployment, "vllm")
    assert [c["name"] for c in pod(deployment)["initContainers"]] == ["kimi-hotfix-copy",
                                                                      "kimi-hotfix-verify"]
    # every container mounts the volume at the README's path; only the copy writes it
    for c, read_only in ((copy, False), (verify, True), (vllm, True)):
        (mount,) = [m for m in c["volumeMounts"] if m["name"] == "kimi-hotfix"]
        assert mount["mountPath"] == MOUNT and mount.get("readOnly", False) is read_only, c["name"]
    # the copy takes the image's /kimi-hotfix: the Dockerfile's COPY of the tarball's top directory
    dockerfile = (DEPLOY / "Dockerfile").read_text()
    assert re.search(rf"^COPY {TOP} /{TOP}$", dockerfile, re.M)
    assert copy["command"] == ["cp", "-R", f"/{TOP}/.", f"{MOUNT}/"]
    # the same vLLM image verifies and serves; the pin is a sha256 to fill in
    assert verify["image"] == vllm["image"]
    (pin,) = [e for e in verify["env"] if e["name"] == "KIMI_HOTFIX_MANIFEST_SHA256"]
    assert re.fullmatch(r"[0-9a-f]{64}", pin["value"])
    # PYTHONPATH: set by the shell, merged with the image's, in both places
    merge = f'export PYTHONPATH="{MOUNT}${{PYTHONPATH:+:$PYTHONPATH}}"'
    for c in (verify, vllm):
        assert c["command"] == ["/bin/sh", "-c"] and merge in c["args"][0].splitlines(), c["name"]
        assert not [e for e in c.get("env", []) if e["name"] == "PYTHONPATH"]
    assert re.search(r"^exec vllm serve ", vllm["args"][0], re.M)


def _shell(script, env, cwd):
    return subprocess.run(["/bin/sh", "-c", script], capture_output=True, text=True, env=env,
                          cwd=cwd, timeout=120)


def test_the_recipe_steps_run_on_a_real_bundle(built, deployment, tmp_path):
    bundle, _ = built
    image_root = tmp_path / "image"  # the bundle image's filesystem
    shutil.copytree(bundle, image_root / TOP)
    volume = tmp_path / "volume"  # the emptyDir, mounted where the pod mounts it
    volume.mkdir()
    at = {MOUNT: str(volume), f"/{TOP}/": f"{image_root / TOP}/"}

    def here(text):
        for path, real in at.items():
            text = text.replace(path, real)
        return text

    copy = container(deployment, "kimi-hotfix-copy")
    subprocess.run([here(arg) for arg in copy["command"]], check=True)
    assert sorted(p.name for p in volume.iterdir()) == sorted(p.name for p in bundle.iterdir())
    # the verify step's shell, python3 being the vLLM image's (the 0.29.0 venv)
    verify = container(deployment, "kimi-hotfix-verify")
    tools = tmp_path / "bin"
    tools.mkdir()
    (tools / "python3").write_text(f"#!/bin/sh\nexec {venv_python('0.29.0')} \"$@\"\n")
    (tools / "python3").chmod(0o755)
    script = here(verify["args"][0])
    real_pin = hashlib.sha256((volume / "MANIFEST.json").read_bytes()).hexdigest()

    def run_verify(pin, **extra):
        env = hermetic_env(shim=False, KIMI_HOTFIX_MANIFEST_SHA256=pin, **extra)
        env["PATH"] = f"{tools}{os.pathsep}{env['PATH']}"
        return _shell(script, env, tmp_path)

    ok = run_verify(real_pin, PYTHONPATH="/image/own/entry")
    assert ok.returncode == 0, ok.stdout + ok.stderr
    files = len(json.loads((volume / "MANIFEST.json").read_text())["files"])
    assert f"kimi-hotfix: {files} files match MANIFEST.json sha256 {real_pin}" in ok.stdout
    assert f"shim       loaded by this interpreter from {volume / 'sitecustomize.py'}" in ok.stdout
    assert "active     arms when vLLM is imported (via sitecustomize and vLLM plugin)" in ok.stdout
    wrong = run_verify("0" * 64)
    assert wrong.returncode == 1 and "not the pinned" in wrong.stderr, wrong.stderr
    target = volume / "kimi_hotfix" / "runtime" / "core.py"
    target.write_text(target.read_text() + "\n# changed\n")
    changed = run_verify(real_pin)
    assert changed.returncode == 1
    assert "changed since the pinned build: ['kimi_hotfix/runtime/core.py']" in changed.stderr
    shutil.copy2(bundle / "kimi_hotfix" / "runtime" / "core.py", target)
    (volume / "kimi_hotfix" / "extra.py").write_text("")
    extra = run_verify(real_pin)
    assert extra.returncode == 1 and "extra ['kimi_hotfix/extra.py']" in extra.stderr
    (volume / "kimi_hotfix" / "extra.py").unlink()
    assert run_verify(real_pin).returncode == 0
    # issue 28 finding 5: a link (to a directory of modules outside the bundle, which
    # the bundle first on PYTHONPATH would import: `import json`), a dangling link,
    # a fifo, an extra empty directory: each refused
    elsewhere = tmp_path / "elsewhere" / "json"
    elsewhere.mkdir(parents=True)
    (elsewhere / "__init__.py").write_text("raise SystemExit('outside code ran')\n")
    for name, make in (("json", lambda p: p.symlink_to(elsewhere)),
                       ("gone.py", lambda p: p.symlink_to(tmp_path / "nowhere.py")),
                       ("fifo", os.mkfifo), ("empty", lambda p: p.mkdir())):
        planted = volume / name
        make(planted)
        refused = run_verify(real_pin)
        assert refused.returncode == 1, (name, refused.stdout)
        assert (f"'{name}'" in refused.stderr and ("links or special files" in refused.stderr
                                                  or "extra ['empty']" in refused.stderr)), refused.stderr
        planted.rmdir() if planted.is_dir() and not planted.is_symlink() else planted.unlink()
    assert run_verify(real_pin).returncode == 0
    # the server's PYTHONPATH: the shim first, the image's own entries kept, none invented
    vllm = container(deployment, "vllm")
    (merge,) = [ln for ln in vllm["args"][0].splitlines() if ln.startswith("export PYTHONPATH=")]
    for before, after in ((None, str(volume)), ("/a:/b", f"{volume}:/a:/b")):
        env = {"PATH": os.environ["PATH"], **({"PYTHONPATH": before} if before else {})}
        shown = _shell(here(merge) + '\nprintf %s "$PYTHONPATH"', env, tmp_path).stdout
        assert shown == after

"""scripts/bundle refuses clearly (issue 21 item 6): one line on stderr, no
traceback, an exit status that says whose fault it is (2: the command line asked
for what cannot be; 1: the machine refused).

- a read-only checkout (the default --out is inside it): the copy of the
  checkout is really read-only (a read-only bind mount where this runs as root,
  no write permission otherwise), and the line says to pass --out;
- a missing Python: no interpreter of the --python-version on this machine, an
  --interpreter that does not exist, or one of another version;
- a Python without pip (a fresh venv): the private wrapt cannot be installed.
Every refusal comes before pip runs, so none of these needs the registry. A real
build, its layout and its tarball: tests/real/test_fleet.py and test_bundle.py.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from helpers import REPO, hermetic_env

BUNDLE = REPO / "scripts" / "bundle"
THIS = f"{sys.version_info[0]}.{sys.version_info[1]}"


def run(cmd, **kw):
    proc = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=120,
                          env=hermetic_env(shim=False), **kw)
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc


def refusal(proc) -> str:
    (line,) = [ln for ln in proc.stderr.splitlines() if ln.startswith("bundle: error: ")]
    assert proc.stdout == "", proc.stdout  # no paths printed: nothing was built
    return line


def read_only(cmd, checkout):
    """``cmd`` run with ``checkout`` read-only: a read-only bind mount in a private
    mount namespace as root (root ignores permissions), else no write bits."""
    if os.geteuid() == 0:
        return ["unshare", "-m", "sh", "-c", 'mount --bind -o ro "$0" "$0" && exec "$@"',
                checkout, *cmd]
    for root, dirs, files in os.walk(checkout):
        for name in dirs + files:
            os.chmod(os.path.join(root, name), 0o555 if name in dirs else 0o444)
    os.chmod(checkout, 0o555)
    return cmd


def test_a_read_only_checkout_says_to_pass_out(tmp_path):
    checkout = tmp_path / "checkout"
    (checkout / "scripts").mkdir(parents=True)
    shutil.copy2(BUNDLE, checkout / "scripts" / "bundle")
    shutil.copy2(REPO / "sitecustomize.py", checkout)
    shutil.copytree(REPO / "kimi_hotfix", checkout / "kimi_hotfix",
                    ignore=shutil.ignore_patterns("__pycache__", "_vendor"))
    cmd = [sys.executable, checkout / "scripts" / "bundle", "--interpreter", sys.executable]
    proc = run(read_only(cmd, checkout))
    line = refusal(proc)
    assert proc.returncode == 1, proc.stderr
    assert line.startswith(f"bundle: error: cannot write the bundle to {checkout / 'bundle'}: ")
    assert ("Read-only file system" in line) or ("Permission denied" in line), line
    assert line.endswith("(a read-only checkout? pass --out DIR somewhere writable, e.g. --out "
                         "/tmp/kimi-hotfix-bundle)")
    assert not (checkout / "bundle").exists()


def test_a_missing_python_is_named_with_the_ways_out(tmp_path):
    out = tmp_path / "out"
    proc = run([sys.executable, BUNDLE, "--python-version", "3.99", "--out", out])
    assert proc.returncode == 2
    assert refusal(proc) == (
        "bundle: error: no Python 3.99 on this machine to precompile the bundle with (and to "
        "check its private wrapt): install it (pyenv install 3.99), pass --interpreter PATH, or "
        "pass --source-only to ship sources only (every process then compiles sitecustomize.py "
        "at start-up: about +3 ms, docs/benchmarks.md)")
    missing = tmp_path / "no" / "python3.12"
    proc = run([sys.executable, BUNDLE, "--interpreter", missing, "--out", out])
    assert proc.returncode == 2
    assert refusal(proc) == f"bundle: error: --interpreter {missing}: not found or does not run"
    other = "3.8" if THIS != "3.8" else "3.9"
    proc = run([sys.executable, BUNDLE, "--interpreter", sys.executable, "--python-version", other,
                "--out", out])
    assert proc.returncode == 2
    assert refusal(proc) == (f"bundle: error: --interpreter {sys.executable} is Python {THIS}, "
                             f"not {other} (--python-version)")
    assert not out.exists()  # refused before anything was written


def test_a_python_without_pip_is_refused(tmp_path):
    venv = tmp_path / "nopip"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    proc = run([python, BUNDLE, "--interpreter", python, "--out", tmp_path / "out"])
    assert proc.returncode == 1
    assert refusal(proc) == (
        f"bundle: error: pip is not installed for {python}, and the bundle's private wrapt comes "
        "from the registry through pip: run scripts/bundle with a Python that has pip (python3 -m "
        "ensurepip, or the tools venv: scripts/build-venv tools)")


@pytest.mark.parametrize("args", [["--python-version", "3"], ["--bogus"]])
def test_usage_errors_exit_2(args):
    proc = run([sys.executable, BUNDLE, *args])
    assert proc.returncode == 2 and "usage:" in proc.stderr


@pytest.mark.parametrize("kind", ["another-users", "writable-by-others", "a-link"])
def test_an_out_directory_another_user_could_swap_is_refused(tmp_path, kind):
    """Issue 28 finding 4: in a shared /tmp another user may have made --out
    first; the tarball written there could be swapped before it is pinned."""
    out = tmp_path / "out"
    if kind == "a-link":
        (tmp_path / "elsewhere").mkdir()
        out.symlink_to(tmp_path / "elsewhere")
    else:
        out.mkdir()
        if kind == "another-users":
            os.chown(out, 65534, 65534)  # nobody's (the tests run as root)
        else:
            out.chmod(0o777)
    proc = run([sys.executable, BUNDLE, "--interpreter", sys.executable, "--out", out])
    line = refusal(proc)
    assert proc.returncode == 1, proc.stderr
    why = {"another-users": "is owned by uid 65534", "writable-by-others": "is writable by others",
           "a-link": "is a link"}[kind]
    assert line.startswith(f"bundle: error: --out {out} {why}"), line
    assert os.listdir(out) == []  # nothing written there


def test_the_private_wrapt_comes_from_a_lock_with_every_wheels_hash():
    """Issue 28 finding 4: the bundle's wrapt is locks/bundle-wrapt.txt, installed
    with --require-hashes, whose requirement is the one the shim expects of it."""
    import importlib.util
    import re

    from kimi_hotfix.runtime import _wrapt
    sys.path.insert(0, str(REPO / "scripts"))
    try:
        import venvlock
    finally:
        sys.path.remove(str(REPO / "scripts"))
    spec = importlib.util.spec_from_loader("bundle_script", loader=None)
    bundle = importlib.util.module_from_spec(spec)
    bundle.__file__ = str(BUNDLE)
    exec(compile(BUNDLE.read_text(), str(BUNDLE), "exec"), bundle.__dict__)
    assert bundle.WRAPT == venvlock.BUNDLE_WRAPT == _wrapt.VENDORED_REQUIREMENT
    assert "--require-hashes" in BUNDLE.read_text() and bundle.WRAPT_LOCK.name == "bundle-wrapt.txt"
    body = venvlock.split_lock(bundle.WRAPT_LOCK.read_text())[1]
    (pin,) = re.findall(r"^wrapt==(\S+)", body, re.M)
    assert pin.startswith("1.")
    assert len(re.findall(r"--hash=sha256:[0-9a-f]{64}", body)) > 20  # every platform's wheel
    assert venvlock.stale("bundle-wrapt") is None

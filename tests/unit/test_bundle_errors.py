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

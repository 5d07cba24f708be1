"""The fault matrix (issue 4 item 6): odd interpreters and containers, each a test.

Real interpreters in subprocesses; real vLLM 0.29.0 wherever vLLM's behaviour is
part of the claim. Stand-ins (tests/standins) only where the real thing cannot be
arranged: a vLLM whose target symbols are missing or renamed.
Cases covered in other files: multiprocessing spawn/fork/forkserver, the chained
sitecustomize and a second arming (test_bootstrap.py), the plugin and
sitecustomize both active (test_plugin.py).
"""

from __future__ import annotations

import json
import os
import sys

import pytest

from conftest import REPO, hermetic_env, json_lines, run_python
from standins.venvs import layered_venv, vllm_site_packages

pytestmark = pytest.mark.vllm("0.29.0")

from standins.common import PATCHES, PRELUDE, STANDINS, SUMMARY, TARGETS  # noqa: E402
TOGGLES = ("KIMI_HOTFIX", "KIMI_HOTFIX_DISABLE", "KIMI_HOTFIX_FORCE", "KIMI_HOTFIX_STRICT", "KIMI_HOTFIX_LOG_LEVEL")

# Real vLLM: the merge the DSpark bug is about, with the shim's wrapper and with
# vLLM's own merge (same process, same flags): the fix next to the bug.
KV_REPORT = (
    "import vllm.v1.kv_cache_interface as kv\n"
    + PRELUDE
    + "mechanics.emit(mechanics.report(capability=mechanics.mla_capability(kv),\n"
    "    vllm_own_merge_capability=mechanics.mla_capability(kv, original=True)))\n"
)


def summary_lines(stderr):
    return [line for line in stderr.splitlines() if SUMMARY in line and " INFO " in line]


def warning_lines(stderr):
    return [line for line in stderr.splitlines() if " WARNING " in line and "kimi-hotfix[" in line]


def one_layer_each(report):
    wrapped = report["wrapped"]
    return bool(wrapped) and all(v["layers"] == 1 for v in wrapped.values()) and {
        k: v["patch"] for k, v in wrapped.items()
    } == report["recorded"]


# -- optimize levels -----------------------------------------------------------


@pytest.mark.parametrize(
    "flags, extra, level",
    [(["-O"], {}, 1), (["-OO"], {}, 2), ([], {"PYTHONOPTIMIZE": "1"}, 1)],
    ids=["-O", "-OO", "PYTHONOPTIMIZE=1"],
)
def test_optimized_python_is_patched(flags, extra, level):
    proc = run_python(["-c", KV_REPORT], flags=flags, env=hermetic_env(**extra))
    out = json_lines(proc.stdout)[0]
    assert out["optimize"] == level
    assert out["states"]["kv_spec_merge"] == "applied"
    assert out["wrapped"]["MLAAttentionSpec.merge"] == {"patch": "kv_spec_merge", "layers": 1}
    assert one_layer_each(out)
    assert out["capability"] is True  # with the shim
    assert out["vllm_own_merge_capability"] is False  # the bug, same process
    lines = summary_lines(proc.stderr)
    assert len(lines) == 1 and f"python -{'O' * level})" in lines[0], proc.stderr
    assert warning_lines(proc.stderr) == []


# -- interpreters where the shim cannot load -----------------------------------

NOT_LOADED = (
    "import sys, json\n"
    "print('KIMI_JSON:' + json.dumps({\n"
    "  'bootstrap': 'kimi_hotfix_sitecustomize' in sys.modules,\n"
    "  'kimi_hotfix': sorted(m for m in sys.modules if m.startswith('kimi_hotfix')),\n"
    "  'trigger': any(type(f).__name__ == 'VllmImportTrigger' for f in sys.meta_path),\n"
    "  'repo_on_path': %r in sys.path}))\n" % str(REPO)
)
STATUS_VIA_API = (
    f"import sys; sys.path.insert(0, {str(REPO)!r})\n"
    "from kimi_hotfix.cli import main\n"
    "sys.exit(main(['status', '--json']))\n"
)


@pytest.mark.parametrize("flag", ["-S", "-I", "-E"])
def test_shim_cannot_load_and_status_says_why(flag):
    env = hermetic_env()  # PYTHONPATH names the shim; the flag defeats it
    out = json_lines(run_python(["-c", NOT_LOADED], flags=[flag], env=env).stdout)[0]
    assert out["bootstrap"] is False and out["kimi_hotfix"] == [] and out["trigger"] is False
    assert out["repo_on_path"] is (flag == "-S")  # -S keeps PYTHONPATH, skips site
    # status, in an interpreter started the same way
    if flag == "-S":
        proc = run_python(["-m", "kimi_hotfix", "status", "--json"], flags=[flag], env=env)
    elif flag == "-E":  # -m still puts the working directory first on sys.path
        proc = run_python(["-m", "kimi_hotfix", "status", "--json"], flags=[flag], env=env, cwd=REPO)
    else:  # -I ignores PYTHONPATH and the working directory
        proc = run_python(["-c", STATUS_VIA_API], flags=[flag], env=env)
    status = json.loads(proc.stdout)
    shim, python = status["shim"], status["python"]
    assert shim["sitecustomize_loaded"] is False
    if flag == "-S":
        assert python["no_site"] is True
        assert "-S" in shim["why"] and "no sitecustomize" in shim["why"]
    else:
        assert python["ignore_environment"] is True
        assert python["isolated"] is (flag == "-I")
        assert "PYTHONPATH is ignored" in shim["why"]
    assert status["active"].startswith("INACTIVE"), status["active"]
    assert any(note.startswith(flag + ":") for note in python["notes"]), python["notes"]
    # the human-readable status says the same
    text_args = {"-S": ["-m", "kimi_hotfix", "status"], "-E": ["-m", "kimi_hotfix", "status"],
                 "-I": ["-c", STATUS_VIA_API.replace(", '--json'", "")]}[flag]
    text = run_python(text_args, flags=[flag], env=env, cwd=REPO if flag == "-E" else None).stdout
    assert shim["why"] in text


# -- wrapt missing ---------------------------------------------------------------


@pytest.fixture(scope="module")
def no_wrapt_python(tmp_path_factory):
    """A venv that sees the 0.29.0 vLLM venv's packages, except wrapt."""
    dest = tmp_path_factory.mktemp("no-wrapt") / "venv"
    python = layered_venv(dest, sys.executable, [vllm_site_packages()], hide=("wrapt", "wrapt-*"))
    probe = run_python(["-c", "import vllm, torch; import wrapt"], python=python,
                       env=hermetic_env(shim=False), check=False)
    assert "ModuleNotFoundError: No module named 'wrapt'" in probe.stderr, probe.stderr
    return python


def test_wrapt_missing_one_warning_shim_inactive_vllm_works(no_wrapt_python):
    code = KV_REPORT.replace(
        "mechanics.emit(",
        "spec = kv.MLAAttentionSpec(block_size=64, num_kv_heads=1, head_size=576,\n"
        "                           dtype=__import__('torch').bfloat16)\n"
        "mechanics.emit(",
    ).replace("mechanics.report(", "mechanics.report(same_specs=repr(kv.MLAAttentionSpec.merge([spec, spec])), ")
    proc = run_python(["-c", code], python=no_wrapt_python, flags=["-O"])
    out = json_lines(proc.stdout)[0]
    assert out["wrapped"] == {} and out["recorded"] == {}
    assert set(out["states"].values()) == {"failed: wrapt is not installed"}
    assert out["same_specs"].startswith("MLAAttentionSpec(")  # vLLM works
    assert out["capability"] == out["vllm_own_merge_capability"]  # unpatched
    warnings = warning_lines(proc.stderr)
    assert len(warnings) == 1 and "wrapt is not installed" in warnings[0], proc.stderr
    assert len(summary_lines(proc.stderr)) == 1
    # status, in the same environment, says so
    status = json.loads(run_python(["-m", "kimi_hotfix", "status", "--json"], python=no_wrapt_python).stdout)
    assert status["wrapt"]["installed"] is False
    assert status["active"].startswith("INACTIVE: wrapt is not installed"), status["active"]


def test_wrapt_missing_strict_raises(no_wrapt_python):
    code = "import vllm\nprint('not reached')\n"
    proc = run_python(["-c", code], python=no_wrapt_python, check=False,
                      env=hermetic_env(KIMI_HOTFIX_STRICT="1"))
    assert proc.returncode == 1 and "not reached" not in proc.stdout
    assert "kimi_hotfix.core.KimiHotfixError: wrapt is not installed" in proc.stderr


# -- vLLM missing ------------------------------------------------------------------

ORDINARY = [
    ["-c", "print('hello')"],
    ["-c", "import importlib.util; print(importlib.util.find_spec('vllm'))"],
    ["-c", "try:\n import vllm\nexcept ImportError:\n print('no vllm here')"],
    ["-c", "import sys, json; print(sorted(m for m in sys.modules if m.split('.')[0] in "
           "('kimi_hotfix', 'wrapt', 'logging')))"],
    ["-m", "json.tool", "--help"],
]


@pytest.mark.parametrize("interpreter", ["plain-venv", "python3.11-with-wrapt"])
def test_vllm_missing_is_a_silent_no_op(tmp_path, interpreter):
    base = "/root/.pyenv/versions/3.11.7/bin/python"
    python = base if interpreter != "plain-venv" else layered_venv(tmp_path / "venv", base)
    outs = []
    for args in ORDINARY:
        proc = run_python(args, python=python, env=hermetic_env())
        assert proc.stderr == "", (args, proc.stderr)
        outs.append(proc.stdout)
    assert outs[:4] == ["hello\n", "None\n", "no vllm here\n", "[]\n"]
    bare = run_python(ORDINARY[4], python=python, env=hermetic_env(shim=False))
    assert outs[4] == bare.stdout
    status = json.loads(run_python(["-m", "kimi_hotfix", "status", "--json"], python=python).stdout)
    assert status["vllm"]["installed"] is False and status["shim"]["sitecustomize_loaded"] is True


# -- a target symbol missing or renamed (stand-in vLLM) ------------------------------

RENAMED = STANDINS / "vllm_renamed"


def test_target_symbol_missing_warns_skips_host_runs():
    env = hermetic_env()
    env["PYTHONPATH"] = f"{REPO}:{RENAMED}"
    code = (
        "import importlib\n"
        "values = [importlib.import_module(t).HOST_VALUE for t in " + repr(TARGETS) + "]\n"
        + PRELUDE
        + "mechanics.emit(mechanics.report(values=values))\n"
    )
    proc = run_python(["-c", code], env=env)
    out = json_lines(proc.stdout)[0]
    assert out["values"] == ["kv_cache_interface works", "cudagraph_utils works", "kda_metadata works"]
    assert out["wrapped"] == {}
    assert out["states"] == {
        "kv_spec_merge": "failed: vllm.v1.kv_cache_interface.KVCacheSpec not found",
        "capture_workspace": "failed: CudaGraphManager._init_candidates not found",
        "kda_overlong_rows": "failed: KimiK3KDAMetadataBuilder.build not found",
    }
    warnings = warning_lines(proc.stderr)
    assert len(warnings) == 3 and all("could not apply" in w for w in warnings), proc.stderr
    assert len(summary_lines(proc.stderr)) == 1


def test_target_symbol_missing_strict_raises_at_import():
    env = hermetic_env(KIMI_HOTFIX_STRICT="1")
    env["PYTHONPATH"] = f"{REPO}:{RENAMED}"
    proc = run_python(["-c", "import vllm.v1.kv_cache_interface\nprint('not reached')"],
                      env=env, check=False)
    assert proc.returncode == 1 and "not reached" not in proc.stdout
    assert ("kimi_hotfix.core.KimiHotfixError: kv_spec_merge: "
            "vllm.v1.kv_cache_interface.KVCacheSpec not found") in proc.stderr


# -- an exception inside the patch's own code (real vLLM) -----------------------------

BROKEN_HELPER = (
    "import vllm.v1.kv_cache_interface as kv, torch\n"
    + PRELUDE
    + "from kimi_hotfix.patches import kv_spec_merge as patch\n"
    "def broken(*args, **kwargs):\n"
    "    raise RuntimeError('injected failure in the patch code')\n"
    "patch._with_group_capability = broken\n"
    "cls = kv.MLAAttentionSpec\n"
    "raw = vars(cls)['merge'].__wrapped__.__get__(None, cls)  # vLLM's own merge\n"
    "shape = dict(block_size=64, num_kv_heads=1, head_size=576, dtype=torch.bfloat16)\n"
    "target, draft = cls(**shape), cls(**shape, non_causal_multi_token_decode=True)\n"
    "def outcome(merge, specs):\n"
    "    try:\n"
    "        return repr(merge(specs))\n"
    "    except Exception as exc:\n"
    "        return type(exc).__name__\n"
    "calls = []\n"
    "for i in range(10):\n"
    "    specs = [target, target] if i % 2 else [target, draft]\n"
    "    calls.append([outcome(cls.merge, specs), outcome(raw, specs)])\n"
    "mechanics.emit(mechanics.report(calls=calls))\n"
)


def test_exception_in_patch_code_logged_once_original_behaviour():
    proc = run_python(["-c", BROKEN_HELPER])
    out = json_lines(proc.stdout)[0]
    assert out["states"]["kv_spec_merge"] == "applied"
    for patched, vllm_own in out["calls"]:
        assert patched == vllm_own
    failures = [w for w in warning_lines(proc.stderr) if "wrapper failed" in w]
    assert len(failures) == 1, proc.stderr
    assert "injected failure in the patch code" in failures[0]
    assert proc.stderr.count("RuntimeError: injected failure") == 2  # message + traceback, once


def test_exception_in_patch_code_strict_raises():
    proc = run_python(["-c", BROKEN_HELPER], env=hermetic_env(KIMI_HOTFIX_STRICT="1"))
    out = json_lines(proc.stdout)[0]
    assert [patched for patched, _ in out["calls"]] == ["KimiHotfixError"] * 10


# -- concurrency ----------------------------------------------------------------------

# Three threads import the three targets at once, so the first import of vllm
# (and the arming) races with the targets' imports. The stdlib modules any
# threaded program has loaded are imported first: racing first imports of those
# can hand a thread a half-initialized stdlib module (CPython's deadlock
# avoidance), which is not what this case is about. The shim may settle a target
# that another thread was importing only once that import finishes, so the
# report waits (bounded) for no patch to be pending.
THREADS = (
    "import importlib, threading, time\n"
    "import typing, dataclasses, logging, inspect, ast, re, json\n"
    "targets = " + repr(TARGETS) + "\n"
    "barrier = threading.Barrier(len(targets))\n"
    "errors = []\n"
    "def load(name):\n"
    "    barrier.wait()\n"
    "    try:\n"
    "        importlib.import_module(name)\n"
    "    except BaseException as exc:\n"
    "        errors.append(repr(exc))\n"
    "threads = [threading.Thread(target=load, args=(t,)) for t in targets]\n"
    "[t.start() for t in threads]\n"
    "[t.join() for t in threads]\n"
    + PRELUDE
    + "from kimi_hotfix import core\n"
    "deadline = time.monotonic() + 120\n"
    "while 'pending' in core.states().values() and time.monotonic() < deadline:\n"
    "    time.sleep(0.05)\n"
    + "mechanics.emit(mechanics.report(errors=errors))\n"
)


def test_threads_importing_vllm_at_once_wrap_once():
    proc = run_python(["-c", THREADS], flags=["-O"])
    out = json_lines(proc.stdout)[0]
    assert out["errors"] == []
    assert out["armed_by"] == ["sitecustomize"]
    assert {p: s for p, s in out["states"].items()} == {p: "applied" for p in PATCHES}
    assert one_layer_each(out)
    assert {v["patch"] for v in out["wrapped"].values()} == set(PATCHES)
    assert len(summary_lines(proc.stderr)) == 1


# -- the switches ----------------------------------------------------------------------


@pytest.mark.parametrize("toggle", [{"KIMI_HOTFIX": "0"}, {"KIMI_HOTFIX_DISABLE": "*"}],
                         ids=["KIMI_HOTFIX=0", "KIMI_HOTFIX_DISABLE=*"])
def test_switched_off_leaves_vllm_unwrapped(toggle):
    proc = run_python(["-c", KV_REPORT], flags=["-O"], env=hermetic_env(**toggle))
    out = json_lines(proc.stdout)[0]
    assert out["wrapped"] == {} and out["recorded"] == {}
    assert all(s.startswith("disabled") for s in out["states"].values())
    # vLLM's own -O behaviour: the DSpark capability bug is back (the reproduction)
    assert out["capability"] is False and out["vllm_own_merge_capability"] is False
    lines = summary_lines(proc.stderr)
    assert len(lines) == 1 and "disabled" in lines[0]
    assert warning_lines(proc.stderr) == []


# -- garbage in every environment variable ---------------------------------------------

LONG = "x" * 100_000
GARBAGE = {
    "unicode": "jä✓ ☃",
    "long": LONG,
    "punctuation": ",;=*?",
    "many-names": ",".join(f"name{i}" for i in range(1000)),
    "invalid-utf8": b"\xff\xfe",
}
VALID_LISTED = {
    "KIMI_HOTFIX": "valid values: 1/on/true/yes or 0/off/false/no",
    "KIMI_HOTFIX_DISABLE": "valid names: kv_spec_merge, capture_workspace, kda_overlong_rows, or *",
    "KIMI_HOTFIX_FORCE": "valid names: kv_spec_merge, capture_workspace, kda_overlong_rows, or *",
    "KIMI_HOTFIX_STRICT": "valid values: 1/on/true/yes or 0/off/false/no",
    "KIMI_HOTFIX_LOG_LEVEL": "valid values: DEBUG, INFO, WARNING, ERROR, CRITICAL",
}
ARM_ONLY = (
    "import kimi_hotfix\n"
    "from kimi_hotfix import core\n"
    "kimi_hotfix.arm()\n"
    "cfg = core.current_config()\n"
    "import json\n"
    "print('KIMI_JSON:' + json.dumps({'enabled': cfg.enabled, 'disabled': sorted(cfg.disabled),\n"
    "    'forced': sorted(cfg.forced), 'strict': cfg.strict, 'log_level': cfg.log_level,\n"
    "    'n_warnings': len(cfg.warnings), 'states': core.states()}))\n"
)
DEFAULTS = {"enabled": True, "disabled": [], "forced": [], "strict": False, "log_level": "INFO"}


def _env_with(var, value):
    env = {k.encode(): v.encode() for k, v in hermetic_env().items()}
    env[var.encode()] = value if isinstance(value, bytes) else value.encode("utf-8")
    return env


@pytest.mark.parametrize("kind", [*GARBAGE, "empty", "blank"])
@pytest.mark.parametrize("var", TOGGLES)
def test_garbage_in_each_variable(var, kind):
    value = GARBAGE.get(kind, "" if kind == "empty" else "   ")
    proc = run_python(["-c", ARM_ONLY], env=_env_with(var, value))
    out = json_lines(proc.stdout)[0]
    assert {k: out[k] for k in DEFAULTS} == DEFAULTS  # defaults kept
    assert set(out["states"].values()) == {"pending"}  # armed, nothing disabled
    warnings = warning_lines(proc.stderr)
    if kind in ("empty", "blank"):  # unset in effect: no warning
        assert warnings == [] and out["n_warnings"] == 0, proc.stderr
    else:
        assert len(warnings) == 1 and out["n_warnings"] == 1, proc.stderr
        assert var in warnings[0] and VALID_LISTED[var] in warnings[0]
        # a bad value is quoted, never echoed whole: the warning stays one short line
        assert len(warnings[0]) < 400, warnings[0]
        if kind == "long":
            assert "... (100000 characters)" in warnings[0]


def test_garbage_everywhere_with_real_vllm():
    env = hermetic_env(
        KIMI_HOTFIX="jä✓",
        KIMI_HOTFIX_DISABLE="kv_spec_mergé",
        KIMI_HOTFIX_FORCE=LONG,
        KIMI_HOTFIX_STRICT="sometimes",
        KIMI_HOTFIX_LOG_LEVEL="loud",
    )
    proc = run_python(["-c", KV_REPORT], flags=["-O"], env=env)
    out = json_lines(proc.stdout)[0]
    assert out["states"]["kv_spec_merge"] == "applied"  # defaults: on, nothing disabled
    assert out["capability"] is True and out["vllm_own_merge_capability"] is False
    warnings = warning_lines(proc.stderr)
    assert len(warnings) == len(TOGGLES), proc.stderr[:3000]
    for var, warning in zip(TOGGLES, warnings):
        assert VALID_LISTED[var] in warning
    assert len(summary_lines(proc.stderr)) == 1  # INFO level kept

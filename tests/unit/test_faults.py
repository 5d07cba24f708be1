"""The fault matrix, without vLLM: odd interpreters and containers, each a test.

Stand-ins (tests/standins) only, for the shim's own mechanics; every case that
depends on what vLLM does runs the real wheels in tests/real/test_processes.py.

- -S, -I, -E: the shim cannot load, and status says so and why;
- vLLM missing: the shim is a silent no-op in ordinary Python commands;
- wrapt missing: one warning, the shim inactive, the host runs; strict raises;
- a target symbol missing or renamed: warn, skip, the host runs; strict raises;
- garbage in every environment variable: one warning listing the valid values,
  the default kept, never a crash.
"""

from __future__ import annotations

import importlib
import json
import os
import re
import shutil
import subprocess
import sys

import pytest

from kimi_hotfix.runtime.config import printable

from helpers import (
    PATCHES,
    REPO,
    STANDINS,
    TARGETS,
    TOGGLES,
    VLLM_COMPLETE,
    VLLM_RENAMED,
    final_summary,
    hermetic_env,
    json_lines,
    run_python,
    summaries,
    warning_lines,
)

PRELUDE = f"import sys; sys.path.append({str(STANDINS)!r}); import mechanics\n"


NOT_LOADED = (
    "import sys, json\n"
    "print('KIMI_JSON:' + json.dumps({\n"
    "  'bootstrap': 'kimi_hotfix_sitecustomize' in sys.modules,\n"
    "  'kimi_hotfix': sorted(m for m in sys.modules if m.startswith('kimi_hotfix')),\n"
    "  'trigger': any(type(f).__name__ == 'VllmImportTrigger' for f in sys.meta_path),\n"
    f"  'repo_on_path': {str(REPO)!r} in sys.path}}))\n"
)
STATUS_VIA_API = (
    f"import sys; sys.path.insert(0, {str(REPO)!r})\n"
    "from kimi_hotfix.tools.cli import main\n"
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
        proc = run_python(["-m", "kimi_hotfix", "status", "--json"], flags=[flag], env=env,
                          check=False)
    elif flag == "-E":  # -m still puts the working directory first on sys.path
        proc = run_python(["-m", "kimi_hotfix", "status", "--json"], flags=[flag], env=env, cwd=REPO,
                          check=False)
    else:  # -I ignores PYTHONPATH and the working directory
        proc = run_python(["-c", STATUS_VIA_API], flags=[flag], env=env, check=False)
    status = json.loads(proc.stdout)
    assert proc.returncode == 3 and status["active"] is False  # the gate: it would not arm
    shim, python = status["shim"], status["python"]
    assert shim["sitecustomize_loaded"] is False
    if flag == "-S":
        assert python["no_site"] is True
        assert "-S" in shim["why"] and "no sitecustomize" in shim["why"]
    else:
        assert python["ignore_environment"] is True
        assert python["isolated"] is (flag == "-I")
        assert "PYTHONPATH is ignored" in shim["why"]
    assert status["active_reason"].startswith("INACTIVE"), status["active_reason"]
    # -S keeps PYTHONPATH: the dist-info's entry point is seen (wrapt and vLLM, in
    # site-packages, are not); -I and -E ignore it, dist-info and all
    assert status["plugin"]["installed"] is (flag == "-S"), status["plugin"]
    assert any(note.startswith(flag + ":") for note in python["notes"]), python["notes"]
    # the human-readable status says the same
    text_args = {"-S": ["-m", "kimi_hotfix", "status"], "-E": ["-m", "kimi_hotfix", "status"],
                 "-I": ["-c", STATUS_VIA_API.replace(", '--json'", "")]}[flag]
    text = run_python(text_args, flags=[flag], env=env, cwd=REPO if flag == "-E" else None,
                      check=False).stdout
    assert shim["why"] in text


# -- wrapt missing -----------------------------------------------------------------


@pytest.fixture(scope="module")
def no_wrapt_python(tmp_path_factory):
    """A venv of this Python with nothing installed: no wrapt."""
    venv = tmp_path_factory.mktemp("no-wrapt") / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    return str(venv / "bin" / "python")


def test_wrapt_missing_one_warning_shim_inactive_host_runs(no_wrapt_python):
    env = hermetic_env()
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), str(VLLM_COMPLETE)])
    code = "".join(f"import {t}\n" for t in TARGETS) + PRELUDE + "mechanics.emit(mechanics.report())\n"
    proc = run_python(["-c", code], python=no_wrapt_python, flags=["-O"], env=env)
    out = json_lines(proc.stdout)[0]
    assert out["wrapped"] == {} and out["recorded"] == {}
    assert set(out["states"].values()) == {"failed: wrapt is not installed"}
    warnings = warning_lines(proc.stderr)
    assert len(warnings) == 1 and "wrapt is not installed" in warnings[0], proc.stderr
    assert final_summary(proc.stderr).endswith(
        " | ".join(f"{p}: failed: wrapt is not installed" for p in PATCHES))
    proc = run_python(["-m", "kimi_hotfix", "status", "--json"], python=no_wrapt_python, env=env,
                      check=False)
    status = json.loads(proc.stdout)
    assert status["wrapt"]["installed"] is False
    assert proc.returncode == 3 and status["active"] is False
    assert status["active_reason"].startswith("INACTIVE: wrapt is not installed"), status

    strict = dict(env, KIMI_HOTFIX_STRICT="1")
    proc = run_python(["-c", "import vllm\nprint('not reached')\n"], python=no_wrapt_python,
                      env=strict, check=False)
    assert proc.returncode == 1 and "not reached" not in proc.stdout
    assert "kimi_hotfix.runtime.base.KimiHotfixError: wrapt is not installed" in proc.stderr


# -- vLLM missing ------------------------------------------------------------------

ORDINARY = [
    ["-c", "print('hello')"],
    ["-c", "import importlib.util; print(importlib.util.find_spec('vllm'))"],
    ["-c", "try:\n import vllm\nexcept ImportError:\n print('no vllm here')"],
    ["-c", "import sys, json; print(sorted(m for m in sys.modules if m.split('.')[0] in "
           "('kimi_hotfix', 'wrapt', 'logging')))"],
    ["-m", "json.tool", "--help"],
]


@pytest.mark.parametrize("interpreter", ["plain-venv", "this-python-with-wrapt"])
def test_vllm_missing_is_a_silent_no_op(tmp_path, interpreter):
    python = sys.executable
    if interpreter == "plain-venv":
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(tmp_path / "venv")],
                       check=True)
        python = str(tmp_path / "venv" / "bin" / "python")
    outs = []
    for args in ORDINARY:
        proc = run_python(args, python=python, env=hermetic_env())
        assert proc.stderr == "", (args, proc.stderr)
        outs.append(proc.stdout)
    assert outs[:4] == ["hello\n", "None\n", "no vllm here\n", "[]\n"]
    bare = run_python(ORDINARY[4], python=python, env=hermetic_env(shim=False))
    assert outs[4] == bare.stdout
    proc = run_python(["-m", "kimi_hotfix", "status", "--json"], python=python, check=False)
    status = json.loads(proc.stdout)
    assert status["vllm"]["installed"] is False and status["shim"]["sitecustomize_loaded"] is True
    assert proc.returncode == 3 and status["active"] is False  # loaded, but nothing to arm on


# -- a target symbol missing or renamed (stand-in vLLM) ------------------------------

RENAMED = VLLM_RENAMED


def test_target_symbol_missing_warns_skips_host_runs():
    env = hermetic_env()
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), str(RENAMED)])
    code = (
        "import importlib\n"
        "values = [importlib.import_module(t).HOST_VALUE for t in " + repr(TARGETS) + "]\n"
        + PRELUDE
        + "mechanics.emit(mechanics.report(values=values))\n"
    )
    proc = run_python(["-c", code], env=env)
    out = json_lines(proc.stdout)[0]
    assert out["values"] == [f"{t.split('.')[-1]} works" for t in TARGETS]
    assert out["wrapped"] == {}
    assert out["states"] == {  # what each patch's standins.py says it reads there
        name: importlib.import_module(f"kimi_hotfix.patches.{name}.standins").RENAMED_STATE
        for name in PATCHES}
    assert all(state.startswith("failed: ") for state in out["states"].values())
    warnings = warning_lines(proc.stderr)
    assert len(warnings) == len(PATCHES) and all("could not apply" in w for w in warnings), proc.stderr
    assert final_summary(proc.stderr).endswith(
        " | ".join(f"{name}: {text}" for name, text in out["states"].items()))


def test_target_symbol_missing_strict_raises_at_import():
    env = hermetic_env(KIMI_HOTFIX_STRICT="1")
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), str(RENAMED)])
    first, target = PATCHES[0], TARGETS[0]
    proc = run_python(["-c", f"import {target}\nprint('not reached')"], env=env, check=False)
    assert proc.returncode == 1 and "not reached" not in proc.stdout
    state = importlib.import_module(f"kimi_hotfix.patches.{first}.standins").RENAMED_STATE
    assert (f"kimi_hotfix.runtime.base.KimiHotfixError: {first}: "
            f"{state.removeprefix('failed: ')}") in proc.stderr


# -- garbage in every environment variable ---------------------------------------------

LONG = "x" * 100_000
FORGED = "2026-01-01 00:00:00,000 kimi-hotfix[1] INFO"
GARBAGE = {
    "unicode": "jä✓ ☃",
    "long": LONG,
    "punctuation": ",;=*?",
    "many-names": ",".join(f"name{i}" for i in range(1000)),
    "invalid-utf8": b"\xff\xfe",
    # a value that would forge a log line of its own, and the summary line's separator
    "forged-line": f"0\n{FORGED} kimi_hotfix 0.1.0 (vllm 0.29.0, python -O): kv_spec_merge: applied",
    "separator": "0 | kv_spec_merge: applied",
}
VALID_LISTED = {
    "KIMI_HOTFIX": "valid values: 1/on/true/yes or 0/off/false/no",
    "KIMI_HOTFIX_DISABLE": f"valid names: o_parity, {', '.join(PATCHES)}, or *",
    "KIMI_HOTFIX_FORCE": f"valid names: {', '.join(PATCHES)}, or *",
    "KIMI_HOTFIX_STRICT": "valid values: 1/on/true/yes or 0/off/false/no",
    "KIMI_HOTFIX_LOG_LEVEL": "valid values: DEBUG, INFO, WARNING, ERROR, CRITICAL",
    "KIMI_HOTFIX_POD_FILES": "valid values: 1/on/true/yes or 0/off/false/no",
}
ARM_ONLY = (
    "import kimi_hotfix\n"
    "from kimi_hotfix.runtime import core\n"
    "kimi_hotfix.arm()\n"
    "cfg = core.current_config()\n"
    "import json\n"
    "print('KIMI_JSON:' + json.dumps({'enabled': cfg.enabled, 'disabled': sorted(cfg.disabled),\n"
    "    'forced': sorted(cfg.forced), 'strict': cfg.strict, 'log_level': cfg.log_level,\n"
    "    'pod_files': cfg.pod_files,\n"
    "    'n_warnings': len(cfg.warnings), 'states': {n: str(s) for n, s in core.states().items()}}))\n"
)
DEFAULTS = {"enabled": True, "disabled": [], "forced": [], "strict": False, "log_level": "INFO",
            "pod_files": True}


def _env_with(var, value):
    env = {k.encode(): v.encode() for k, v in hermetic_env().items()}
    env[var.encode()] = value if isinstance(value, bytes) else value.encode("utf-8")
    return env


# every variable at once, as tests/real's garbage child had it (issue 30: that claim
# is the shim's own mechanics; the real vLLM with the shim off is the "off" children)
ALL_AT_ONCE = {"KIMI_HOTFIX": "jä✓", "KIMI_HOTFIX_DISABLE": "kv_spec_mergé",
               "KIMI_HOTFIX_FORCE": "x" * 100_000, "KIMI_HOTFIX_STRICT": "sometimes",
               "KIMI_HOTFIX_LOG_LEVEL": "loud", "KIMI_HOTFIX_POD_FILES": "perhaps"}


@pytest.mark.parametrize("flags", [[], ["-O"]], ids=["plain", "O"])
def test_garbage_in_every_variable_at_once(flags):
    """One warning per variable, in their order; the unknown KIMI_HOTFIX fails
    closed (every patch disabled, saying why); the log level keeps INFO, so the
    summary line is logged; strict stays off (arming did not raise)."""
    env = hermetic_env(**ALL_AT_ONCE)
    proc = run_python(["-c", ARM_ONLY], flags=flags, env=env)
    out = json_lines(proc.stdout)[0]
    assert out["enabled"] is False and out["strict"] is False and out["log_level"] == "INFO"
    warnings = [line for line in proc.stderr.splitlines() if " WARNING " in line]
    assert out["n_warnings"] == len(warnings) == len(TOGGLES), proc.stderr
    for var, warning in zip(TOGGLES, warnings):
        assert f"{var}=" in warning or f"{var}:" in warning, (var, warning)
    off = "disabled (KIMI_HOTFIX=jä✓)"
    assert out["states"] == dict.fromkeys(PATCHES, off), out["states"]
    (lines,) = summaries(proc.stderr).values()  # INFO kept: the summary line is logged
    assert all(f"{p}: {off}" in lines[-1] for p in PATCHES), lines


@pytest.mark.parametrize("kind", [*GARBAGE, "empty", "blank"])
@pytest.mark.parametrize("var", TOGGLES)
def test_garbage_in_each_variable(var, kind):
    value = GARBAGE.get(kind, "" if kind == "empty" else "   ")
    proc = run_python(["-c", ARM_ONLY], env=_env_with(var, value))
    out = json_lines(proc.stdout)[0]
    closed = var == "KIMI_HOTFIX" and kind not in ("empty", "blank")  # the switch fails closed
    pod_off = var == "KIMI_HOTFIX_POD_FILES" and kind not in ("empty", "blank")  # writes nothing
    assert {k: out[k] for k in DEFAULTS} == dict(DEFAULTS, enabled=not closed,
                                                 pod_files=not pod_off)  # defaults kept
    # no value starts a line of its own in the log (escaped where the line quotes it)
    assert not any(line.startswith(FORGED) for line in proc.stderr.splitlines()), proc.stderr
    if closed:  # every patch off, the value named as the process saw it: cut (no 100 KB
        # summary line) and escaped (no newline, no "|" separator)
        shown = printable(os.fsdecode(value) if isinstance(value, bytes) else value)
        assert "\n" not in shown and "|" not in shown
        assert set(out["states"].values()) == {f"disabled (KIMI_HOTFIX={shown})"}
    else:
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


# -- a broken install (the package cannot load) ----------------------------------------

INACTIVE_LINE = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} kimi-hotfix\[(\d+)\] WARNING "
                           r"kimi-hotfix inactive: cannot load kimi_hotfix\.runtime\.core \((.*)\); "
                           r"vLLM runs unpatched$")
# the plugin's entry point, called the way vLLM's load_general_plugins() calls it
PLUGIN_ENTRY = ("import vllm.v1.kv_cache_interface\n"
                "from importlib import import_module\n"
                "import_module('kimi_hotfix.plugin').register()\n"
                "print('vLLM imported')\n")


@pytest.mark.parametrize("strict", [False, True])
@pytest.mark.parametrize("entry", ["sitecustomize", "plugin"])
def test_broken_install_says_inactive_and_strict_fails_the_import(tmp_path, entry, strict):
    """The shim's directory is there but its package cannot load (a truncated
    copy): one line that says so, with the prefix every line has
    (``kimi-hotfix[PID] WARNING``); vLLM imports unpatched; strict mode fails.
    Through the bootstrap and through the plugin's entry point alike."""
    shim = tmp_path / "shim"
    shutil.copytree(REPO / "kimi_hotfix", shim / "kimi_hotfix",
                    ignore=shutil.ignore_patterns("__pycache__", "_vendor"))
    if entry == "sitecustomize":
        shutil.copy2(REPO / "sitecustomize.py", shim / "sitecustomize.py")
    (shim / "kimi_hotfix" / "runtime" / "core.py").write_text("def arm(:\n")  # truncated on copy
    env = hermetic_env(KIMI_HOTFIX_STRICT="1" if strict else None)
    env["PYTHONPATH"] = os.pathsep.join([str(shim), str(VLLM_COMPLETE)])
    code = ("import vllm.v1.kv_cache_interface\nprint('vLLM imported')\n"
            if entry == "sitecustomize" else PLUGIN_ENTRY)
    proc = run_python(["-c", code], env=env, check=False, cwd=tmp_path)  # not the checkout's
    inactive = [m for m in map(INACTIVE_LINE.match, proc.stderr.splitlines()) if m]
    assert len(inactive) == 1, proc.stderr
    assert "SyntaxError" in inactive[0].group(2) and "core.py" in inactive[0].group(2)
    assert int(inactive[0].group(1)) > 0
    if strict:
        assert proc.returncode == 1 and "vLLM imported" not in proc.stdout
        assert "SyntaxError" in proc.stderr.splitlines()[-1]
    else:
        assert proc.returncode == 0 and proc.stdout == "vLLM imported\n", proc.stderr
        assert "Traceback" not in proc.stderr

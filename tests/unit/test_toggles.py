"""The master switch fails closed (issue 21 item 8), plain and under -O.

An unknown ``KIMI_HOTFIX`` value (a typo for "off": ``disabled``, the letter
``O``) turns the shim off in the process that reads it, through the real
bootstrap (sitecustomize on PYTHONPATH) and the stand-in vLLM's target modules:
every patch ``disabled (KIMI_HOTFIX=<value>)``, nothing wrapped, one warning that
names the value and says it fails closed, the summary line says so. A typo in
``KIMI_HOTFIX_STRICT`` keeps strict mode off: a missing target symbol stays a
warning, the import does not fail. The parser's own cases are in test_config.py;
why the switch fails closed: docs/operations.md#toggles.
"""

from __future__ import annotations

import os

import pytest

from helpers import (
    PATCHES,
    REPO,
    STANDINS,
    TARGETS,
    VLLM_COMPLETE,
    VLLM_RENAMED,
    final_summary,
    hermetic_env,
    json_lines,
    line_states,
    run_python,
    warning_lines,
)

PRELUDE = f"import sys; sys.path.append({str(STANDINS)!r}); import mechanics\n"
IMPORT_TARGETS = "".join(f"import {t}\n" for t in TARGETS)


@pytest.mark.parametrize("flags", [[], ["-O"]], ids=["plain", "O"])
def test_an_unknown_kill_switch_value_turns_the_shim_off(flags):
    env = hermetic_env(KIMI_HOTFIX="disabled")
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), str(VLLM_COMPLETE)])
    proc = run_python(["-c", IMPORT_TARGETS + PRELUDE + "mechanics.emit(mechanics.report())\n"],
                      flags=flags, env=env)
    out = json_lines(proc.stdout)[0]
    assert out["optimize"] == len(flags) and out["bootstrap_loaded"] is True
    assert out["states"] == dict.fromkeys(PATCHES, "disabled (KIMI_HOTFIX=disabled)")
    assert out["wrapped"] == {} and out["recorded"] == {}
    (warning,) = warning_lines(proc.stderr)
    assert warning.endswith("KIMI_HOTFIX='disabled' is not understood; valid values: "
                            "1/on/true/yes or 0/off/false/no; using off (an unknown "
                            "KIMI_HOTFIX fails closed)"), warning
    assert set(line_states(final_summary(proc.stderr)).values()) == {"disabled"}
    # the same variable, understood: on, the patches applied to the stand-ins (those for
    # -O only do not apply to plain Python)
    env["KIMI_HOTFIX"] = " ON "
    proc = run_python(["-c", IMPORT_TARGETS + PRELUDE + "mechanics.emit(mechanics.report())\n"],
                      flags=flags, env=env)
    out = json_lines(proc.stdout)[0]
    kinds = set(out["kinds"].values())
    assert "applied" in kinds and kinds <= {"applied", "not_affected"} and out["wrapped"]
    assert warning_lines(proc.stderr) == []


@pytest.mark.parametrize("flags", [[], ["-O"]], ids=["plain", "O"])
def test_a_strict_typo_keeps_strict_mode_off(flags):
    env = hermetic_env(KIMI_HOTFIX_STRICT="ture")
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), str(VLLM_RENAMED)])
    code = IMPORT_TARGETS + "print('imported')\n"
    proc = run_python(["-c", code], flags=flags, env=env)  # exits 0: nothing raised
    assert proc.stdout == "imported\n"
    warnings = warning_lines(proc.stderr)
    assert any("KIMI_HOTFIX_STRICT='ture' is not understood" in w and w.endswith("using off")
               for w in warnings), warnings
    assert "failed" in set(line_states(final_summary(proc.stderr)).values())


def test_a_long_unknown_kill_switch_value_is_cut_in_the_state():
    """A pathological value (10,000 characters) turns the shim off like any
    other, and the state (so every summary line) quotes it cut to 60 characters,
    as the warning does: no 10 KB line per state change."""
    value = "x" * 10_000
    env = hermetic_env(KIMI_HOTFIX=value)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), str(VLLM_COMPLETE)])
    proc = run_python(["-c", IMPORT_TARGETS + PRELUDE + "mechanics.emit(mechanics.report())\n"],
                      flags=["-O"], env=env)
    out = json_lines(proc.stdout)[0]
    cut = f"disabled (KIMI_HOTFIX={'x' * 60}... (10000 characters))"
    assert out["states"] == dict.fromkeys(PATCHES, cut)
    assert max(len(line) for line in proc.stderr.splitlines()) < 2000

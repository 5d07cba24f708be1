"""``check`` as an image-build CI job runs it (issue 21 item 5): one vLLM child.

The real vLLM 0.29.0 wheel, ``python -O <shim>/kimi_hotfix check --json`` from a
checkout, with neither the shim on PYTHONPATH nor ``VLLM_TARGET_DEVICE`` set, on
this machine, which has no GPU: vLLM infers no device, so every probe would fail
with "Failed to infer device type" (measured before this gate: exit 1, "the patch
does not fix it"). Now ``check`` re-runs itself on CPU and says so, every probe
runs and every needed patch fixes it, exactly as in the run with
``VLLM_TARGET_DEVICE=cpu`` and the shim on PYTHONPATH (the harness's child); and,
since only ``check`` armed the shim here, it exits 3 and says a server started
this way runs unpatched. The exit codes' table itself: tests/unit/test_gates.py.
"""

from __future__ import annotations

import json

import pytest

from harness import child, venv_python
from helpers import REPO, hermetic_env, run_python


@pytest.mark.releases("0.29.0")
def test_check_without_a_gpu_probes_on_cpu_and_gates_on_the_deployment(release, tmp_path):
    env = hermetic_env(shim=False)
    env.pop("VLLM_TARGET_DEVICE")
    proc = run_python([str(REPO / "kimi_hotfix"), "check", "--json"], python=venv_python(release),
                      flags=["-O"], env=env, cwd=tmp_path, check=False)
    report = json.loads(proc.stdout)
    device = report["device"]
    # what vLLM inferred here decides what check must do (issue 30 item 8: not a constant)
    if device["platform"] == "vllm.platforms.interface.UnspecifiedPlatform":  # no accelerator
        assert device == {**device, "VLLM_TARGET_DEVICE": None, "inferred": None,
                          "probes_on": "cpu", "set_by_check": True}
    else:  # vLLM found a device: check probes on it and sets nothing
        assert device["inferred"] not in (None, "?") and device == {
            **device, "VLLM_TARGET_DEVICE": None, "probes_on": device["inferred"],
            "set_by_check": False}, device
    assert "Failed to infer device type" not in proc.stdout
    assert report["problems"] == [] and report["armed_by"] == ["check"]
    # the same findings as the CPU run with the shim deployed (the harness's child)
    reference = json.loads(child(release, "on", "O")["check"]["stdout"])
    assert report["needed"] == reference["needed"] and report["needed"]
    assert [(p["name"], p["needed"], p["fixes"], p["kind"]) for p in report["patches"]] == \
        [(p["name"], p["needed"], p["fixes"], p["kind"]) for p in reference["patches"]]
    assert reference["exit_status"] == 0 and reference["deployment"]["active"] is True
    # only check armed it: exit 3, and the verdict says what that means
    assert report["deployment"] == {**report["deployment"], "active": False, "enabled": True}
    assert "not on PYTHONPATH" in report["deployment"]["reason"]
    assert proc.returncode == report["exit_status"] == 3, report["verdict"]
    assert report["verdict"].startswith(reference["verdict"] + "; BUT only this check armed")
    assert "a server started like this interpreter runs unpatched" in report["verdict"]

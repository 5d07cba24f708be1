"""Adding a patch is scripts/new-patch plus what it cannot know, on real vLLM (issue 39).

In a copy of this checkout, ``scripts/new-patch`` scaffolds a call-through of
vLLM's planner function ``is_kv_cache_spec_uniform`` (one folder, the table's
row, the README's row: tests/unit/test_new_patch.py proves the unit tier passes
on it) and the newcomer adds the one file the scaffold cannot write: its
``probe.py`` for ``check``. On the real vLLM 0.29.0 under -O, the new patch shows
up in ``status --json``, in ``check --json`` (needed, applied, fixed by its own
probe) and in the summary line, after the real ones.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from harness import venv_python
from helpers import PATCHES, copy_checkout, hermetic_env, run_python, summaries

pytestmark = pytest.mark.releases("0.29.0")

PROBE = '''"""fourth_standin's probe (``check``): is the planner function wrapped?"""

import importlib

from kimi_hotfix.runtime import patching, wrapping


def run():
    module = importlib.import_module("vllm.v1.core.kv_cache_utils")
    wrapped = wrapping.is_wrapped(vars(module)["is_kv_cache_spec_uniform"])
    return patching.ProbeResult(ok=wrapped, detail=f"wrapped: {wrapped}")
'''


@pytest.fixture(scope="module")
def shim(tmp_path_factory):
    root = tmp_path_factory.mktemp("fourth") / "shim"
    copy_checkout(root)
    subprocess.run([sys.executable, str(root / "scripts" / "new-patch"), "fourth_standin",
                    "vllm.v1.core.kv_cache_utils:is_kv_cache_spec_uniform"],
                   cwd=root, check=True, capture_output=True, timeout=120)
    (root / "kimi_hotfix" / "patches" / "fourth_standin" / "probe.py").write_text(PROBE)
    return root


def test_status_check_and_summary_line_find_it(release, shim):
    env = hermetic_env(shim=False)
    env["PYTHONPATH"] = str(shim)
    python = venv_python(release)
    status = json.loads(run_python([str(shim / "kimi_hotfix"), "status", "--json"],
                                   python=python, env=env).stdout)
    names = [p["name"] for p in status["patches"]]
    assert names == [*PATCHES, "fourth_standin"]
    fourth = status["patches"][-1]
    assert (fourth["kind"], fourth["target"]) == ("pending", "vllm.v1.core.kv_cache_utils")
    proc = run_python([str(shim / "kimi_hotfix"), "check", "--json"], python=python,
                      flags=["-O"], env=env, check=False)
    report = json.loads(proc.stdout)
    assert proc.returncode == 0, report["verdict"]
    entry = report["patches"][-1]
    assert entry["name"] == "fourth_standin"
    assert (entry["needed"], entry["fixes"], entry["kind"]) == (True, True, "applied")
    assert entry["without"]["detail"] == "wrapped: False"
    assert "fourth_standin" in report["verdict"]
    (lines,) = summaries(proc.stderr).values()
    assert lines[0].endswith("| fourth_standin: pending")
    assert any(line.endswith("| fourth_standin: applied") for line in lines), lines
    assert os.path.commonpath([status["kimi_hotfix"]["path"], str(shim)]) == str(shim)

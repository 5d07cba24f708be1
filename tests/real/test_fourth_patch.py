"""Adding a patch is one new module plus one registry line (issue 8).

A copy of the shim (kimi_hotfix/ and sitecustomize.py as in the checkout)
gets a stand-in patch (its own module, its check, apply and probe) and one more
name in ``PATCH_MODULES``, nothing else. On the real vLLM 0.29.0 under -O, the
new patch shows up in ``status --json``, in ``check --json`` (needed, applied,
fixed by its own probe) and in the summary line, after the real ones.
"""

from __future__ import annotations

import json
import os
import re
import shutil

import pytest

from harness import venv_python
from helpers import PATCHES, REPO, hermetic_env, run_python, summaries

pytestmark = pytest.mark.releases("0.29.0")

FOURTH = '''"""fourth_standin: a stand-in fourth patch (tests only, not shipped).

Why: to show that a patch is one module. What it changes: nothing that matters;
it wraps vLLM's planner function is_kv_cache_spec_uniform with a pass-through.
Upstream: none. Needed when: always (a stand-in).
"""

import importlib

from kimi_hotfix.runtime import patching, wrapping
class FourthPatch(patching.Patch):
    name = "fourth_standin"
    target = "vllm.v1.core.kv_cache_utils"
    wraps = ("is_kv_cache_spec_uniform",)
    upstream = "none (a test stand-in)"
    fixed_in = ""
    symptoms = ("none",)
    summary = "a pass-through around is_kv_cache_spec_uniform"
    decides = "always needed (a stand-in)"
    probe_title = "is_kv_cache_spec_uniform carries the shim's marker"

    def decide(self, module, optimize):
        return patching.needed("a stand-in that is always needed")

    def apply(self, module, ctx):
        ctx.wrap(module, "is_kv_cache_spec_uniform", lambda wrapped, i, a, k: wrapped(*a, **k))

    def probe(self):
        module = importlib.import_module(self.target)
        wrapped = wrapping.is_wrapped(vars(module)["is_kv_cache_spec_uniform"])
        return patching.ProbeResult(ok=wrapped, detail=f"wrapped: {wrapped}")


PATCH = FourthPatch()
'''


@pytest.fixture(scope="module")
def shim(tmp_path_factory):
    root = tmp_path_factory.mktemp("fourth") / "shim"
    shutil.copytree(REPO / "kimi_hotfix", root / "kimi_hotfix",
                    ignore=shutil.ignore_patterns("__pycache__", "_vendor"))
    shutil.copy2(REPO / "sitecustomize.py", root / "sitecustomize.py")
    (root / "kimi_hotfix" / "patches" / "fourth_standin.py").write_text(FOURTH)
    registry = root / "kimi_hotfix" / "patches" / "__init__.py"
    text = registry.read_text()
    new = re.sub(r'(PATCHES = \{.*?)\n\}', r'\1\n    "fourth_standin": "vllm.v1.core.kv_cache_utils",\n}',
                 text, count=1, flags=re.S)
    # the setup the docstring states: one line of the registry changed, the name added
    assert new.count("fourth_standin") == 1
    assert len(set(new.splitlines()) - set(text.splitlines())) == 1
    registry.write_text(new)
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

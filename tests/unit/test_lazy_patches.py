"""What a process loads is what it needs (issue 29): arming reads the registry's
table only; the first import of any target loads every patch module, so a
broken one reads ``failed`` with its cause in every process that imports a
target (whether or not it imports that patch's own), and strict mode fails
that import. A copy of the package whose kda_overlong_rows module raises at
import, on the stand-in vLLM (the "complete" tree, tests/standins/vllm_tree.py), in children."""

from __future__ import annotations

import os
import shutil

import pytest

from helpers import PATCHES, REPO, VLLM_COMPLETE, hermetic_env, json_lines, run_python

CHILD = r'''
import json, sys
from kimi_hotfix.runtime import core
def loaded():
    mine = ("kimi_hotfix.patch", *(f"kimi_hotfix.runtime.{m}"
                                   for m in ("patching", "recompile", "wrapping", "outcome")))
    return sorted(m for m in sys.modules if m.startswith(mine))


core.arm("test")
out = {"armed": {"loaded": loaded(), "broken": str(core.states()["kda_overlong_rows"])}}
try:
    import vllm.v1.kv_cache_interface  # another patch's target
    out["raised"] = None
except Exception as exc:
    out["raised"] = f"{type(exc).__name__}: {exc}"
out["target"] = {"loaded": loaded(), "broken": str(core.states()["kda_overlong_rows"]),
                 "own_target_imported": "vllm.models.kimi_k3.nvidia.kda_metadata" in sys.modules}
print("KIMI_JSON:" + json.dumps(out))
'''
MARK = "kimi-hotfix test: kda_overlong_rows raises at import"


@pytest.fixture(scope="module")
def broken_copy(tmp_path_factory):
    root = tmp_path_factory.mktemp("lazy")
    shutil.copytree(REPO / "kimi_hotfix", root / "kimi_hotfix",
                    ignore=shutil.ignore_patterns("__pycache__", "_vendor"))
    module = root / "kimi_hotfix" / "patches" / "kda_overlong_rows" / "__init__.py"
    module.write_text(module.read_text().replace(
        "from __future__ import annotations\n",
        f"from __future__ import annotations\n\nraise RuntimeError({MARK!r})\n", 1))
    return root


@pytest.mark.parametrize("strict", [False, True])
def test_the_first_target_import_loads_every_patch_and_a_broken_one_fails(broken_copy, strict):
    env = hermetic_env(KIMI_HOTFIX_STRICT="1" if strict else None)
    env["PYTHONPATH"] = os.pathsep.join([str(broken_copy), str(VLLM_COMPLETE)])
    out = json_lines(run_python(["-c", CHILD], env=env, cwd=broken_copy).stdout)[-1]
    # arming loaded the table (kimi_hotfix.patches), no patch module, none of their helpers
    assert out["armed"] == {"loaded": ["kimi_hotfix.patches"], "broken": "pending"}
    path = broken_copy / "kimi_hotfix" / "patches" / "kda_overlong_rows" / "__init__.py"
    line = next(i for i, text in enumerate(path.read_text().splitlines(), 1) if MARK in text)
    why = f"cannot load kimi_hotfix.patches.kda_overlong_rows (RuntimeError: {MARK} (at {path}, line {line}))"
    assert out["target"]["broken"] == f"failed: {why}"
    assert out["target"]["own_target_imported"] is False
    assert {*(f"kimi_hotfix.patches.{n}" for n in PATCHES if n != "kda_overlong_rows"),
            "kimi_hotfix.runtime.patching"} <= set(out["target"]["loaded"])
    assert out["raised"] == (f"KimiHotfixError: kda_overlong_rows: {why}" if strict else None)

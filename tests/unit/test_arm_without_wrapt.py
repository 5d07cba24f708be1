"""Arming where wrapt cannot be imported, beside a patch whose module cannot
load: every pending patch reads ``failed: wrapt is not installed``, the
unloadable one keeps its own cause and is logged once, the host goes on;
strict mode raises. Child interpreters with stand-in patches (fakes.py) and a
wrapt that raises on import first on PYTHONPATH (test_faults.py does the same
in a venv without wrapt)."""

from __future__ import annotations

import os

import pytest

from helpers import REPO, STANDINS, hermetic_env, json_lines, run_python

CHILD = f"import sys\nsys.path.append({str(STANDINS)!r})\n" + r'''
import fakes
from fakes import Fake
from kimi_hotfix.runtime import base, core, registry, patching
fakes.register(Fake("needed", patching.needed("the bug is there")), Fake("other", patching.fixed("fine")))
registry.add(patching.Unloadable("broken", ImportError("no such file")))
try:
    core.arm("test")
    out = {"raised": None}
except Exception as exc:
    out = {"raised": f"{type(exc).__name__}: {exc}"}
out["states"] = {n: str(s) for n, s in core.states().items()}
fakes.emit(out)
'''


@pytest.mark.parametrize("strict", [False, True])
def test_without_wrapt_every_pending_patch_fails_and_says_why(tmp_path, strict):
    (tmp_path / "wrapt.py").write_text("raise ImportError('wrapt blocked for this test')\n")
    env = hermetic_env(KIMI_HOTFIX_STRICT="1" if strict else None)
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), str(REPO)])
    proc = run_python(["-c", CHILD], env=env)
    out = json_lines(proc.stdout)[-1]
    broken = "failed: cannot load kimi_hotfix.patches.broken (ImportError: no such file)"
    if strict:  # the unloadable patch stops arming first
        assert out["raised"] == ("KimiHotfixError: broken: cannot load kimi_hotfix.patches.broken "
                                 "(ImportError: no such file)")
    else:
        assert out["raised"] is None
        assert out["states"] == {"needed": "failed: wrapt is not installed",
                                 "other": "failed: wrapt is not installed", "broken": broken}
        assert proc.stderr.count("wrapt is not installed: kimi-hotfix is inactive") == 1
    assert proc.stderr.count("kimi-hotfix: broken: cannot load kimi_hotfix.patches.broken "
                             "(ImportError: no such file); vLLM unchanged") == 1

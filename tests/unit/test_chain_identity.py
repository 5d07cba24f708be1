"""The container's own sitecustomize runs exactly once, whichever copies of the
shim come first on sys.path (issue 20 item 10).

The shim can be on PYTHONPATH twice: through a symlink to its directory, or as
the bundle beside a checkout. The bootstrap that runs first must not mistake
the second copy for the container's sitecustomize (which then never ran): it
knows a copy by what it is (it carries the bootstrap's ALIAS and, run again,
registers nothing), not by its path. Stand-ins: tests/standins/container_site
(the container's sitecustomize, which logs each run) and the stand-in vLLM.
The real-vLLM twin of this is in tests/real/test_fault_tier.py (the bundle
beside a checkout).
"""

from __future__ import annotations

import os
import shutil

import pytest

from helpers import REPO, STANDINS, VLLM_COMPLETE, hermetic_env, json_lines, run_python

CONTAINER_SITE = STANDINS / "container_site"
COMPLETE = VLLM_COMPLETE
PRELUDE = f"import sys; sys.path.append({str(STANDINS)!r}); import mechanics\n"
CODE = (
    "import sitecustomize\n"
    "info = {'module_file': sitecustomize.__file__}\n"
    "import vllm.v1.worker.gpu.cudagraph_utils\n"  # the trigger still arms, once
    + PRELUDE
    + "sc = sys.modules['kimi_hotfix_sitecustomize']\n"
    "mechanics.emit(mechanics.report(copies=list(getattr(sc, 'COPIES', ['n/a'])), **info))\n"
)


@pytest.fixture(scope="module")
def copies(tmp_path_factory):
    """{"checkout": the repository, "link": a symlink to it, "copy": another
    copy of the shim (as the bundle is)}."""
    root = tmp_path_factory.mktemp("copies")
    (root / "link").symlink_to(REPO, target_is_directory=True)
    copy = root / "copy"
    shutil.copytree(REPO / "kimi_hotfix", copy / "kimi_hotfix",
                    ignore=shutil.ignore_patterns("__pycache__", "_vendor"))
    shutil.copy2(REPO / "sitecustomize.py", copy / "sitecustomize.py")
    return {"checkout": REPO, "link": root / "link", "copy": copy}


ORDERS = [("checkout", "link"), ("link", "checkout"), ("copy", "checkout"),
          ("checkout", "copy"), ("link", "copy", "checkout")]


@pytest.mark.parametrize("order", ORDERS, ids=["-".join(o) for o in ORDERS])
def test_container_sitecustomize_runs_once_whichever_copy_comes_first(tmp_path, copies, order):
    log = tmp_path / "container-site.log"
    env = hermetic_env(shim=False, STANDIN_SITE_LOG=str(log))
    path = [copies[name] for name in order] + [CONTAINER_SITE, COMPLETE]
    env["PYTHONPATH"] = os.pathsep.join(str(p) for p in path)
    out = json_lines(run_python(["-c", CODE], env=env, cwd=tmp_path).stdout)[0]
    assert log.read_text().splitlines() == ["container sitecustomize ran"]
    assert out["module_file"] == str(CONTAINER_SITE / "sitecustomize.py")
    assert out["chained"] == [str(CONTAINER_SITE / "sitecustomize.py")]
    skipped = [str(copies[name] / "sitecustomize.py") for name in order[1:]]
    assert out["copies"] == skipped  # each copy seen, none run as the container's
    assert out["armed_by"] == ["sitecustomize"] and out["bootstrap_armed"] is True
    assert out["states"]["capture_workspace"] == "applied"
    assert {v["layers"] for v in out["wrapped"].values()} == {1}

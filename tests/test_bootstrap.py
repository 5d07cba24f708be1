"""The bootstrap's own mechanics (issue 2 item 2), in real interpreters.

- ``sitecustomize`` imports nothing heavy (no vllm, torch, wrapt, logging, core);
- the trigger arms when vLLM is really imported; arming after vLLM was imported
  applies at once;
- idempotence: re-running sitecustomize, arming twice, the plugin entry point
  and sitecustomize together: exactly one marked wrapper layer per target;
- undo restores vLLM's original objects (identity), reapply wraps once again;
- a container's own sitecustomize later on sys.path runs exactly once, is what
  ``import sitecustomize`` returns, and its exception is reported as without us;
- multiprocessing spawn, fork and forkserver children are patched (real vLLM
  0.29.0 under -O: the child's merge of target + draft keeps the capability,
  while vLLM's own merge, called in the same child, drops it).

The stand-ins under tests/standins are used only for the shim's mechanics; every
claim about vLLM runs the real 0.29.0 wheel.
"""

from __future__ import annotations

import pytest

from conftest import REPO, hermetic_env, json_lines, run_python

pytestmark = pytest.mark.vllm("0.29.0")

from standins.common import PATCHES, PRELUDE, STANDINS, SUMMARY, TARGETS  # noqa: E402

SITECUSTOMIZE = REPO / "sitecustomize.py"
CONTAINER_SITE = STANDINS / "container_site"


def summary_lines(stderr: str) -> list:
    return [line for line in stderr.splitlines() if SUMMARY in line and " INFO " in line]


def assert_one_layer_each(report: dict) -> None:
    """Every marked attribute has exactly one marked layer, and the marked
    attributes are exactly the ones the core recorded (nothing wrapped twice,
    nothing wrapped behind the core's back)."""
    wrapped = report["wrapped"]
    assert wrapped, report
    assert {k: v["layers"] for k, v in wrapped.items()} == {k: 1 for k in wrapped}
    assert {k: v["patch"] for k, v in wrapped.items()} == report["recorded"]


def test_sitecustomize_imports_nothing_heavy():
    code = (
        "import sys\n"
        "mods = sorted(sys.modules)\n"
        "import json\n"
        "print('KIMI_JSON:' + json.dumps({'modules': mods, "
        "'meta_path': [type(f).__name__ for f in sys.meta_path]}))\n"
    )
    for flags in ([], ["-O"]):
        bare = json_lines(run_python(["-c", code], flags=flags, env=hermetic_env(shim=False)).stdout)[0]
        proc = run_python(["-c", code], flags=flags, env=hermetic_env())
        shim = json_lines(proc.stdout)[0]
        added = set(shim["modules"]) - set(bare["modules"])
        assert added == {"sitecustomize", "kimi_hotfix_sitecustomize"}, added
        heavy = [m for m in shim["modules"] if m.split(".")[0] in ("vllm", "torch", "wrapt", "logging", "kimi_hotfix")]
        assert heavy == []
        assert shim["meta_path"][0] == "VllmImportTrigger"
        assert proc.stderr == ""


def test_find_spec_alone_does_not_arm():
    """Libraries probe with importlib.util.find_spec('vllm'): no arming, no log."""
    code = (
        "import importlib.util, sys\n"
        "assert importlib.util.find_spec('vllm') is not None\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('vllm', 'wrapt', 'kimi_hotfix')))\n"
        "print(sys.modules['kimi_hotfix_sitecustomize'].ARMED)\n"
    )
    proc = run_python(["-c", code])
    assert proc.stdout.splitlines() == ["[]", "False"]
    assert proc.stderr == ""


def test_trigger_arms_on_vllm_import_and_rearming_never_double_wraps():
    code = (
        "import sys\n"
        "before = {'core': 'kimi_hotfix.core' in sys.modules, 'wrapt': 'wrapt' in sys.modules,\n"
        "          'armed': sys.modules['kimi_hotfix_sitecustomize'].ARMED}\n"
        + "".join(f"import {t}\n" for t in TARGETS)
        + PRELUDE
        + "first = mechanics.report()\n"
        "import runpy, kimi_hotfix, kimi_hotfix.plugin\n"
        f"runpy.run_path({str(SITECUSTOMIZE)!r})\n"
        "kimi_hotfix.arm()\n"
        "kimi_hotfix.plugin.register()\n"
        "again = mechanics.report()\n"
        # undo restores vLLM's original objects (the wrappers' __wrapped__)
        "mods = [sys.modules[t] for t in " + repr(TARGETS) + "]\n"
        "def attr(key):\n"
        "    cls, name = key.split('.')\n"
        "    owner = next(getattr(m, cls) for m in mods if hasattr(m, cls))\n"
        "    return owner, name\n"
        "originals = {k: vars(o)[n].__wrapped__ for k in first['wrapped'] for o, n in [attr(k)]}\n"
        "kimi_hotfix.undo()\n"
        "restored = {k: vars(o)[n] is originals[k] for k in originals for o, n in [attr(k)]}\n"
        "after_undo = mechanics.report()\n"
        "kimi_hotfix.reapply()\n"
        "reapplied = mechanics.report()\n"
        "mechanics.emit(dict(before=before, first=first, again=again, restored=restored,\n"
        "                    after_undo=after_undo, reapplied=reapplied))\n"
    )
    proc = run_python(["-c", code])
    out = json_lines(proc.stdout)[0]
    assert out["before"] == {"core": False, "wrapt": False, "armed": False}
    first = out["first"]
    assert first["bootstrap_armed"] is True
    assert first["armed_by"] == ["sitecustomize"]
    assert all(first["states"][p].startswith("applied") for p in PATCHES), first["states"]
    assert {v["patch"] for v in first["wrapped"].values()} == set(PATCHES)
    assert_one_layer_each(first)
    # runpy of the bootstrap is a no-op; the API and the plugin arm idempotently
    again = out["again"]
    assert again["armed_by"] == ["sitecustomize", "api", "vllm-plugin"]
    assert again["wrapped"] == first["wrapped"] and again["recorded"] == first["recorded"]
    assert again["chained"] == first["chained"] == []
    # undo / reapply
    assert out["restored"] and all(out["restored"].values()), out["restored"]
    assert out["after_undo"]["wrapped"] == {}
    assert set(out["after_undo"]["states"].values()) == {"undone"}
    assert out["reapplied"]["wrapped"] == first["wrapped"]
    assert_one_layer_each(out["reapplied"])
    # one summary line, naming every patch with its state
    lines = summary_lines(proc.stderr)
    assert len(lines) == 1, proc.stderr
    for name, state in first["states"].items():
        assert f"{name}: {state}" in lines[0]


def test_vllm_already_imported_applies_at_once():
    """No sitecustomize: vLLM is imported first, then kimi_hotfix.arm()."""
    code = (
        "import sys\n"
        + "".join(f"import {t}\n" for t in TARGETS)
        + f"sys.path.insert(0, {str(REPO)!r})\n"
        + PRELUDE
        + "mods = [sys.modules[t] for t in " + repr(TARGETS) + "]\n"
        "originals = {(c, a): v for m in mods for c in vars(m).values() if isinstance(c, type)\n"
        "             for a, v in list(vars(c).items()) if a in ('merge', '_init_candidates', 'build')}\n"
        "before = 'kimi_hotfix_sitecustomize' in sys.modules\n"
        "import kimi_hotfix, kimi_hotfix.plugin, runpy\n"
        "states = kimi_hotfix.arm()\n"  # no further import: hooks ran at registration
        "first = mechanics.report()\n"
        f"runpy.run_path({str(SITECUSTOMIZE)!r})\n"  # vllm loaded: fire() -> arm()
        "kimi_hotfix.arm()\n"
        "kimi_hotfix.plugin.register()\n"
        "again = mechanics.report()\n"
        "kimi_hotfix.undo()\n"
        "restored = all(vars(c)[a] is v for (c, a), v in originals.items())\n"
        "mechanics.emit(dict(before=before, states=states, first=first, again=again,\n"
        "                    restored=restored, n_originals=len(originals)))\n"
    )
    proc = run_python(["-c", code], env=hermetic_env(shim=False))
    out = json_lines(proc.stdout)[0]
    assert out["before"] is False
    assert all(out["states"][p].startswith("applied") for p in PATCHES), out["states"]
    first = out["first"]
    assert first["armed_by"] == ["api"]
    assert_one_layer_each(first)
    assert {v["patch"] for v in first["wrapped"].values()} == set(PATCHES)
    again = out["again"]
    assert again["armed_by"] == ["api", "sitecustomize", "api", "vllm-plugin"]
    assert again["wrapped"] == first["wrapped"]
    assert_one_layer_each(again)
    assert out["n_originals"] >= len(first["wrapped"]) and out["restored"] is True
    assert len(summary_lines(proc.stderr)) == 1, proc.stderr


def _chain_env(tmp_path, *path, **extra):
    log = tmp_path / "container-site.log"
    env = hermetic_env(shim=False, STANDIN_SITE_LOG=str(log), **extra)
    env["PYTHONPATH"] = ":".join(str(p) for p in path)
    return env, log


def test_container_sitecustomize_chained_exactly_once(tmp_path):
    env, log = _chain_env(tmp_path, REPO, CONTAINER_SITE, STANDINS / "vllm_complete")
    code = (
        "import sys, runpy, sitecustomize\n"
        "info = {'module_origin': getattr(sitecustomize, 'ORIGIN', None),\n"
        "        'module_file': sitecustomize.__file__}\n"
        f"runpy.run_path({str(SITECUSTOMIZE)!r})\n"  # a second run chains nothing
        "import sitecustomize as again\n"
        "info['same_module'] = again is sitecustomize\n"
        "import vllm.v1.worker.gpu.cudagraph_utils\n"  # stand-in vllm: the trigger still arms
        + PRELUDE
        + "mechanics.emit(mechanics.report(**info))\n"
    )
    proc = run_python(["-c", code], env=env)
    out = json_lines(proc.stdout)[0]
    assert log.read_text().splitlines() == ["container sitecustomize ran"]
    assert out["module_origin"] == "container-standin"
    assert out["module_file"] == str(CONTAINER_SITE / "sitecustomize.py")
    assert out["same_module"] is True
    assert out["chained"] == [str(CONTAINER_SITE / "sitecustomize.py")]
    assert out["bootstrap_armed"] is True and out["armed_by"] == ["sitecustomize"]
    assert out["states"]["capture_workspace"] == "applied"


def test_container_sitecustomize_exception_reported_as_without_shim(tmp_path):
    code = "import sys\nprint('program ran')\nprint('kimi_hotfix_sitecustomize' in sys.modules)\n"
    results = {}
    for label, path in (("alone", [CONTAINER_SITE]), ("shim", [REPO, CONTAINER_SITE])):
        env, log = _chain_env(tmp_path / label, *path, STANDIN_SITE_RAISE="1")
        (tmp_path / label).mkdir()
        proc = run_python(["-c", code], env=env, check=False)
        results[label] = (proc.returncode, proc.stdout.splitlines(), proc.stderr, log.read_text())
    alone, shim = results["alone"], results["shim"]
    assert alone[0] == shim[0] == 0
    assert alone[1] == ["program ran", "False"] and shim[1] == ["program ran", "True"]
    assert shim[2] == alone[2]
    assert alone[2].startswith("Error in sitecustomize; set PYTHONVERBOSE for traceback:")
    assert "RuntimeError: container sitecustomize failed on purpose" in alone[2]
    assert alone[3] == shim[3] == "container sitecustomize ran\n"


CHILD_SCRIPT = """
import json, multiprocessing as mp, os, sys
sys.path.append(%(standins)r)
import mechanics


def child(queue):
    # all three targets, as a Kimi-K3 worker imports them: the summary line is
    # then logged at once (a multiprocessing child ends in os._exit(), so a line
    # deferred to atexit would never appear; see the report to the lead)
    import vllm.v1.kv_cache_interface as kv
    import vllm.v1.worker.gpu.cudagraph_utils
    import vllm.models.kimi_k3.nvidia.kda_metadata
    queue.put(json.dumps(mechanics.report(
        capability=mechanics.mla_capability(kv),
        vllm_own_merge_capability=mechanics.mla_capability(kv, original=True),
        ppid=os.getppid(),
    ), default=repr))


if __name__ == "__main__":
    ctx = mp.get_context(sys.argv[1])
    queue = ctx.SimpleQueue()
    proc = ctx.Process(target=child, args=(queue,))
    proc.start()
    result = json.loads(queue.get())
    proc.join()
    mechanics.emit({"child": result, "parent": {
        "pid": os.getpid(), "vllm_loaded": "vllm" in sys.modules,
        "exitcode": proc.exitcode, "start_method": ctx.get_start_method()}})
"""


@pytest.mark.parametrize("method", ["spawn", "fork", "forkserver"])
def test_multiprocessing_children_are_patched(tmp_path, method):
    script = tmp_path / "parent.py"
    script.write_text(CHILD_SCRIPT % {"standins": str(STANDINS)})
    proc = run_python([str(script), method], flags=["-O"])
    out = json_lines(proc.stdout)[0]
    parent, child = out["parent"], out["child"]
    assert parent["start_method"] == method and parent["exitcode"] == 0
    assert parent["vllm_loaded"] is False  # the child imported vLLM itself
    assert child["pid"] != parent["pid"] and child["optimize"] == 1
    assert child["bootstrap_loaded"] is True and child["bootstrap_armed"] is True
    assert child["armed_by"] == ["sitecustomize"]
    assert child["wrapped"]["MLAAttentionSpec.merge"] == {"patch": "kv_spec_merge", "layers": 1}
    assert_one_layer_each(child)
    assert {v["patch"] for v in child["wrapped"].values()} == set(PATCHES)
    # the fix, next to the bug it fixes (vLLM's own merge, same child, same -O)
    assert child["capability"] is True
    assert child["vllm_own_merge_capability"] is False
    # the child logs its own summary line (the parent never armed)
    assert len(summary_lines(proc.stderr)) == 1, proc.stderr

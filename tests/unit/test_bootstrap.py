"""The bootstrap's own mechanics, in child interpreters of this Python.

- ``sitecustomize`` imports nothing heavy (no vllm, torch, wrapt, logging, core);
- the trigger arms when vLLM is really imported, never on find_spec; arming
  after vLLM was imported applies at once;
- idempotence: re-running sitecustomize, arming twice, the plugin entry point
  and sitecustomize together: exactly one marked layer per target;
- undo restores vLLM's original objects (identity), reapply wraps once again;
- a container's own sitecustomize later on sys.path runs exactly once, is what
  ``import sitecustomize`` returns, and its exception is reported as without us.

The "vLLM" here is the stand-in "complete" tree (tests/standins/vllm_tree.py): these tests
are about the shim's machinery, never about what vLLM does (tests/real).
"""

from __future__ import annotations

import os

from helpers import (
    PATCHES,
    REPO,
    STANDINS,
    TARGETS,
    VLLM_COMPLETE,
    hermetic_env,
    json_lines,
    line_states,
    run_python,
    summaries,
)

SITECUSTOMIZE = REPO / "sitecustomize.py"
CONTAINER_SITE = STANDINS / "container_site"
COMPLETE = VLLM_COMPLETE
PRELUDE = f"import sys; sys.path.append({str(STANDINS)!r}); import mechanics\n"


def standin_env(**extra):
    env = hermetic_env(**extra)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), str(COMPLETE)])
    return env


def assert_one_layer_each(report):
    wrapped = report["wrapped"]
    assert wrapped, report
    assert {k: v["layers"] for k, v in wrapped.items()} == {k: 1 for k in wrapped}
    assert {k: v["patch"] for k, v in wrapped.items()} == report["recorded"]


def test_sitecustomize_imports_nothing_heavy():
    code = ("import sys\nmods = sorted(sys.modules)\nimport json\n"
            "print('KIMI_JSON:' + json.dumps({'modules': mods, "
            "'meta_path': [type(f).__name__ for f in sys.meta_path]}))\n")
    for flags in ([], ["-O"]):
        bare = json_lines(run_python(["-c", code], flags=flags,
                                     env=hermetic_env(shim=False)).stdout)[0]
        proc = run_python(["-c", code], flags=flags, env=hermetic_env())
        shim = json_lines(proc.stdout)[0]
        added = set(shim["modules"]) - set(bare["modules"])
        assert added == {"sitecustomize", "kimi_hotfix_sitecustomize"}, added
        heavy = [m for m in shim["modules"]
                 if m.split(".")[0] in ("vllm", "torch", "wrapt", "logging", "kimi_hotfix")]
        assert heavy == []
        assert shim["meta_path"][0] == "VllmImportTrigger"
        assert proc.stderr == ""


def test_find_spec_alone_does_not_arm():
    """Libraries probe with importlib.util.find_spec('vllm'): no arming, no log."""
    code = ("import importlib.util, sys\n"
            "print(importlib.util.find_spec('vllm') is not None)\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] in "
            "('vllm', 'wrapt', 'kimi_hotfix')))\n"
            "print(sys.modules['kimi_hotfix_sitecustomize'].ARMED)\n")
    proc = run_python(["-c", code], env=standin_env())
    assert proc.stdout.splitlines() == ["True", "[]", "False"]
    assert proc.stderr == ""


def test_trigger_arms_on_vllm_import_and_rearming_never_double_wraps():
    code = (
        "import sys\n"
        "before = {'core': 'kimi_hotfix.runtime.core' in sys.modules, 'wrapt': 'wrapt' in sys.modules,\n"
        "          'armed': sys.modules['kimi_hotfix_sitecustomize'].ARMED}\n"
        + "".join(f"import {t}\n" for t in TARGETS)
        + PRELUDE
        + "first = mechanics.report()\n"
        "import runpy, kimi_hotfix, kimi_hotfix.plugin\n"
        f"runpy.run_path({str(SITECUSTOMIZE)!r})\n"
        "kimi_hotfix.arm()\n"
        "kimi_hotfix.plugin.register()\n"
        "again = mechanics.report()\n"
        "mods = [sys.modules[t] for t in " + repr(TARGETS) + "]\n"
        "def attr(key):\n"
        "    owner, name = key.rsplit('.', 1)\n"
        "    if owner in sys.modules:\n"
        "        return sys.modules[owner], name\n"
        "    return next(getattr(m, owner) for m in mods if hasattr(m, owner)), name\n"
        "originals = {k: vars(o)[n].__wrapped__ for k in first['wrapped'] for o, n in [attr(k)]}\n"
        "kimi_hotfix.undo()\n"
        "restored = {k: vars(o)[n] is originals[k] for k in originals for o, n in [attr(k)]}\n"
        "after_undo = mechanics.report()\n"
        "kimi_hotfix.reapply()\n"
        "reapplied = mechanics.report()\n"
        "mechanics.emit(dict(before=before, first=first, again=again, restored=restored,\n"
        "                    after_undo=after_undo, reapplied=reapplied))\n"
    )
    proc = run_python(["-c", code], flags=["-O"], env=standin_env())
    out = json_lines(proc.stdout)[0]
    assert out["before"] == {"core": False, "wrapt": False, "armed": False}
    first = out["first"]
    assert first["bootstrap_armed"] is True and first["armed_by"] == ["sitecustomize"]
    assert first["trigger_in_meta_path"] is False  # fired: no longer asked about every import
    assert first["kinds"] == {p: "applied" for p in PATCHES}, first["states"]
    assert {v["patch"] for v in first["wrapped"].values()} == set(PATCHES)
    assert_one_layer_each(first)
    again = out["again"]  # runpy of the bootstrap: no-op; the API and plugin: idempotent
    assert again["armed_by"] == ["sitecustomize", "api", "vllm-plugin"]
    assert again["wrapped"] == first["wrapped"] and again["recorded"] == first["recorded"]
    assert again["chained"] == first["chained"] == []
    assert out["restored"] and all(out["restored"].values()), out["restored"]
    assert out["after_undo"]["wrapped"] == {}
    assert set(out["after_undo"]["states"].values()) == {"disabled (undone)"}
    assert out["reapplied"]["wrapped"] == first["wrapped"]
    assert_one_layer_each(out["reapplied"])
    (lines,) = summaries(proc.stderr).values()  # one process; each line differs from the last
    applied, undone = dict.fromkeys(PATCHES, "applied"), dict.fromkeys(PATCHES, "disabled")
    # armed, settled one by one, then undone, then applied again; re-arming logged nothing
    settling = [{p: "applied" if i < n else "pending" for i, p in enumerate(PATCHES)}
                for n in range(len(PATCHES) + 1)]  # the targets are imported in registry order
    assert [line_states(line) for line in lines] == [*settling, undone, applied], lines


def test_vllm_already_imported_applies_at_once():
    """No sitecustomize: the stand-in vLLM is imported first, then kimi_hotfix.arm()."""
    code = (
        "import sys\n"
        + "".join(f"import {t}\n" for t in TARGETS)
        + f"sys.path.insert(0, {str(REPO)!r})\n"
        + PRELUDE
        + "mods = [sys.modules[t] for t in " + repr(TARGETS) + "]\n"
        "owners = mods + [c for m in mods for c in vars(m).values() if isinstance(c, type)]\n"
        "originals = {(o, a): v for o in owners for a, v in list(vars(o).items())}\n"
        "before = 'kimi_hotfix_sitecustomize' in sys.modules\n"
        "import kimi_hotfix, kimi_hotfix.plugin, runpy\n"
        "states = {n: s.kind.value for n, s in kimi_hotfix.arm().items()}\n"
        "first = mechanics.report()\n"
        f"runpy.run_path({str(SITECUSTOMIZE)!r})\n"
        "kimi_hotfix.arm()\n"
        "kimi_hotfix.plugin.register()\n"
        "again = mechanics.report()\n"
        "kimi_hotfix.undo()\n"
        "restored = all(vars(c)[a] is v for (c, a), v in originals.items())\n"
        "mechanics.emit(dict(before=before, states=states, first=first, again=again,\n"
        "                    restored=restored, n_originals=len(originals)))\n"
    )
    env = hermetic_env(shim=False)
    env["PYTHONPATH"] = str(COMPLETE)
    proc = run_python(["-c", code], flags=["-O"], env=env)
    out = json_lines(proc.stdout)[0]
    assert out["before"] is False
    assert out["states"] == {p: "applied" for p in PATCHES}, out["states"]
    first = out["first"]
    assert first["armed_by"] == ["api"]
    assert_one_layer_each(first)
    again = out["again"]
    assert again["armed_by"] == ["api", "sitecustomize", "api", "vllm-plugin"]
    assert again["wrapped"] == first["wrapped"]
    assert out["n_originals"] >= len(first["wrapped"]) and out["restored"] is True
    (lines,) = summaries(proc.stderr).values()
    assert [line_states(line) for line in lines] == [
        dict.fromkeys(PATCHES, "applied"), dict.fromkeys(PATCHES, "disabled")], lines


def _chain_env(tmp_path, *path, **extra):
    log = tmp_path / "container-site.log"
    env = hermetic_env(shim=False, STANDIN_SITE_LOG=str(log), **extra)
    env["PYTHONPATH"] = os.pathsep.join(str(p) for p in path)
    return env, log


def test_container_sitecustomize_chained_exactly_once(tmp_path):
    env, log = _chain_env(tmp_path, REPO, CONTAINER_SITE, COMPLETE)
    code = (
        "import sys, runpy, sitecustomize\n"
        "info = {'module_origin': getattr(sitecustomize, 'ORIGIN', None),\n"
        "        'module_file': sitecustomize.__file__}\n"
        f"runpy.run_path({str(SITECUSTOMIZE)!r})\n"  # a second run chains nothing
        "import sitecustomize as again\n"
        "info['same_module'] = again is sitecustomize\n"
        "import vllm.v1.worker.gpu.cudagraph_utils\n"  # the trigger still arms
        + PRELUDE
        + "mechanics.emit(mechanics.report(**info))\n"
    )
    out = json_lines(run_python(["-c", code], env=env).stdout)[0]
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
        (tmp_path / label).mkdir()
        env, log = _chain_env(tmp_path / label, *path, STANDIN_SITE_RAISE="1")
        proc = run_python(["-c", code], env=env, check=False)
        results[label] = (proc.returncode, proc.stdout.splitlines(), proc.stderr, log.read_text())
    alone, shim = results["alone"], results["shim"]
    assert alone[0] == shim[0] == 0
    assert alone[1] == ["program ran", "False"] and shim[1] == ["program ran", "True"]
    assert shim[2] == alone[2]
    assert alone[2].startswith("Error in sitecustomize; set PYTHONVERBOSE for traceback:")
    assert "RuntimeError: container sitecustomize failed on purpose" in alone[2]
    assert alone[3] == shim[3] == "container sitecustomize ran\n"


def test_multiprocessing_children_arm_the_shim(tmp_path):
    """spawn, fork and forkserver children import the stand-in vLLM themselves
    and arm (the real-vLLM version of this is tests/real/test_processes.py)."""
    script = tmp_path / "parent.py"
    script.write_text(
        "import json, multiprocessing as mp, sys\n"
        f"sys.path.append({str(STANDINS)!r})\n"
        "import mechanics\n"
        "def child(queue):\n"
        + "".join(f"    import {t}\n" for t in TARGETS)
        + "    queue.put(json.dumps(mechanics.report()))\n"
        "if __name__ == '__main__':\n"
        "    out = {}\n"
        "    for method in ('spawn', 'fork', 'forkserver'):\n"
        "        ctx = mp.get_context(method)\n"
        "        queue = ctx.Queue()\n"
        "        proc = ctx.Process(target=child, args=(queue,))\n"
        "        proc.start()\n"
        "        try:\n"  # a child that dies says so, with its exit code, not a hang
        "            out[method] = json.loads(queue.get(timeout=120))\n"
        "        except Exception as exc:\n"
        "            proc.join(10)\n"
        "            sys.exit(f'the {method} child sent nothing ({exc!r}), exit {proc.exitcode}')\n"
        "        proc.join(60)\n"
        "    out['parent_armed'] = 'kimi_hotfix.runtime.core' in sys.modules\n"
        "    mechanics.emit(out)\n")
    proc = run_python([str(script)], flags=["-O"], env=standin_env())
    out = json_lines(proc.stdout)[0]
    assert out.pop("parent_armed") is False
    for method, kid in out.items():
        assert kid["armed_by"] == ["sitecustomize"], method
        assert kid["kinds"] == {p: "applied" for p in PATCHES}, (method, kid["states"])
        assert_one_layer_each(kid)
    lines = summaries(proc.stderr)
    assert set(lines) == {kid["pid"] for kid in out.values()}  # one process each, the children
    assert all(line_states(found[-1]) == dict.fromkeys(PATCHES, "applied")
               for found in lines.values()), lines

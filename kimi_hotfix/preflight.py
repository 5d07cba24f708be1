"""The preflight behind ``python -m kimi_hotfix check``: imports the installed vLLM.

For each patch it runs that patch's probe (kimi_hotfix.probes.*) on the real vLLM
code twice: without the patch (``core.undo``) and with it (``core.force``), then
puts back what the shim itself chose. A patch is *needed* when its probe fails
without it, and *fixes* when the probe passes with it. The shim's own decision
(``core.states()``) is reported next to the probe's, and a disagreement fails
the check: a probe that fails without a patch the shim left out means the shim
would let the bug through.

Run it with the flags the server runs with: ``python -O -m kimi_hotfix check``
for optimized containers (kv_spec_merge depends on -O).
"""

from __future__ import annotations

import contextlib
import importlib
import os
import re
import sys

# patch name -> probe module under kimi_hotfix.probes. kv_grouping.preflight()
# returns one {"patch", "probe", "ok", "detail"} dict; recoverssm.preflight()
# returns one per patch (a list, or a dict keyed by patch name).
PROBES = {
    "kv_spec_merge": "kv_grouping",
    "capture_workspace": "recoverssm",
    "kda_overlong_rows": "recoverssm",
}


@contextlib.contextmanager
def stdout_to_stderr():
    """vLLM logs to stdout by default; keep stdout for the report (``--json``)."""
    try:
        sys.stdout.flush()
        fd, err = sys.stdout.fileno(), sys.stderr.fileno()
        saved = os.dup(fd)
    except (AttributeError, OSError, ValueError):  # no real fd (e.g. captured)
        saved = None
    if saved is not None:
        os.dup2(err, fd)  # C-level writes and handlers bound to sys.stdout too
    try:
        with contextlib.redirect_stdout(sys.stderr):
            yield
    finally:
        if saved is not None:
            sys.stdout.flush()
            os.dup2(saved, fd)
            os.close(saved)


def _entry_for(name, result):
    """This patch's entry in a probe's result (dict, list, or dict by patch)."""
    if isinstance(result, dict) and ("ok" in result or "patch" in result):
        entries = [result] if result.get("patch", name) == name else []
    elif isinstance(result, dict):
        entries = [result[name]] if isinstance(result.get(name), dict) else []
    elif isinstance(result, (list, tuple)):
        entries = [e for e in result if isinstance(e, dict) and e.get("patch") == name]
    else:
        raise TypeError(f"probe returned {type(result).__name__}, not a dict or a list")
    if not entries:
        raise LookupError(f"the probe returned no result for {name}")
    if len(entries) == 1:
        return entries[0]
    return {  # several probes for one patch: all must pass
        "probe": "; ".join(str(e.get("probe")) for e in entries),
        "ok": all(e.get("ok") is True for e in entries),
        "detail": [e.get("detail") for e in entries],
    }


def run_probe(name) -> dict:
    """One probe run on the current state of vLLM: {"ok", "probe", "detail"}
    or {"ok": None, "error": ...}; never raises."""
    modname = PROBES.get(name)
    if modname is None:
        return {"ok": None, "probe": None, "error": f"no probe is defined for {name}"}
    try:
        module = importlib.import_module(f"kimi_hotfix.probes.{modname}")
        entry = _entry_for(name, module.preflight())
    except Exception as exc:
        return {"ok": None, "probe": modname, "error": f"{type(exc).__name__}: {exc}"}
    ok = entry.get("ok")
    result = {"ok": ok, "probe": entry.get("probe"), "detail": entry.get("detail")}
    if not isinstance(ok, bool):
        result.update(ok=None, error=f"probe {modname} returned ok={ok!r}, not a bool")
    return result


def _spec_label(spec):
    kind = re.sub(r"(AttentionSpec|Specs?)$", "", spec.get("type", "?"))
    label = kind
    if spec.get("cache_dtype_str") is not None:
        label += f" {spec['cache_dtype_str']}"
    if "non_causal_multi_token_decode" in spec:
        label += " cap=" + ("on" if spec["non_causal_multi_token_decode"] else "off")
    return label


def describe_grouping(result):
    """One line for a kv_grouping.grouping() result: "MLA cap=on (4) | 3x Mamba (3)"."""
    groups = result.get("groups")
    if isinstance(groups, dict):
        return f"error: {groups.get('error')}"
    parts = []
    for group in groups or []:
        inner = group.get("layer_specs")
        if inner:  # one group, one spec per layer (e.g. UniformTypeKVCacheSpecs)
            labels = [_spec_label(s) for s in inner.values()]
            kinds = ", ".join(f"{lab} ({labels.count(lab)})" for lab in dict.fromkeys(labels))
            parts.append(f"{_spec_label(group['spec'])}[{kinds}]")
        else:
            parts.append(f"{_spec_label(group['spec'])} ({len(group['layers'])})")
    collapsed = [f"{parts.count(p)}x {p}" if parts.count(p) > 1 else p for p in dict.fromkeys(parts)]
    return " | ".join(collapsed) or "no groups"


def _kv_cases():
    """Per layer set, how vLLM's planner groups it now (shown side by side)."""
    from kimi_hotfix.probes import kv_grouping as probe

    return {name: describe_grouping(probe.grouping(name)) for name in probe.LAYER_SETS}


# Optional per-case views of a patch's probe, for the side-by-side display.
# They read the probe modules' public helpers; a failure only drops the view.
CASES = {"kv_spec_merge": _kv_cases}


def run_cases(name):
    func = CASES.get(name)
    if func is None:
        return None
    try:
        return func()
    except Exception as exc:
        return {"(per-case view unavailable)": f"{type(exc).__name__}: {exc}"}


def _still_wrapped(core, patch):
    """Qualified names of ``patch.wraps`` still wrapped by the shim (after undo)."""
    module = sys.modules.get(patch.target)
    left = []
    for qualname in patch.wraps:
        obj = module
        for part in qualname.split("."):
            obj = vars(obj).get(part) if obj is not None and hasattr(obj, "__dict__") else None
        if obj is not None and core.is_wrapped(obj):
            left.append(qualname)
    return left


def _check_patch(core, name, patch, state, import_error):
    entry = {
        "name": name,
        "target": patch.target,
        "fixed_in": patch.fixed_in,
        "upstream": patch.upstream,
        "probe": None,
        "state": state,  # the shim's own decision, before the probes
        "needed": True,
        "fixes": False,
        "without": {},
        "with": {},
        "state_with": None,
        "problems": [],
        "notes": [],
    }
    if import_error:
        entry["without"] = entry["with"] = {"ok": None, "error": import_error}
        entry["problems"].append(import_error)
        return entry
    applied = state.startswith(core.APPLIED)
    try:
        core.undo(name)
        left = _still_wrapped(core, patch)
        entry["without"] = run_probe(name)
        cases_without = run_cases(name)
        if left:
            entry["without"] = {"ok": None, "error": f"undo left {', '.join(left)} wrapped"}
        entry["state_with"] = core.force(name)
        entry["with"] = run_probe(name)
        cases_with = run_cases(name)
        if cases_without is not None or cases_with is not None:
            entry["cases"] = {"without": cases_without, "with": cases_with}
    except Exception as exc:  # core's own API failing: report, do not crash
        entry["problems"].append(f"preflight machinery failed: {type(exc).__name__}: {exc}")
    finally:
        try:
            if applied:
                if not core.states().get(name, "").startswith(core.APPLIED):
                    core.force(name)
            else:
                core.reset(name, state)  # as found: e.g. "not needed: ...", not "undone"
        except Exception as exc:
            entry["problems"].append(f"could not restore the shim's state: {exc}")
    without, with_ = entry["without"], entry["with"]
    entry["probe"] = without.get("probe") or with_.get("probe")
    entry["needed"] = without.get("ok") is not True
    entry["fixes"] = with_.get("ok") is True

    problems, notes = entry["problems"], entry["notes"]
    if without.get("error"):
        problems.append(f"the probe could not run without the patch: {without['error']}")
    if with_.get("error"):
        problems.append(f"the probe could not run with the patch: {with_['error']}")
    if entry["needed"] and not without.get("error"):
        if not entry["fixes"] and not with_.get("error"):
            problems.append(
                f"the patch does not fix it (shim state with it: {entry['state_with']})"
            )
        if state.startswith(core.NOT_NEEDED):
            problems.append(
                "the probe fails without the patch but the shim's own check decided "
                f"'{state}': the shim would let the bug through"
            )
        elif state.startswith(core.DISABLED):
            problems.append(f"needed but {state} by the environment: this setup hits the bug")
        elif state.startswith(core.FAILED):
            problems.append(f"needed but the shim could not apply it: {state}")
    elif not entry["needed"]:
        if state.startswith(core.APPLIED):
            notes.append("the shim applies it although the probe passes without it")
            if not entry["fixes"] and not with_.get("error"):
                problems.append("the patch breaks what works without it")
    return entry


def _needed_under_optimize(core, results):
    """Without -O: patches that -O would make necessary (kv_spec_merge, while
    vLLM's merges guard with assert). Read from the loaded module, like the
    shim's own source check under -O."""
    out = []
    entry = next((r for r in results if r["name"] == "kv_spec_merge"), None)
    module = sys.modules.get(core.patches()["kv_spec_merge"].target) if entry else None
    if entry is None or entry["needed"] or module is None:
        return out
    try:
        from kimi_hotfix.patches import kv_spec_merge

        names = [
            cls.__name__
            for cls in kv_spec_merge.merge_classes(module)
            if kv_spec_merge.has_assert(vars(cls)["merge"].__func__)
        ]
    except Exception as exc:
        entry["notes"].append(f"could not read the merges for -O ({exc})")
        return out
    if names:
        why = f"the merges of {', '.join(names)} guard with bare asserts"
        entry["notes"].append(f"needed under python -O / PYTHONOPTIMIZE: {why}")
        out.append({"name": "kv_spec_merge", "why": why})
    return out


def _and(names):
    names = list(names)
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]


def run() -> dict:
    """Arm, import vLLM's targets, probe every patch; the report ``check`` prints."""
    from kimi_hotfix import __version__, core

    arm_error = None
    with stdout_to_stderr():
        try:
            core.arm("check")
        except Exception as exc:  # strict mode
            arm_error = f"{type(exc).__name__}: {exc}"
        import_errors = {}
        for name, patch in core.patches().items():
            try:
                importlib.import_module(patch.target)
            except Exception as exc:
                import_errors[name] = f"cannot import {patch.target}: {type(exc).__name__}: {exc}"
        chosen = core.states()
        results = [
            _check_patch(core, name, patch, chosen.get(name, ""), import_errors.get(name))
            for name, patch in core.patches().items()
        ]
        under_o = [] if sys.flags.optimize else _needed_under_optimize(core, results)
    level = sys.flags.optimize
    needed = [r["name"] for r in results if r["needed"]]
    problems = [f"{r['name']}: {p}" for r in results for p in r["problems"]]
    if arm_error:
        problems.insert(0, f"arming failed: {arm_error}")
    removable = not needed and not problems
    if problems:
        verdict = "kimi-hotfix check FAILED: " + "; ".join(problems)
    elif needed:
        verdict = (
            f"kimi-hotfix is needed here for {_and(needed)} and fixes "
            + ("it" if len(needed) == 1 else "them")
        )
    else:
        verdict = "nothing here needs kimi-hotfix: remove it"
    extra = [u["name"] for u in under_o if u["name"] not in needed]
    if extra and not problems:
        why = "; ".join(u["why"] for u in under_o)
        if needed:
            verdict += f"; under python -O it is also needed for {_and(extra)} ({why})"
        else:
            verdict = (
                "nothing here needs kimi-hotfix without -O: remove it only if no process "
                f"runs with python -O or PYTHONOPTIMIZE, which need it for {_and(extra)} ({why})"
            )
    return {
        "kimi_hotfix": __version__,
        "vllm": core.vllm_version(),
        "python": {
            "executable": sys.executable,
            "version": sys.version.split()[0],
            "optimize": level,
            "optimize_flag": "-" + "O" * level if level else "",
            "PYTHONOPTIMIZE": os.environ.get("PYTHONOPTIMIZE"),
        },
        "armed_by": core.armed_by(),
        "patches": results,
        "needed": needed,
        "needed_under_O": under_o,
        "removable": removable,
        "problems": problems,
        "verdict": verdict,
        "exit_status": 1 if problems else 0,
    }

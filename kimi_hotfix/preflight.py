"""The preflight behind ``python -m kimi_hotfix check``: imports the installed vLLM.

For each patch it runs the patch's own probe (``Patch.probe``) on the real vLLM
code twice, with the patch toggled off and toggled on (``core.toggled``, which
puts back exactly what the shim had installed). A patch is *needed* when its
probe fails without it, and *fixes* when the probe passes with it. The shim's
own decision is reported next to the probe's, and a disagreement fails the
check: a probe that fails without a patch the shim left out means the shim
would let the bug through. In a plain interpreter it also asks every patch what
it would decide under ``-O`` and names the patches that only ``-O`` needs.

Run it with the flags the server runs with: ``python -O -m kimi_hotfix check``
for optimized containers. This module names no patch.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import sys

from kimi_hotfix import base


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


def run_probe(patch) -> dict:
    """One probe run on vLLM as installed now; never raises."""
    try:
        result = patch.probe()
        if not isinstance(result, base.ProbeResult):
            raise TypeError(f"probe returned {type(result).__name__}, not a ProbeResult")
    except Exception as exc:
        result = base.ProbeResult(ok=None, error=f"{type(exc).__name__}: {exc}")
    return result.as_dict()


def _still_wrapped(core, patch) -> list:
    """Names in ``patch.wraps`` that still carry a shim marker."""
    left = []
    for qualname in patch.wraps:
        obj = sys.modules.get(patch.target)
        for part in qualname.split("."):
            obj = vars(obj).get(part) if hasattr(obj, "__dict__") else None
        if core.is_wrapped(obj):
            left.append(qualname)
    return left


def _problems(entry, state) -> None:
    without, with_, problems = entry["without"], entry["with"], entry["problems"]
    for label, result in (("without", without), ("with", with_)):
        if result.get("error"):
            problems.append(f"the probe could not run {label} the patch: {result['error']}")
    if entry["needed"] and not without.get("error"):
        if not entry["fixes"] and not with_.get("error"):
            problems.append(f"the patch does not fix it (state with it: {entry['state_with']})")
        if state.kind in (base.NOT_NEEDED, base.NOT_AFFECTED):
            problems.append(f"the probe fails without the patch but the shim decided "
                            f"'{state}': the shim would let the bug through")
        elif state.kind == base.DISABLED:
            problems.append(f"needed but {state}: this setup hits the bug")
        elif state.kind == base.FAILED:
            problems.append(f"needed but the shim could not apply it: {state}")
    elif not entry["needed"] and state.kind == base.APPLIED:
        entry["notes"].append("the shim applies it although the probe passes without it")
        if not entry["fixes"] and not with_.get("error"):
            problems.append("the patch breaks what works without it")


def check_patch(core, patch, state, import_error=None) -> dict:
    entry = {
        "name": patch.name, "target": patch.target, "upstream": patch.upstream,
        "fixed_in": patch.fixed_in, "probe": patch.probe_title,
        "kind": state.kind, "state": str(state),  # the shim's own decision
        "needed": True, "fixes": False, "affected": True,
        "without": {}, "with": {}, "state_with": None, "problems": [], "notes": [],
    }
    if import_error:
        entry["without"] = entry["with"] = {"ok": None, "error": import_error}
        entry["problems"].append(import_error)
        return entry
    try:
        with core.toggled(patch.name, False):
            left = _still_wrapped(core, patch)
            entry["without"] = run_probe(patch)
            if left:
                entry["without"] = {"ok": None, "error": f"{', '.join(left)} still wrapped"}
        with core.toggled(patch.name, True) as state_with:
            entry["state_with"] = str(state_with)
            entry["with"] = run_probe(patch)
    except Exception as exc:  # core's own machinery failing: report, do not crash
        entry["problems"].append(f"preflight machinery failed: {type(exc).__name__}: {exc}")
    without = entry["without"]
    entry["needed"] = without.get("ok") is not True
    entry["fixes"] = entry["with"].get("ok") is True
    entry["affected"] = without.get("affected", True) is not False
    _problems(entry, state)
    return entry


def _under_optimize(core, results) -> list:
    """In a plain interpreter: the patches that ``-O`` alone would make needed."""
    out = []
    for entry in results:
        patch = core.patches()[entry["name"]]
        module = sys.modules.get(patch.target)
        if entry["needed"] or module is None:
            continue
        try:
            decision = core.decide(patch, module, optimize=1)
        except Exception as exc:
            entry["notes"].append(f"could not tell what -O needs ({exc})")
            continue
        if decision.verdict == "needed":
            entry["notes"].append(f"needed under python -O / PYTHONOPTIMIZE: {decision.reason}")
            out.append({"name": entry["name"], "why": decision.reason})
    return out


def _and(names):
    names = list(names)
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]


def verdict(needed, problems, under_o) -> str:
    if problems:
        return "kimi-hotfix check FAILED: " + "; ".join(problems)
    text = (f"kimi-hotfix is needed here for {_and(needed)} and fixes "
            f"{'it' if len(needed) == 1 else 'them'}" if needed
            else "nothing here needs kimi-hotfix: remove it")
    extra = [u for u in under_o if u["name"] not in needed]
    if extra:
        names, why = _and(u["name"] for u in extra), "; ".join(u["why"] for u in extra)
        if needed:
            text += f"; under python -O it is also needed for {names} ({why})"
        else:
            text = ("nothing here needs kimi-hotfix without -O: remove it only if no process "
                    f"runs with python -O or PYTHONOPTIMIZE, which need it for {names} ({why})")
    return text


def run() -> dict:
    """Arm, import vLLM's targets, probe every patch: the report ``check`` prints."""
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
        results = [check_patch(core, patch, chosen[name], import_errors.get(name))
                   for name, patch in core.patches().items()]
        under_o = [] if sys.flags.optimize else _under_optimize(core, results)
    needed = [r["name"] for r in results if r["needed"]]
    problems = [f"{r['name']}: {p}" for r in results for p in r["problems"]]
    if arm_error:
        problems.insert(0, f"arming failed: {arm_error}")
    level = sys.flags.optimize
    return {
        "kimi_hotfix": __version__,
        "vllm": base.vllm_version(),
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
        "removable": not needed and not problems,
        "problems": problems,
        "verdict": verdict(needed, problems, under_o),
        "exit_status": 1 if problems else 0,
    }

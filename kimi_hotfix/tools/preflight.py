"""``python -m kimi_hotfix check``: the preflight report and its renderer.

Imports the installed vLLM. For each patch it runs the patch's own probe
(``Patch.probe``) on the real vLLM code twice, with the patch toggled off and
toggled on (``toggled``, which puts back exactly what the shim had
installed). A patch is *needed* here when its probe fails without it, or when
its check decides it applies (a "cannot tell" counts as needed); it *fixes* when
the probe passes with it. The shim's own decision is reported next to the
probe's, and a disagreement fails the check: a probe that fails without a patch
the shim left out means the shim would let the bug through.

Every optimize level is reported (``levels``): the probe runs at this
interpreter's level; for the other levels each patch's check decides what they
would need. ``removable`` is true only when nothing is needed at any level: one
process started with ``-O`` brings back what only ``-O`` breaks.

Run it with the flags the server runs with: ``python -O -m kimi_hotfix check``
for optimized containers. This module names no patch.

A host without a GPU (an image-build CI job): vLLM infers no device there and
every probe would fail with "Failed to infer device type". The probes need no
device (they run vLLM's Python code: the planner, the capture plan, the KDA
builder), so where vLLM infers none, ``check`` sets ``VLLM_TARGET_DEVICE=cpu``
for its own probes (``device`` in the report says so; nothing else in the
report changes). Should a probe still fail for want of a device, the check
exits 2 naming the fix, never "the patch does not fix it".

The report also says whether the shim arms in a process started like this one
(``deployment``, the view ``status`` gates on): a check passes with the shim
armed by the check itself, so where nothing else would arm it (not on
PYTHONPATH, no plugin), the check exits 3: a server started this way runs
unpatched.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import subprocess
import sys
import textwrap
from typing import Optional

from kimi_hotfix import __version__
from kimi_hotfix.runtime import versions
from kimi_hotfix.runtime.base import Kind, PatchError, State
from kimi_hotfix.runtime.patching import ProbeResult, Verdict
from kimi_hotfix.tools import about, exitcodes

LEVELS = ((0, "plain"), (1, "-O"), (2, "-OO"))
NO_DEVICE = "Failed to infer device type"  # vLLM's DeviceConfig, where no platform is found
UNSPECIFIED = "UnspecifiedPlatform"  # vllm.platforms.interface: what vLLM infers on no device


@contextlib.contextmanager
def toggled(name: str, applied: bool):
    """Within the block, patch ``name`` is applied (whatever its check says) or
    not (vLLM's own methods); afterwards the process is exactly as it was: the
    same objects installed, the same state (where the block changed nothing,
    e.g. on for a patch already applied, the state keeps what happened in it,
    such as wrapper failures). Its module must be loaded. Yields the state
    inside the block. Does not log the summary line."""
    from kimi_hotfix.runtime import core, registry, state, wrapping
    patch = registry.get(name)
    module = sys.modules.get(patch.target)
    if module is None:
        raise PatchError(f"{patch.target} is not imported")
    if state.config() is None:
        core.arm("toggle")
    saved_state, saved = state.get(name), state.records(name)
    added: list = []
    off: list = []
    try:
        if applied and not saved:
            note = patch.apply(module, core.context(name, added))
            state.put(name, State(Kind.APPLIED, "; ".join(filter(None, ["toggled on", note]))))
        elif not applied and saved:
            left = wrapping.uninstall(saved)
            off = [r for r in saved if r not in left]
            if left:
                raise PatchError(f"cannot toggle {name} off: "
                                 f"{', '.join(r.qualname for r in left)} replaced since")
            state.put(name, State(Kind.DISABLED, "toggled off"))
        yield state.get(name)
    finally:
        wrapping.uninstall(added)
        wrapping.reinstall(off)
        if added or off:
            state.put(name, saved_state, records=saved)


RERUN = "KIMI_HOTFIX_CHECK_RERUN"  # internal: marks the re-run on CPU, holds the first view


def device() -> dict:
    """What vLLM infers on this host (importing the ``vllm`` package resolves
    its platform), or, in the re-run on CPU, what the first run found."""
    inherited = os.environ.get(RERUN)
    if inherited:
        return json.loads(inherited)
    info = {"VLLM_TARGET_DEVICE": os.environ.get("VLLM_TARGET_DEVICE"), "platform": None,
            "inferred": None, "probes_on": None, "set_by_check": False, "note": None}
    try:
        with stdout_to_stderr():
            from vllm import platforms

            platform = platforms.current_platform
    except Exception as exc:  # an old or unusual vLLM: the probes tell
        info["note"] = f"cannot ask vLLM which device it infers: {type(exc).__name__}: {exc}"
        return info
    info["platform"] = f"{type(platform).__module__}.{type(platform).__qualname__}"
    if type(platform).__name__ != UNSPECIFIED:
        info["inferred"] = info["probes_on"] = getattr(platform, "device_type", None) or "?"
    return info


def rerun_on_cpu(args) -> Optional[int]:
    """Where vLLM infers no device, run this check again in a fresh interpreter
    (same flags) with ``VLLM_TARGET_DEVICE=cpu``: vLLM resolves its platform
    when its package is imported, so it cannot change in this process. Returns
    the re-run's exit status, or None where the probes can run here."""
    info = device()
    if info["inferred"] is not None or info["platform"] is None or os.environ.get(RERUN):
        return None
    info.update(probes_on="cpu", set_by_check=True, note=(
        "vLLM infers no device on this host; the probes ran on CPU (VLLM_TARGET_DEVICE=cpu, "
        "set by check for them): they run vLLM's Python code, which needs no GPU"))
    env = dict(os.environ, VLLM_TARGET_DEVICE="cpu", **{RERUN: json.dumps(info)})
    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # kimi_hotfix/
    # ``python <dir>`` works under -I too
    cmd = [sys.executable, *subprocess._args_from_interpreter_flags(), package, "check", *args]
    sys.stdout.flush()
    sys.stderr.flush()
    return subprocess.run(cmd, env=env).returncode


def no_device(entry) -> bool:
    """Whether a probe of ``entry`` failed because vLLM found no device."""
    return any(NO_DEVICE in repr(entry[side]) for side in ("without", "with"))


def device_fix() -> str:
    """The command that runs the probes on CPU: this interpreter, its flags."""
    flag = versions.optimize_flag(sys.flags.optimize)
    return " ".join(["VLLM_TARGET_DEVICE=cpu", sys.executable, *([flag] if flag else []),
                     "-m", "kimi_hotfix", "check"])


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
        if not isinstance(result, ProbeResult):
            raise TypeError(f"probe returned {type(result).__name__}, not a ProbeResult")
    except Exception as exc:
        result = ProbeResult(ok=None, error=f"{type(exc).__name__}: {exc}")
    return result.as_dict()


def _still_wrapped(patch) -> list:
    """Names in ``patch.wraps`` (qualified names in its target) still wrapped."""
    from kimi_hotfix.runtime import wrapping
    left = []
    for qualname in patch.wraps:
        obj = sys.modules.get(patch.target)
        for part in qualname.split("."):
            obj = vars(obj).get(part) if hasattr(obj, "__dict__") else None
        if wrapping.is_wrapped(obj):
            left.append(qualname)
    return left


def _problems(entry, state) -> None:
    without, with_, problems = entry["without"], entry["with"], entry["problems"]
    if entry["no_device"]:  # nothing is known about the patch: say why, claim nothing
        problems.append(f"the probe could not run: vLLM infers no device here ({NO_DEVICE})")
        return
    for label, result in (("without", without), ("with", with_)):
        if result.get("error"):
            problems.append(f"the probe could not run {label} the patch: {result['error']}")
    if state.failures:
        problems.append(f"its code failed on {state.failures} call(s) in this process "
                        f"(first: {state.first_failure})")
    if entry["failures_with"]:
        problems.append(f"its code failed during the probe: {entry['failures_with']}")
    if entry["needed"] and not without.get("error"):
        if not entry["fixes"] and not with_.get("error"):
            problems.append(f"the patch does not fix it (state with it: {entry['state_with']})")
        if state.kind in (Kind.NOT_NEEDED, Kind.NOT_AFFECTED):
            problems.append(f"the probe fails without the patch but the shim decided "
                            f"'{state}': the shim would let the bug through")
        elif state.kind == Kind.DISABLED:
            problems.append(f"needed but {state}: this setup hits the bug")
        elif state.kind == Kind.FAILED:
            problems.append(f"needed but the shim could not apply it: {state}")
    elif not entry["needed"] and state.kind == Kind.APPLIED:
        entry["notes"].append("the shim applies it although the probe passes without it")
        if not entry["fixes"] and not with_.get("error"):
            problems.append("the patch breaks what works without it")


def _decisions(core, patch, module) -> dict:
    """What the patch's check decides at each optimize level (label -> dict)."""
    from kimi_hotfix.runtime import outcome
    out = {}
    for level, label in LEVELS:
        if module is None:
            out[label] = {"verdict": Verdict.UNKNOWN.value, "reason": f"{patch.target} not imported"}
            continue
        try:
            decision = outcome.decide(patch, module, optimize=level)
            out[label] = {"verdict": decision.verdict.value, "reason": decision.reason}
        except PatchError as exc:  # its target is missing: it cannot apply (counts as needed)
            out[label] = {"verdict": Verdict.UNKNOWN.value, "reason": str(exc)}
    return out


def _applies(decision: dict) -> bool:
    return decision["verdict"] in (Verdict.NEEDED.value, Verdict.UNKNOWN.value)


def check_patch(core, patch, state, import_error=None) -> dict:
    info = about.of(patch.name)
    entry = {
        "name": patch.name, "target": patch.target, "upstream": info.upstream,
        "fixed_in": info.fixed_in, "probe": info.probe_title,
        "kind": state.kind.value, "state": str(state),  # the shim's own decision
        "failures": state.failures,
        "needed": True, "fixes": False, "affected": True,
        "without": {}, "with": {}, "state_with": None, "failures_with": None,
        "decisions": {}, "problems": [], "notes": [], "no_device": False,
    }
    if import_error:
        entry["decisions"] = _decisions(core, patch, None)
        entry["without"] = entry["with"] = {"ok": None, "error": import_error}
        entry["problems"].append(import_error)
        return entry
    toggle = getattr(patch, "toggled", None) or (lambda on: toggled(patch.name, on))
    try:
        with toggle(False):  # checks and probe see vLLM's own code
            entry["decisions"] = _decisions(core, patch, sys.modules.get(patch.target))
            left = _still_wrapped(patch)
            entry["without"] = run_probe(patch)
            if left:
                entry["without"] = {"ok": None, "error": f"{', '.join(left)} still wrapped"}
        with toggle(True) as state_with:
            entry["state_with"] = str(state_with)
            entry["with"] = run_probe(patch)
            after = core.states().get(patch.name) or core.parity_state()  # after the probe
            if after.failures:
                entry["failures_with"] = f"{after.failures} call(s), first: {after.first_failure}"
    except Exception as exc:  # core's own machinery failing: report, do not crash
        entry["problems"].append(f"preflight machinery failed: {type(exc).__name__}: {exc}")
    entry["needed"] = entry["without"].get("ok") is not True
    entry["fixes"] = entry["with"].get("ok") is True
    entry["affected"] = entry["without"].get("affected", True) is not False
    entry["no_device"] = no_device(entry)
    _problems(entry, state)
    return entry


def _levels(results) -> dict:
    """label -> {"needed": [{"name", "why"}]} for every optimize level: here the
    probe or the check; elsewhere the check (cannot tell counts as needed)."""
    here = dict(LEVELS)[min(sys.flags.optimize, 2)]
    out = {}
    for _, label in LEVELS:
        needed = []
        for entry in results:
            decision = entry["decisions"].get(label)
            if label == here and entry["needed"]:
                needed.append({"name": entry["name"], "why": "its probe fails without it"})
            elif decision and _applies(decision):
                needed.append({"name": entry["name"], "why": decision["reason"]})
        out[label] = {"needed": needed, "here": label == here}
    return out


def _and(names):
    names = list(names)
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]


def verdict(problems, levels) -> str:
    if problems:
        return "kimi-hotfix check FAILED: " + "; ".join(problems)
    here = next(label for label, level in levels.items() if level["here"])
    needed = [n["name"] for n in levels[here]["needed"]]
    elsewhere = {}
    for label, level in levels.items():
        for item in level["needed"]:
            if item["name"] not in needed:
                elsewhere.setdefault(item["name"], (label, item["why"]))
    text = (f"kimi-hotfix is needed here for {_and(needed)} and fixes "
            f"{'it' if len(needed) == 1 else 'them'}" if needed
            else "nothing needs kimi-hotfix in this interpreter")
    if elsewhere:
        parts = "; ".join(f"{name} under {'python' if label == 'plain' else label} ({why})"
                          for name, (label, why) in elsewhere.items())
        text += f"; other optimize levels need it too: {parts}: keep it while any process " \
                "may run that way"
    elif not needed:
        text = "nothing needs kimi-hotfix at any optimize level: remove it"
    return text


def outcome(results, problems, levels, deployment, found) -> tuple:
    """(exit status, verdict) of a check: 2 where a probe failed for want of a
    device (naming the fix; no claim about any patch), 1 on any other problem,
    3 where the shim is needed, on, and only the check armed it, else 0."""
    if any(r["no_device"] for r in results):
        return exitcodes.CANNOT, (
            f"kimi-hotfix check CANNOT RUN here: vLLM infers no device on this host and the "
            f"probes failed with '{NO_DEVICE}'" + (
                " even on CPU (VLLM_TARGET_DEVICE=cpu, set by check)" if found["set_by_check"]
                else f"; they need no GPU: run {device_fix()}"))
    text = verdict(problems, levels)
    if problems:
        return exitcodes.FAILED, text
    if any(lv["needed"] for lv in levels.values()) and deployment["enabled"] \
            and not deployment["active"]:  # (KIMI_HOTFIX=0: the states say disabled)
        return exitcodes.UNARMED, (
            f"{text}; BUT only this check armed the shim ({deployment['reason']}): a server "
            "started like this interpreter runs unpatched (put the kimi-hotfix directory on "
            "PYTHONPATH, or pip install it)")
    return exitcodes.OK, text


def run() -> dict:
    """Arm, import vLLM's targets, probe every patch: the report ``check`` prints."""
    from kimi_hotfix.runtime import core, registry
    from kimi_hotfix.tools import status
    arm_error = None
    with stdout_to_stderr():
        try:
            core.arm("check")
        except Exception as exc:  # strict mode
            arm_error = f"{type(exc).__name__}: {exc}"
        from kimi_hotfix.tools import parity_probe  # -O parity: core arms it; check probes it first

        probed = {parity_probe.PROBE.name: parity_probe.PROBE, **registry.patches()}
        import_errors = {}
        for name, patch in probed.items():
            try:
                importlib.import_module(patch.target)
            except Exception as exc:
                import_errors[name] = f"cannot import {patch.target}: {type(exc).__name__}: {exc}"
        chosen = {parity_probe.PROBE.name: core.parity_state(), **core.states()}
        results = [check_patch(core, patch, chosen[name], import_errors.get(name))
                   for name, patch in probed.items()]
        found = device()
    levels = _levels(results)
    problems = [f"{r['name']}: {p}" for r in results for p in r["problems"]]
    if arm_error:
        problems.insert(0, f"arming failed: {arm_error}")
    deployment = status.deployment()
    exit_status, text = outcome(results, problems, levels, deployment, found)
    level = sys.flags.optimize
    here = next(label for label, lv in levels.items() if lv["here"])
    return {
        "kimi_hotfix": __version__,
        "vllm": versions.vllm_version(),
        "vllm_distribution": versions.installed_vllm()[1],
        "python": {
            "executable": sys.executable,
            "version": sys.version.split()[0],
            "optimize": level,
            "optimize_flag": versions.optimize_flag(level),
            "PYTHONOPTIMIZE": os.environ.get("PYTHONOPTIMIZE"),
        },
        "device": found,
        "armed_by": core.armed_by(),
        "deployment": deployment,
        "patches": results,
        "needed": [n["name"] for n in levels[here]["needed"]],
        "levels": levels,
        "removable": not problems and not any(lv["needed"] for lv in levels.values()),
        "problems": problems,
        "verdict": text,
        "exit_status": exit_status,
    }


# -- the renderer -------------------------------------------------------------------


def _parts(detail):
    """A probe's detail as a few lines (the rest is in --json)."""
    parts = [p for p in (detail or "").split("; ") if p]
    return parts[:3] + [f"... {len(parts) - 3} more (see --json)"] if len(parts) > 4 else parts


def _table(rows, out, indent="      ", head=("", "without the patch", "with the patch")):
    """Rows of (key, without, with), wrapped into aligned columns."""
    rows = [head, *rows]
    kw = max(min(max(len(r[0]) for r in rows), 26), 1)
    aw = min(max(len(r[1]) for r in rows), 46)
    for key, a, b in rows:
        ka = textwrap.wrap(key, kw) or [""]
        ca = textwrap.wrap(a, aw) or [""]
        cb = textwrap.wrap(b, 46) or [""]
        for i in range(max(len(ka), len(ca), len(cb))):
            parts = [(ka[i] if i < len(ka) else "").ljust(kw), (ca[i] if i < len(ca) else "").ljust(aw)]
            line = f"{indent}{parts[0]}  {parts[1]}  {cb[i] if i < len(cb) else ''}"
            out.write(line.rstrip() + "\n")


def _side_by_side(entry, out):
    """The probe's cases and details, without and with the patch."""
    without, with_ = entry["without"], entry["with"]
    a_cases, b_cases = without.get("cases") or {}, with_.get("cases") or {}
    rows = [(key, a_cases.get(key, ""), b_cases.get(key, ""))
            for key in dict.fromkeys([*a_cases, *b_cases])]
    a, b = _parts(without.get("detail")), _parts(with_.get("detail"))
    rows += [("probe" if i == 0 else "", a[i] if i < len(a) else "", b[i] if i < len(b) else "")
             for i in range(max(len(a), len(b)))]
    if without.get("error") or with_.get("error"):
        rows.append(("probe error", without.get("error") or "", with_.get("error") or ""))
    _table(rows, out)


def _mark(result):
    if result.get("ok") is True:
        return "ok"
    if result.get("error"):
        return "ERROR"
    return "FAIL"


def print_check(report, out=None) -> None:
    out = out or sys.stdout
    w = out.write
    py = report["python"]
    opt = f"optimize {py['optimize']}" + (f" ({py['optimize_flag']})" if py["optimize"] else "")
    w(f"kimi-hotfix {report['kimi_hotfix']} check: vLLM {report['vllm']}, "
      f"python {py['version']} {opt}\n")
    if report["device"]["set_by_check"]:
        _wrapped_line(w, "device: ", report["device"]["note"])
    w("\n")
    for p in report["patches"]:
        w(f"  {p['name']}: {p['probe'] or 'probe'}\n")
        w(f"      shim decided: {p['state']}\n")
        _side_by_side(p, out)
        if p["no_device"]:
            w(f"      probe: without {_mark(p['without'])}, with {_mark(p['with'])}"
              " -> cannot tell here: vLLM infers no device (see the verdict)\n")
        else:
            w(f"      probe: without {_mark(p['without'])}, with {_mark(p['with'])}"
              f" -> {'NEEDED' if p['needed'] else 'not needed'}"
              f"{'' if p['affected'] else ' (not affected)'}"
              f"{', fixed by the patch' if p['needed'] and p['fixes'] else ''}"
              f"{', NOT fixed by the patch' if p['needed'] and not p['fixes'] else ''}\n")
        levels = "   ".join(f"{label}: {d['verdict']}" for label, d in p["decisions"].items())
        w(f"      check decides: {levels}\n")
        for problem in p["problems"]:
            w(f"      PROBLEM: {problem}\n")
        for note in p["notes"]:
            w(f"      note: {note}\n")
        w("\n")
    for label, level in report["levels"].items():
        names = ", ".join(n["name"] for n in level["needed"]) or "nothing"
        w(f"needed under {'python' if label == 'plain' else label}: {names}"
          f"{'   (this interpreter)' if level['here'] else ''}\n")
    # how the shim arms in a process started like this one (the bootstrap, vLLM's
    # plugin loader, or nothing: a launcher's sitecustomize may shadow the bootstrap)
    armed_here = (f" (armed here by: {', '.join(report['armed_by']) or 'nothing'})"
                  if report["exit_status"] == exitcodes.UNARMED else "")
    _wrapped_line(w, "deployment: ", f"{report['deployment']['reason']}{armed_here}")
    w(f"removable: {'yes' if report['removable'] else 'no'}\n")
    w(f"verdict: {report['verdict']}\n")


def _wrapped_line(w, first, text, width=110):
    lines = textwrap.wrap(text, width, initial_indent=first, subsequent_indent="  ")
    w("\n".join(lines or [first]) + "\n")

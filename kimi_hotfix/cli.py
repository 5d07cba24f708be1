"""Operator commands: ``python -m kimi_hotfix status|check [--json]``.

status  What the shim would do in THIS interpreter, without importing vLLM,
        torch or wrapt (package metadata and import specs only): the interpreter
        and its flags, the installed vLLM, the toggles, whether the
        sitecustomize bootstrap ran here, the vLLM plugin, and per patch the
        decision it would take and why.
check   The preflight (kimi_hotfix.preflight): imports the installed vLLM and runs
        each patch's probe on the real vLLM code without and with the patch.

Exit status: 0 fine; 1 (check) a needed patch does not fix its probe, or the
shim's own decision disagrees with the probe, or a probe could not run; 2 usage
errors, and ``check`` where vLLM is not installed (nothing can be checked).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from kimi_hotfix import __version__

PLUGIN_GROUP = "vllm.general_plugins"
PLUGIN_NAME = "kimi_hotfix"
ALIAS = "kimi_hotfix_sitecustomize"  # the root sitecustomize.py registers itself here

# How each patch decides, in one line (the patch modules' docstrings say more;
# they are gone under -OO, so status keeps its own short text).
HOW = {
    "kv_spec_merge": "needed if MLAAttentionSpec.merge drops the draft's "
    "non_causal_multi_token_decode (behaviour probe), or under -O if a merge in "
    "the module still guards with assert (source check)",
    "capture_workspace": "needed if CudaGraphManager._init_candidates does not "
    "consult use_kda_recoverssm (source check; by version without source)",
    "kda_overlong_rows": "needed if KimiK3KDAMetadataBuilder.build does not route "
    "rows longer than num_spec + 1 out of the speculative set (source check; by "
    "version without source)",
}
# kv_spec_merge under -O: bare asserts measured in every release up to this one.
ASSERTS_MEASURED_UP_TO = "0.33.0"
ASSERTS_PAST = "0.33.1"


# -- status -----------------------------------------------------------------


def _dist_version(name):
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(name)
    except PackageNotFoundError:
        return None
    except Exception:  # a broken dist-info must not break status
        return None


def _find_spec(name):
    import importlib.util

    try:
        return importlib.util.find_spec(name)  # top-level name: imports nothing
    except (ImportError, ValueError):
        return None


def _plugin_entry():
    """The installed ``vllm.general_plugins`` entry point named kimi_hotfix."""
    from importlib import metadata

    try:
        eps = metadata.entry_points()
        group = eps.select(group=PLUGIN_GROUP) if hasattr(eps, "select") else eps.get(PLUGIN_GROUP, ())
    except Exception:
        return None
    for ep in group:
        if ep.name == PLUGIN_NAME:
            return ep
    return None


def _python_info():
    flags = sys.flags
    level = flags.optimize
    info = {
        "executable": sys.executable,
        "version": sys.version.split()[0],
        "implementation": sys.implementation.name,
        "optimize": level,
        "optimize_flag": "-" + "O" * level if level else "",
        "PYTHONOPTIMIZE": os.environ.get("PYTHONOPTIMIZE"),
        "no_site": bool(flags.no_site),  # -S
        "isolated": bool(flags.isolated),  # -I (implies -E, -s, -P)
        "ignore_environment": bool(flags.ignore_environment),  # -E
    }
    notes = []
    if level:
        notes.append(
            f"optimize level {level}: assert statements are stripped"
            + (" and docstrings too" if level > 1 else "")
            + " (kv_spec_merge exists for that)"
        )
    if info["PYTHONOPTIMIZE"] and flags.ignore_environment:
        notes.append("PYTHONOPTIMIZE is set but ignored here (-E/-I)")
    if flags.no_site:
        notes.append(
            "-S: site.py does not run, so no sitecustomize runs at all: the PYTHONPATH "
            "shim cannot load in this interpreter (site-packages is not on sys.path "
            "either; the vLLM plugin can arm it only if vLLM is importable and loads "
            "its plugins)"
        )
    if flags.isolated or flags.ignore_environment:
        which = "-I" if flags.isolated else "-E"
        notes.append(
            f"{which}: PYTHON* variables are ignored, PYTHONPATH included, so the shim "
            "directory is not on sys.path and its sitecustomize cannot load; only the "
            "pip-installed vLLM plugin can arm it (KIMI_HOTFIX_* variables are still read)"
        )
    info["notes"] = notes
    return info


def _shim_info(python):
    site = sys.modules.get(ALIAS)
    pythonpath = [] if python["ignore_environment"] else [
        p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p
    ]
    shim_dirs = [
        os.path.abspath(p)
        for p in pythonpath
        if os.path.isfile(os.path.join(p, "sitecustomize.py"))
        and os.path.isdir(os.path.join(p, "kimi_hotfix"))
    ]
    other = sys.modules.get("sitecustomize")
    other_file = getattr(other, "__file__", None) if other is not None else None
    info = {
        "sitecustomize_loaded": site is not None,
        "loaded_from": getattr(site, "LOADED_FROM", None),
        "chained": list(getattr(site, "CHAINED", []) or []),
        "pythonpath_shim_dirs": shim_dirs,
        "sitecustomize_module": other_file,  # the module site.py imported last
    }
    if site is not None:
        why = f"loaded by this interpreter from {info['loaded_from']}"
    elif python["no_site"]:
        why = "not loaded: -S (no sitecustomize runs)"
    elif python["isolated"] or python["ignore_environment"]:
        why = "not loaded: PYTHONPATH is ignored (-I/-E)"
    elif shim_dirs:
        why = f"not loaded although {shim_dirs[0]} is on PYTHONPATH"
        if other_file:
            why += f" (another sitecustomize ran first: {other_file})"
    else:
        why = "not loaded: the kimi-hotfix directory is not on PYTHONPATH"
    info["why"] = why
    return info


def _plugin_info():
    ep = _plugin_entry()
    allowed = os.environ.get("VLLM_PLUGINS")
    info = {
        "installed": ep is not None,
        "group": PLUGIN_GROUP,
        "name": PLUGIN_NAME,
        "value": getattr(ep, "value", None),
        "VLLM_PLUGINS": allowed,
    }
    # vLLM loads every plugin when VLLM_PLUGINS is unset, else only those listed.
    allowed_names = None if allowed is None else allowed.split(",")
    info["loads"] = ep is not None and (allowed_names is None or PLUGIN_NAME in allowed_names)
    if ep is None:
        info["why"] = "not installed (pip install the package to get it)"
    elif not info["loads"]:
        info["why"] = f"installed, but VLLM_PLUGINS={allowed!r} does not list {PLUGIN_NAME}"
    else:
        info["why"] = "installed: vLLM arms the shim in every process it starts"
    return info


def _expectation(patch, vllm_version, optimize):
    """A guess from the version string; the shim decides from the code."""
    from kimi_hotfix import core

    if vllm_version is None:
        return None, "vLLM not installed: nothing to patch"
    parsed = core.parse_version(vllm_version)
    dev = " (dev build: the code decides, not the version)" if parsed and parsed[3] else ""
    if patch.name == "kv_spec_merge" and optimize:
        if core.version_at_least(vllm_version, ASSERTS_PAST):
            return None, (
                f"under -O: unknown past {ASSERTS_MEASURED_UP_TO}, the source check "
                "decides (needed while any merge guards with assert)"
            )
        return True, (
            f"needed under -O: the KV-cache spec merges guard with bare asserts in "
            f"every release up to {ASSERTS_MEASURED_UP_TO}" + dev
        )
    fixed = core.version_at_least(vllm_version, patch.fixed_in)
    text = (
        f"{'not needed' if fixed else 'needed'}: vLLM {vllm_version} "
        f"{'>=' if fixed else '<'} {patch.fixed_in}" + dev
    )
    if patch.name == "kv_spec_merge":
        text += f"; under -O it is needed on every release up to {ASSERTS_MEASURED_UP_TO}"
    return (not fixed), text


def status_report() -> dict:
    """Everything ``status`` prints. Imports no vLLM, torch or wrapt."""
    from kimi_hotfix import config, core

    python = _python_info()
    vllm_version = _dist_version("vllm")
    wrapt_spec = _find_spec("wrapt")
    names = core.patch_names()
    cfg = config.parse(names)
    toggles = {
        "enabled": cfg.enabled,
        "disabled": sorted(cfg.disabled),
        "forced": sorted(cfg.forced),
        "strict": cfg.strict,
        "log_level": cfg.log_level,
        "set": dict(cfg.raw),
        "warnings": list(cfg.warnings),
    }
    shim = _shim_info(python)
    plugin = _plugin_info()
    patches = []
    for name, patch in core.patches().items():
        if not cfg.enabled:
            decision = f"disabled (KIMI_HOTFIX={os.environ.get('KIMI_HOTFIX')})"
        elif name in cfg.disabled:
            decision = "disabled (KIMI_HOTFIX_DISABLE)"
        elif name in cfg.forced:
            decision = f"forced (KIMI_HOTFIX_FORCE): applied when vLLM imports {patch.target}"
        else:
            how = getattr(patch, "decides", None) or HOW.get(name) or (
                f"its check reads the loaded module; by version (< {patch.fixed_in}) "
                "when the source is unavailable"
            )
            decision = f"decided when vLLM imports {patch.target}: {how}"
        needed, why = _expectation(patch, vllm_version, python["optimize"])
        patches.append(
            {
                "name": name,
                "target": patch.target,
                "wraps": list(patch.wraps),
                "upstream": patch.upstream,
                "fixed_in": patch.fixed_in,
                "summary": patch.summary,
                "decision": decision,
                "expected_needed": needed,  # an expectation from the version only
                "expectation": why,
            }
        )
    via = (["sitecustomize"] if shim["sitecustomize_loaded"] else []) + (
        ["vLLM plugin"] if plugin["loads"] else []
    )
    if not cfg.enabled:
        active = "OFF: KIMI_HOTFIX turns the shim off"
    elif not via:
        active = f"INACTIVE: sitecustomize {shim['why']}; no vLLM plugin that loads"
    elif wrapt_spec is None:
        active = "INACTIVE: wrapt is not installed (pip install wrapt, or use the bundle)"
    elif vllm_version is None:
        active = f"loaded (via {' and '.join(via)}), idle: vLLM is not installed here"
    else:
        active = f"arms when vLLM is imported (via {' and '.join(via)})"
    return {
        "kimi_hotfix": {
            "version": __version__,
            "path": os.path.dirname(os.path.abspath(__file__)),
        },
        "active": active,
        "python": python,
        "vllm": {"installed": vllm_version is not None, "version": vllm_version},
        "wrapt": {
            "installed": wrapt_spec is not None,
            "version": _dist_version("wrapt") if wrapt_spec is not None else None,
        },
        "toggles": toggles,
        "shim": shim,
        "plugin": plugin,
        "patches": patches,
    }


def _onoff(value):
    return "yes" if value else "no"


def print_status(report, out=None):
    out = out or sys.stdout
    w = out.write
    py = report["python"]
    opt = f"optimize {py['optimize']}" + (f" ({py['optimize_flag']})" if py["optimize"] else "")
    popt = py["PYTHONOPTIMIZE"]
    w(f"kimi-hotfix {report['kimi_hotfix']['version']} status ({report['kimi_hotfix']['path']})\n")
    w(f"  active     {report['active']}\n")
    w(f"  python     {py['version']} {py['executable']}, {opt}, "
      f"PYTHONOPTIMIZE={popt if popt is not None else 'unset'}\n")
    w(f"  flags      -S {_onoff(py['no_site'])}   -I {_onoff(py['isolated'])}   "
      f"-E {_onoff(py['ignore_environment'])}\n")
    for note in py["notes"]:
        _wrapped(w, "  note       ", note, " " * 13)
    v = report["vllm"]
    missing = "not found" + (" (-S: site-packages is not on sys.path)" if py["no_site"] else "")
    w(f"  vllm       {v['version'] + ' (package metadata; not imported)' if v['installed'] else missing}\n")
    wr = report["wrapt"]
    no_wrapt = "NOT found: the shim cannot wrap anything" + (" (-S)" if py["no_site"] else "")
    w(f"  wrapt      {(wr['version'] or 'installed') if wr['installed'] else no_wrapt}\n")
    shim = report["shim"]
    w(f"  shim       {shim['why']}\n")
    if shim["sitecustomize_loaded"]:
        chained = ", ".join(shim["chained"]) or "none found later on sys.path"
        w(f"  chained    {chained}\n")
    pl = report["plugin"]
    w(f"  plugin     {pl['group']}:{pl['name']} {pl['why']}\n")
    t = report["toggles"]
    w(f"  toggles    KIMI_HOTFIX={'on' if t['enabled'] else 'off'}  "
      f"disable={','.join(t['disabled']) or '-'}  force={','.join(t['forced']) or '-'}  "
      f"strict={'on' if t['strict'] else 'off'}  log={t['log_level']}\n")
    for warning in t["warnings"]:
        w(f"  WARNING    {warning}\n")
    w("  patches    here: what this interpreter does; expect: from the version string only\n")
    width = max(len(p["name"]) for p in report["patches"])
    pad = " " * (4 + width + 2)
    for p in report["patches"]:
        _wrapped(w, f"    {p['name']:<{width}}  ", p["summary"], pad)
        _wrapped(w, f"{pad}here    ", p["decision"], pad + " " * 8)
        _wrapped(w, f"{pad}expect  ", p["expectation"], pad + " " * 8)


def _wrapped(w, first, text, indent, width=110):
    import textwrap

    lines = textwrap.wrap(text, width, initial_indent=first, subsequent_indent=indent)
    w("\n".join(lines or [first]) + "\n")


# -- check ------------------------------------------------------------------


def _short(value):
    return value if isinstance(value, str) else json.dumps(value, default=str)


def _cells(detail):
    """A probe's detail as a list of (key, text) rows."""
    if detail is None:
        return []
    if isinstance(detail, dict):
        return [(str(k), _short(v)) for k, v in detail.items()]
    if isinstance(detail, (list, tuple)):
        return [("", _short(v)) for v in detail]
    parts = _short(detail).split("; ")
    if len(parts) > 4:  # the rest is in --json
        parts = parts[:3] + [f"... {len(parts) - 3} more (see --json)"]
    return [("", part) for part in parts]


def _table(rows, out, indent="      ", head=("", "without the patch", "with the patch")):
    """Rows of (key, without, with), wrapped into aligned columns."""
    import textwrap

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
    """The probe's details (and per-case results, if any) without and with."""
    without, with_ = entry["without"], entry["with"]
    rows = []
    cases = entry.get("cases") or {}
    a_cases, b_cases = cases.get("without") or {}, cases.get("with") or {}
    for key in dict.fromkeys([*a_cases, *b_cases]):
        rows.append((key, _short(a_cases.get(key, "")), _short(b_cases.get(key, ""))))
    a, b = _cells(without.get("detail")), _cells(with_.get("detail"))
    if a and b and all(k for k, _ in a + b):  # both keyed: align by key
        b_map = dict(b)
        a_map = dict(a)
        for key in dict.fromkeys([k for k, _ in a + b]):
            rows.append((key, a_map.get(key, ""), b_map.get(key, "")))
    else:
        for i in range(max(len(a), len(b))):
            ka, va = a[i] if i < len(a) else ("", "")
            kb, vb = b[i] if i < len(b) else ("", "")
            key = ka or kb or ("probe" if i == 0 else "")
            rows.append((key, f"{ka}: {va}" if ka and kb and ka != kb else va, vb))
    if without.get("error") or with_.get("error"):
        rows.append(("probe error", without.get("error") or "", with_.get("error") or ""))
    _table(rows, out)


def _mark(result):
    if result.get("ok") is True:
        return "ok"
    if result.get("error"):
        return "ERROR"
    return "FAIL"


def print_check(report, out=None):
    out = out or sys.stdout
    w = out.write
    py = report["python"]
    opt = f"optimize {py['optimize']}" + (f" ({py['optimize_flag']})" if py["optimize"] else "")
    w(f"kimi-hotfix {report['kimi_hotfix']} check: vLLM {report['vllm']}, "
      f"python {py['version']} {opt}\n\n")
    for p in report["patches"]:
        w(f"  {p['name']}: {p['probe'] or 'probe'}\n")
        w(f"      shim decided: {p['state']}\n")
        _side_by_side(p, out)
        w(f"      probe: without {_mark(p['without'])}, with {_mark(p['with'])}"
          f" -> {'NEEDED' if p['needed'] else 'not needed'}"
          f"{', fixed by the patch' if p['needed'] and p['fixes'] else ''}"
          f"{', NOT fixed by the patch' if p['needed'] and not p['fixes'] else ''}\n")
        for problem in p["problems"]:
            w(f"      PROBLEM: {problem}\n")
        for note in p["notes"]:
            w(f"      note: {note}\n")
        w("\n")
    w(f"verdict: {report['verdict']}\n")


# -- entry point ------------------------------------------------------------


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # argparse exits 2 already; keep it explicit
        self.print_usage(sys.stderr)
        self.exit(2, f"{self.prog}: error: {message}\n")


def build_parser():
    parser = _Parser(
        prog="python -m kimi_hotfix",
        description="kimi-hotfix operator commands.",
        epilog="exit status: 0 fine, 1 check failed, 2 usage error or vLLM missing (check)",
    )
    parser.add_argument("--version", action="version", version=f"kimi-hotfix {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="{status,check}")
    sub.required = True
    st = sub.add_parser(
        "status", help="what the shim does in this interpreter (does not import vLLM)"
    )
    st.add_argument("--json", action="store_true", help="print one JSON object")
    ck = sub.add_parser(
        "check",
        help="preflight: run each patch's probe on the installed vLLM without and with it",
    )
    ck.add_argument("--json", action="store_true", help="print one JSON object")
    return parser


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return _run(args)
    except BrokenPipeError:  # ``... | head``: stop quietly, as other tools do
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 1


def _run(args) -> int:
    if args.command == "status":
        report = status_report()
        if args.json:
            print(json.dumps(report, indent=1, default=str))
        else:
            print_status(report)
        return 0
    if _find_spec("vllm") is None:
        # Not a check failure (1): there is nothing to check with this interpreter.
        message = (
            f"kimi-hotfix check: vLLM is not installed for {sys.executable}; "
            "nothing to check (run the check with the interpreter of the vLLM image)"
        )
        if args.json:
            print(json.dumps({"error": message, "vllm": None, "patches": [], "removable": None}))
        print(message, file=sys.stderr)
        return 2
    from kimi_hotfix import preflight

    report = preflight.run()
    if args.json:
        print(json.dumps(report, indent=1, default=str))
    else:
        print_check(report)
    return report["exit_status"]

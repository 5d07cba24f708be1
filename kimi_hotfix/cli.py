"""Operator commands: ``python -m kimi_hotfix status|check [--json]``.

status  What the shim would do in THIS interpreter, without importing vLLM,
        torch or wrapt (kimi_hotfix.status).
check   The preflight (kimi_hotfix.preflight): imports the installed vLLM and runs
        each patch's probe on the real vLLM code without and with the patch.
audit   A static scan of the installed vLLM's source for code that steers by
        AssertionError, classified from a reviewed table (kimi_hotfix.audit).

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

# -- check ------------------------------------------------------------------


def _parts(detail):
    """A probe's detail as a few lines (the rest is in --json)."""
    parts = [p for p in (detail or "").split("; ") if p]
    return parts[:3] + [f"... {len(parts) - 3} more (see --json)"] if len(parts) > 4 else parts


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
          f"{'' if p['affected'] else ' (not affected)'}"
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
    sub = parser.add_subparsers(dest="command", metavar="{status,check,audit}")
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
    from kimi_hotfix import audit  # audit: a static scan of vLLM's source (stdlib only)

    audit.add_parser(sub)
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
    from kimi_hotfix import status

    if args.command == "audit":
        from kimi_hotfix import audit

        return audit.main(args)
    if args.command == "status":
        report = status.status_report()
        if args.json:
            print(json.dumps(report, indent=1, default=str))
        else:
            status.print_status(report)
        return 0
    if status._find_spec("vllm") is None:
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

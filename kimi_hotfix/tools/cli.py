"""Operator commands: ``python -m kimi_hotfix status|check [--json]``.

status  What the shim would do in THIS interpreter, without importing vLLM,
        torch or wrapt (kimi_hotfix.tools.status: the report and its renderer).
check   The preflight (kimi_hotfix.tools.preflight: the report and its renderer):
        imports the installed vLLM and runs each patch's probe on the real vLLM
        code without and with the patch.
audit   A static scan of the installed vLLM's source for code that steers by
        AssertionError, classified from a reviewed table (kimi_hotfix.tools.audit).

Exit status: ``EXIT_CODES`` below, the one table that ``--help`` prints and
the README's exit-code table is generated from (kimi_hotfix.tools.docs).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from kimi_hotfix import __version__
from kimi_hotfix.runtime import versions
from kimi_hotfix.tools.exitcodes import (  # noqa: F401
    ANY,
    CANNOT,
    COMMANDS,
    EXIT_CODES,
    FAILED,
    OK,
    PIPE,
    UNARMED,
    exit_help,
)

# -- entry point ------------------------------------------------------------


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # argparse exits 2 already; keep it explicit
        self.print_usage(sys.stderr)
        self.exit(CANNOT, f"{self.prog}: error: {message}\n")


def build_parser():
    parser = _Parser(
        prog="python -m kimi_hotfix",
        description="kimi-hotfix operator commands.",
        epilog=exit_help(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"kimi-hotfix {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="{status,check,audit}")
    sub.required = True
    raw = argparse.RawDescriptionHelpFormatter
    st = sub.add_parser(
        "status", help="what the shim does in this interpreter (does not import vLLM)",
        epilog=exit_help(("status",)), formatter_class=raw,
    )
    st.add_argument("--json", action="store_true", help="print one JSON object")
    ck = sub.add_parser(
        "check",
        help="preflight: run each patch's probe on the installed vLLM without and with it",
        epilog=exit_help(("check",)), formatter_class=raw,
    )
    ck.add_argument("--json", action="store_true", help="print one JSON object")
    from kimi_hotfix.tools import audit  # audit: a static scan of vLLM's source (stdlib only)

    au = audit.add_parser(sub)
    au.epilog, au.formatter_class = exit_help(("audit",)), raw
    return parser


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return _run(args)
    except BrokenPipeError:  # ``... | head``: stop quietly, as other tools do
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return PIPE


def _run(args) -> int:
    from kimi_hotfix.tools import status
    if args.command == "audit":
        from kimi_hotfix.tools import audit
        return audit.main(args)
    if args.command == "status":
        report = status.status_report()
        if args.json:
            print(json.dumps(report, indent=1, default=str))
        else:
            status.print_status(report)
        if report["broken"]:
            return FAILED
        return OK if report["active"] is True else UNARMED
    if versions.find_spec("vllm") is None:
        # Not a check failure (1): there is nothing to check with this interpreter.
        message = (
            f"kimi-hotfix check: vLLM is not installed for {sys.executable}; "
            "nothing to check (run the check with the interpreter of the vLLM image)"
        )
        if args.json:
            print(json.dumps({"error": message, "vllm": None, "patches": [], "removable": None}))
        print(message, file=sys.stderr)
        return CANNOT
    from kimi_hotfix.tools import preflight
    rerun = preflight.rerun_on_cpu(["--json"] if args.json else [])
    if rerun is not None:  # vLLM infers no device here: the probes ran on CPU, in a child
        return rerun
    report = preflight.run()
    if args.json:
        print(json.dumps(report, indent=1, default=str))
    else:
        preflight.print_check(report)
    return report["exit_status"]

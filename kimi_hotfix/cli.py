"""Operator commands: ``python -m kimi_hotfix status|check [--json]``.

status  What the shim would do in THIS interpreter, without importing vLLM,
        torch or wrapt (kimi_hotfix.status: the report and its renderer).
check   The preflight (kimi_hotfix.preflight: the report and its renderer):
        imports the installed vLLM and runs each patch's probe on the real vLLM
        code without and with the patch.
audit   A static scan of the installed vLLM's source for code that steers by
        AssertionError, classified from a reviewed table (kimi_hotfix.audit).

Exit status: ``EXIT_CODES`` below, the one table that ``--help`` prints and
the README's exit-code table is generated from (kimi_hotfix.docs).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from kimi_hotfix import __version__, versions

# -- exit status --------------------------------------------------------------

OK, FAILED, CANNOT, UNARMED, PIPE = 0, 1, 2, 3, 141
# code -> what it means for each command ("" where the command never exits so)
EXIT_CODES = (
    (OK, {"status": "arms when vLLM is imported",
          "check": "fine, and the shim arms here (or nothing needs it)",
          "audit": "all reviewed"}),
    (FAILED, {"status": "the shim's own files cannot load (`BROKEN` lines, `\"broken\"`)",
              "check": "a patch does not fix or disagrees with its probe, or a probe could "
                       "not run",
              "audit": "some not reviewed"}),
    (CANNOT, {"status": "usage",
              "check": "usage; no vLLM; no device, not even CPU (it says what to run)",
              "audit": "usage; no vLLM"}),
    (UNARMED, {"status": "would not arm (`\"active\": false`): off, not on `PYTHONPATH` "
                         "nor a plugin, no wrapt, no vLLM",
               "check": "only `check` armed the shim: a server started this way runs unpatched",
               "audit": ""}),
)
COMMANDS = ("status", "check", "audit")


# every command: (code, when)
ANY = ((PIPE, "stdout closed early (`... | head`)"), (FAILED, "a crash (a traceback)"))


def exit_help(commands=COMMANDS) -> str:
    """The exit codes as ``--help`` prints them: per code, what it means for
    each of ``commands``."""
    import textwrap

    lines = ["exit status:"]
    for code, meanings in EXIT_CODES:
        for command in commands:
            if meanings[command]:
                lines += textwrap.wrap(meanings[command].replace("`", ""), 78,
                                       initial_indent=f"  {code:<4}{command:<7}",
                                       subsequent_indent=" " * 13)
    lines += [f"  {code:<4}{'any':<7}{when.replace('`', '')}" for code, when in ANY]
    return "\n".join(lines)


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
    from kimi_hotfix import audit  # audit: a static scan of vLLM's source (stdlib only)

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
    from kimi_hotfix import preflight

    rerun = preflight.rerun_on_cpu(["--json"] if args.json else [])
    if rerun is not None:  # vLLM infers no device here: the probes ran on CPU, in a child
        return rerun
    report = preflight.run()
    if args.json:
        print(json.dumps(report, indent=1, default=str))
    else:
        preflight.print_check(report)
    return report["exit_status"]

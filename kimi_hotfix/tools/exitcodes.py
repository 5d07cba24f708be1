"""The exit codes of ``python -m kimi_hotfix``: one table, what ``--help``
prints (kimi_hotfix.tools.cli), what ``check`` returns (kimi_hotfix.tools.preflight) and
what docs/operations.md shows (kimi_hotfix.tools.docs). Stdlib only."""

from __future__ import annotations

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

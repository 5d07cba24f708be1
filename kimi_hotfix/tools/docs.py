"""The generated tables of README.md and docs/troubleshooting.md: what the shim
fixes (from the patches' metadata, -O parity's first), every line it can log (from
kimi_hotfix.runtime.messages: docs/troubleshooting.md), the states, and the exit codes
of the commands (from kimi_hotfix.tools.exitcodes, which ``--help`` prints too).

``scripts/docs`` writes them between the pages' markers; a unit test fails
when a page differs from ``render(its text)``. Imports no vLLM.
"""

from __future__ import annotations

import re

from kimi_hotfix import __version__
from kimi_hotfix.runtime import messages, registry
from kimi_hotfix.runtime.base import Kind
from kimi_hotfix.tools import about, exitcodes

STATES = {
    Kind.PENDING: "armed; this process has not imported the patch's module (yet)",
    Kind.APPLIED: "patched here; `(...)` says how (e.g. `applied to be safe`, `forced`); "
                  "`its code failed on N calls`: vLLM's own code ran on those calls",
    Kind.NOT_NEEDED: "this vLLM behaves right (fixed upstream): nothing patched",
    Kind.NOT_AFFECTED: "the code path does not exist in this vLLM: nothing to fix",
    Kind.DISABLED: "switched off: `KIMI_HOTFIX=0`, `KIMI_HOTFIX_DISABLE`, or `undo()`",
    Kind.FAILED: "should apply but could not (the reason follows); vLLM runs unpatched",
    Kind.NOT_LOADED: "the process ended without importing the module: normal for processes "
                     "that do not run that code",
}


def patch_table() -> str:
    rows = ["| what you see | patch | what it changes | upstream | fixed in |",
            "|---|---|---|---|---|"]
    from kimi_hotfix.tools import parity_probe  # -O parity's metadata, next to the patches'

    for name in (parity_probe.PROBE.name, *registry.names()):
        info = about.of(name)
        for i, symptoms in enumerate(info.symptom_rows):
            seen = "<br>".join(f"`{s}`" if s.startswith(("ValueError", "AttributeError"))
                               else s for s in symptoms)
            rest = (f"{info.summary} | {info.upstream} | {info.fixed_in_text}" if i == 0
                    else "(as above) | | ")  # a patch's second symptom row
            rows.append(f"| {seen} | `{name}` | {rest} |")
    return "\n".join(rows) + "\n"


def log_table() -> str:
    rows = ["| you see | meaning | do |", "|---|---|---|"]
    for message in messages.CATALOG:
        shown = message.shown.replace("0.1.0", __version__).replace("|", "\\|")
        rows.append(f"| `{shown}` | {message.meaning} | {message.do} |")
    return "\n".join(rows) + "\n"


def state_table() -> str:
    rows = ["| state in the line | meaning |", "|---|---|"]
    rows += [f"| `{kind.value.replace('_', ' ')}` | {STATES[kind]} |" for kind in Kind]
    return "\n".join(rows) + "\n"


def exit_table() -> str:
    rows = ["| exit | " + " | ".join(f"`{c}`" for c in exitcodes.COMMANDS) + " |",
            "|---" * (len(exitcodes.COMMANDS) + 1) + "|"]
    for code, meanings in exitcodes.EXIT_CODES:
        cells = [(meanings[c] or "").replace("|", "\\|") for c in exitcodes.COMMANDS]
        rows.append(f"| {code} | " + " | ".join(cells) + " |")
    rows.append("")
    rows.append("Any command: " + "; ".join(f"{code} {when}" for code, when in exitcodes.ANY) + ".")
    return "\n".join(rows) + "\n"


TABLES = {"patch-table": patch_table, "log-table": log_table, "state-table": state_table,
          "exit-table": exit_table}
PAGES = {"README.md": ("patch-table", "state-table", "exit-table"),
         "docs/troubleshooting.md": ("log-table",)}  # where each table lives


def render(text: str) -> str:
    """``text`` (a page of ``PAGES``) with every generated table in it brought up to date."""
    for marker, make in TABLES.items():
        text = re.sub(rf"(<!-- {marker} -->\n).*?(<!-- /{marker} -->)",
                      lambda m, make=make: m.group(1) + make() + m.group(2), text, flags=re.S)
    return text

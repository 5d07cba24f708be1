"""Every line the shim logs, in one catalog, and its one log handler.

The package logs only through ``emit(MESSAGE, *args)`` (a unit test scans the
code for any other logging call), so this catalog is complete: the table of
docs/troubleshooting.md is generated from it (kimi_hotfix.tools.docs) and lists every
line an operator can see, what it means and what to do. The bootstrap
(sitecustomize.py) cannot import the package when the package is broken; it
carries the text of ``INACTIVE`` itself, and a test checks the two agree.

Lines go to stderr through the ``kimi_hotfix`` logger, with the process id
(``kimi-hotfix[PID]``), which matches vLLM's ``(EngineCore pid=PID)`` prefix.
"""

from __future__ import annotations

import logging
import sys
from dataclasses import dataclass

log = logging.getLogger("kimi_hotfix")
FORMAT = "%(asctime)s kimi-hotfix[%(process)d] %(levelname)s %(message)s"


@dataclass(frozen=True)
class Message:
    level: int
    text: str  # %-style template
    shown: str  # the line as the README shows it, <placeholders> for the arguments
    meaning: str
    do: str


SUMMARY = Message(
    logging.INFO, "%s",
    "kimi-hotfix 0.1.0 (vllm <version>, python -O, -O parity: <mode>): <patch>: <state> | "
    "<patch>: <state> | ...",
    "every patch's state in this process (pid in the prefix), logged once vLLM is imported "
    "and again on each change; fork children log it at start. Under -O, the -O parity in "
    "force: package (every vLLM module plain), late (armed after vLLM's modules ran: given "
    "plain code in place), partial, off, failed",
    "expect it from every vLLM process (states below)")
INACTIVE = Message(
    logging.WARNING, "kimi-hotfix inactive: cannot load kimi_hotfix.runtime.core (%s); vLLM runs unpatched",
    "kimi-hotfix inactive: cannot load kimi_hotfix.runtime.core (<error>); vLLM runs unpatched",
    "the shim's own files are broken or incomplete in this image",
    "reinstall or remount the shim; run `status`")
WRAPT_MISSING = Message(
    logging.WARNING,
    "wrapt is not installed: kimi-hotfix is inactive (pip install wrapt, or use the drop-in bundle)",
    "wrapt is not installed: kimi-hotfix is inactive (...)",
    "the image has no wrapt; every patch reads `failed: wrapt is not installed`",
    "use the bundle (private wrapt) or `pip install wrapt`")
ARMING_FAILED = Message(
    logging.WARNING, "kimi-hotfix: arming failed (%s); vLLM runs unpatched",
    "kimi-hotfix: arming failed (<error>); vLLM runs unpatched",
    "the shim could not register its hooks; every pending patch reads `failed`",
    "report it with the traceback that follows the line")
LOAD_FAILED = Message(
    logging.WARNING, "kimi-hotfix: %s: %s; vLLM unchanged",
    "kimi-hotfix: <patch>: cannot load kimi_hotfix.patches.<patch> (<error>); vLLM unchanged",
    "this patch's file (or one it imports) is missing or broken; it reads `failed`, "
    "the others work",
    "reinstall or remount the shim; `status` names the file")
HOOK_FAILED = Message(
    logging.WARNING, "kimi-hotfix: %s: its import hook failed (%s); vLLM unchanged",
    "kimi-hotfix: <patch>: its import hook failed (<error>); vLLM unchanged",
    "the shim's own code failed while vLLM imported the target; the patch reads `failed`",
    "vLLM runs unpatched there; report it")
UNSURE_APPLIED = Message(
    logging.WARNING, "kimi-hotfix: cannot tell whether %s is needed (%s); applied it to be safe",
    "kimi-hotfix: cannot tell whether <patch> is needed (<why>); applied it to be safe",
    "the patch's check could not run (e.g. no source files); the patch is applied",
    "`check` shows whether it was needed")
UNSURE_FAILED = Message(
    logging.WARNING,
    "kimi-hotfix: cannot tell whether %s is needed (%s), and it cannot apply (%s); vLLM unchanged",
    "kimi-hotfix: cannot tell whether <patch> is needed (<why>), and it cannot apply (<why>); "
    "vLLM unchanged",
    "neither the check nor the patch works here (e.g. no vLLM source under -O); `failed`",
    "ship vLLM's .py files, or run without -O; `check` shows the risk")
APPLY_FAILED = Message(
    logging.WARNING, "kimi-hotfix: %s could not apply (%s); vLLM unchanged",
    "kimi-hotfix: <patch> could not apply (<why>); vLLM unchanged",
    "vLLM is not what the patch targets, or another patch owns the method; `failed`",
    "vLLM runs unpatched; run `check`; report it")
WRAPPER_FAILED = Message(
    logging.WARNING, "kimi-hotfix: %s wrapper failed (%s); %s",
    "kimi-hotfix: <patch> wrapper failed (<error>); <what runs instead>",
    "the patch's own code failed on a call (logged once; the state counts the calls)",
    "the line says what ran instead; report it")
PATCH_SAYS = Message(
    logging.WARNING, "kimi-hotfix: %s: %s",
    "kimi-hotfix: <patch>: <what the patch says>",
    "a patch's own remark about this process (Context.log), e.g. a case it leaves to vLLM",
    "read the remark; the patch's state line says whether it applied")
UNDO_INCOMPLETE = Message(
    logging.WARNING, "kimi-hotfix: undo of %s could not restore %s: replaced since by something else",
    "kimi-hotfix: undo of <patch> could not restore <method>: replaced since by something else",
    "another library re-wrapped the method after the shim; vLLM's own is not back",
    "restart with KIMI_HOTFIX_DISABLE for a clean rollback")
FORK_INTERRUPTED = Message(
    logging.WARNING,
    "kimi-hotfix: %s was being applied by another thread when this process forked; "
    "rolled back in this process",
    "kimi-hotfix: <patch> was being applied by another thread when this process forked; "
    "rolled back in this process",
    "a rare race; this forked process runs that patch's code unpatched (`failed`)",
    "start workers with spawn, or arm before starting threads")

PARITY_FAILED = Message(
    logging.WARNING, "kimi-hotfix: o_parity: %s; vLLM's modules run with -O's bytecode (asserts stripped)",
    "kimi-hotfix: o_parity: <error>; vLLM's modules run with -O's bytecode (asserts stripped)",
    "-O parity could not be installed: vLLM runs as under plain -O (`o_parity: failed`); "
    "the other patches are unaffected",
    "run `check`; report it with the traceback that follows")
PARITY_PARTIAL = Message(
    logging.WARNING, "kimi-hotfix: o_parity: %s",
    "kimi-hotfix: o_parity: partial: ...; kept -O's code: <module> (<why>) ...",
    "the shim armed after vLLM modules had run (a launcher's plugin arming) and some of their "
    "code could not be given plain bytecode: their asserts stay stripped (named in the line)",
    "arm the shim before vLLM is imported (the bootstrap first on PYTHONPATH); "
    "for `changed after this process started`, restart")

METRICS_FAILED = Message(
    logging.WARNING, "kimi-hotfix: metrics: %s; /metrics lacks the kimi_hotfix series",
    "kimi-hotfix: metrics: <what failed>; /metrics lacks the kimi_hotfix series",
    "the states could not reach vLLM's /metrics (logged once); the patches are unaffected",
    "read the log lines; report it with the traceback that follows")
POD_REFUSED = Message(
    logging.WARNING,
    "kimi-hotfix: metrics: KIMI_HOTFIX_POD_DIR=%s is not a private directory of this user "
    "(a link, another user's, or writable by others); using a new one",
    "kimi-hotfix: metrics: KIMI_HOTFIX_POD_DIR=<path> is not a private directory of this user "
    "(...); using a new one",
    "the pod directory named is refused: another user could read, plant or remove records there "
    "(docs/security.md)",
    "point it at a directory the server's user owns that no one else can write, or unset it")

CONFIG_FLAG = Message(
    logging.WARNING, "%s=%s is not understood; valid values: %s or %s; using %s",
    "KIMI_HOTFIX[_STRICT\\|_POD_FILES]=<value> is not understood; valid values: ...; using off ...",
    "not a valid value: KIMI_HOTFIX is off (it fails closed), KIMI_HOTFIX_STRICT off, "
    "KIMI_HOTFIX_POD_FILES off (it writes nothing)",
    "fix the variable")
CONFIG_NAMES = Message(
    logging.WARNING, "%s: unknown patch name%s %s%s ignored; valid names: %s, or *",
    "KIMI_HOTFIX_DISABLE|FORCE: unknown patch name(s) <names> ignored; valid names: ...",
    "a name in the list is not a patch; the others are used", "fix the list")
CONFIG_BOTH = Message(
    logging.WARNING, "%s both disabled and forced; KIMI_HOTFIX_DISABLE wins",
    "<patch> both disabled and forced; KIMI_HOTFIX_DISABLE wins",
    "a patch is listed in both variables", "remove it from one")
CONFIG_LEVEL = Message(
    logging.WARNING, "%s=%s is not understood; valid values: %s; using %s",
    "KIMI_HOTFIX_LOG_LEVEL|FORMAT=<value> is not understood; valid values: ...; using INFO|text",
    "the log level or format cannot be parsed", "fix the variable")

CATALOG = (SUMMARY, INACTIVE, WRAPT_MISSING, ARMING_FAILED, LOAD_FAILED, HOOK_FAILED,
           UNSURE_APPLIED, UNSURE_FAILED, APPLY_FAILED, WRAPPER_FAILED, UNDO_INCOMPLETE, FORK_INTERRUPTED,
           PATCH_SAYS, PARITY_FAILED, PARITY_PARTIAL, METRICS_FAILED, POD_REFUSED, CONFIG_FLAG, CONFIG_NAMES,
           CONFIG_BOTH, CONFIG_LEVEL)


def emit(message: Message, *args, exc_info=None, fields=None) -> None:
    """Log ``message``; ``fields``: what the JSON format adds to its object."""
    log.log(message.level, message.text, *args, exc_info=exc_info,
            extra={"kimi_hotfix": fields} if fields else None)


class _StderrHandler(logging.StreamHandler):
    """Writes to whatever sys.stderr is at emit time (vLLM decorates it with
    the process prefix in its child processes)."""

    def __init__(self):
        logging.Handler.__init__(self)

    @property
    def stream(self):
        return sys.stderr


class JsonFormatter(logging.Formatter):
    """``KIMI_HOTFIX_LOG_FORMAT=json``: one JSON object per line: time, pid,
    vLLM's role, level, message; the summary line also carries ``states``
    ({patch: state text}) and ``version``, ``vllm``, ``python``."""

    def format(self, record):
        import json

        from kimi_hotfix.runtime import identity
        out = {"time": self.formatTime(record), "logger": "kimi-hotfix", "pid": record.process,
               "role": identity.role(), "level": record.levelname, "message": record.getMessage()}
        out.update(getattr(record, "kimi_hotfix", None) or {})
        if record.exc_info:
            out["traceback"] = self.formatException(record.exc_info)
        return json.dumps(out)


def setup(level: str, log_format: str = "text") -> None:
    """One handler on the ``kimi_hotfix`` logger, not propagated to the host's."""
    handler = next((h for h in log.handlers if isinstance(h, _StderrHandler)), None)
    if handler is None:
        handler = _StderrHandler()
        log.addHandler(handler)
        log.propagate = False
    handler.setFormatter(JsonFormatter() if log_format == "json" else logging.Formatter(FORMAT))
    log.setLevel(getattr(logging, level, logging.INFO))

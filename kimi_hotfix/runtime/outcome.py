"""One patch's outcome: its decide decides, its apply wraps, all or nothing.

What a decision that cannot tell becomes (the patch applies: the safe side, with
a warning), what a forced patch and a failing apply become, and the error
strict mode raises; kimi_hotfix.runtime.core records the outcome and says it. Loaded
when vLLM first imports a target (and by ``check``).
"""

from __future__ import annotations

import sys
from typing import Optional

from kimi_hotfix.runtime import messages, wrapping
from kimi_hotfix.runtime.base import KimiHotfixError, Kind, PatchError, State
from kimi_hotfix.runtime.patching import Decision, Verdict, cannot_tell


def decide(patch, module, optimize: Optional[int] = None) -> Decision:
    """The patch's decision; a decide that raises cannot tell (never "not needed"),
    except PatchError: the patch cannot find what it patches."""
    level = sys.flags.optimize if optimize is None else optimize
    try:
        decision = patch.decide(module, level)
    except PatchError:
        raise
    except Exception as exc:
        return cannot_tell(f"its decide raised {type(exc).__name__}: {exc}")
    if not isinstance(decision, Decision):
        return cannot_tell(f"its decide returned {decision!r}")
    return decision


def decide_and_apply(name, patch, module, ctx, forced: bool, strict: bool) -> tuple:
    """(the new State, a KimiHotfixError to raise in strict mode or None): the
    patch decided and, where it applies (or is ``forced``), applied through
    ``ctx``, whose records are put back if the apply raises."""
    records = ctx.records
    try:
        decision = decide(patch, module)
    except PatchError as exc:
        messages.emit(messages.APPLY_FAILED, name, exc)
        return State(Kind.FAILED, str(exc)), (KimiHotfixError(f"{name}: {exc}") if strict else None)
    if not decision.applies and not forced:
        return State(Kind(decision.verdict.value), decision.reason), None
    unsure = decision.verdict == Verdict.UNKNOWN
    try:
        note = patch.apply(module, ctx)
    except Exception as exc:
        wrapping.uninstall(records)
        records.clear()
        why = str(exc) if isinstance(exc, PatchError) else f"{type(exc).__name__}: {exc}"
        if unsure:
            messages.emit(messages.UNSURE_FAILED, name, decision.reason, why)
            detail = f"cannot tell whether it is needed ({decision.reason}) and cannot apply ({why})"
        else:
            messages.emit(messages.APPLY_FAILED, name, why,
                          exc_info=None if isinstance(exc, PatchError) else exc)
            detail = why
        return State(Kind.FAILED, detail), (KimiHotfixError(f"{name}: {detail}") if strict else None)
    parts = []
    if unsure:
        messages.emit(messages.UNSURE_APPLIED, name, decision.reason)
        parts.append(f"cannot tell: {decision.reason}; applied to be safe")
    elif forced and not decision.applies:
        parts.append(f"forced; {State(Kind(decision.verdict.value), decision.reason)}")
    if not records and ctx.skipped:
        parts.append("already applied by another copy of the shim")
    if note:
        parts.append(note)
    error = None
    if unsure and strict:
        error = KimiHotfixError(f"{name}: cannot tell whether it is needed: {decision.reason}")
    return State(Kind.APPLIED, "; ".join(parts)), error

"""The shim's vocabulary: what state a patch is in, the errors, the marker.

Cheap to import (stdlib only; no vLLM, torch or wrapt): every process that
arms loads it, and ``status`` without importing vLLM. What a patch is and what
it decides: kimi_hotfix.runtime.patching. What each state (``Kind``) means, as the
summary line, ``status`` and ``check`` report it: kimi_hotfix.tools.docs.STATES (the
README's and docs/troubleshooting.md's table).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, replace

MARKER = "_self_kimi_hotfix_patch"  # on everything the shim installs: the owning patch's name


def is_wrapped(obj) -> bool:
    """Did a patch of the shim (any copy) install ``obj``?"""
    return isinstance(getattr(obj, MARKER, None), str)


class StrEnum(str, enum.Enum):
    """A str whose text is its value, on Python 3.9 to 3.13 alike (json, f-strings)."""

    def __str__(self) -> str:
        return str(self.value)

    __format__ = str.__format__


class Kind(StrEnum):
    PENDING = "pending"
    APPLIED = "applied"
    NOT_NEEDED = "not_needed"
    NOT_AFFECTED = "not_affected"
    DISABLED = "disabled"
    FAILED = "failed"
    NOT_LOADED = "not_loaded"


class KimiHotfixError(RuntimeError):
    """Raised only in strict mode (KIMI_HOTFIX_STRICT=1)."""


class PatchError(Exception):
    """A patch cannot apply to the installed vLLM; the message says why."""


def describe(exc: BaseException) -> str:
    """``Type: message`` for a state or a log line. A SyntaxError names its
    whole file (its own text gives the base name only, ``__init__.py``); an
    exception whose text names no file gets the last place it was raised from."""
    if isinstance(exc, SyntaxError) and exc.filename:
        return f"{type(exc).__name__}: {exc.msg} ({exc.filename}, line {exc.lineno})"
    text = f"{type(exc).__name__}: {exc}"
    tb = exc.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    if tb is not None and not isinstance(exc, ImportError):
        where = tb.tb_frame.f_code.co_filename
        if where not in text and not where.startswith("<"):
            text += f" (at {where}, line {tb.tb_lineno})"
    return text


_TEXT = {Kind.NOT_NEEDED: "not needed: upstream fixed", Kind.NOT_AFFECTED: "not affected",
         Kind.NOT_LOADED: "not loaded"}


@dataclass(frozen=True)
class State:
    """A patch's state in this process. ``failures``/``first_failure``: calls on
    which the patch's own code failed and vLLM's code ran instead. ``undone``:
    disabled by ``undo()`` (``reapply()`` may bring it back)."""

    kind: Kind
    detail: str = ""
    failures: int = 0
    first_failure: str = ""
    undone: bool = False

    def __post_init__(self):
        object.__setattr__(self, "kind", Kind(self.kind))  # ValueError for an unknown kind

    def _text(self, count: bool, line: bool = False) -> str:
        text = _TEXT.get(self.kind, self.kind.value)
        if self.detail and not (line and self.kind == Kind.NOT_LOADED):
            text += f": {self.detail}" if self.kind == Kind.FAILED else f" ({self.detail})"
        if self.failures:
            times = f" on {self.failures} call{'s' if self.failures > 1 else ''}" if count else ""
            text += f"; its code failed{times} (first: {self.first_failure}), vLLM's own code ran"
        return text

    def __str__(self) -> str:
        return self._text(count=True)

    def line_text(self) -> str:
        """The text in the summary line: no call count, so that the line changes
        (and is logged again) once when a wrapper first fails, not per call;
        ``not loaded`` without its reason (the module named in the patch's
        header was never imported: ``status`` and the JSON log say which),
        so that the last line of a process stays short."""
        return self._text(count=False, line=True)

    def with_failure(self, reason: str) -> State:
        return replace(self, failures=self.failures + 1,
                       first_failure=self.first_failure or reason)

    def as_dict(self) -> dict:
        return {"kind": self.kind.value, "text": str(self), "failures": self.failures,
                "first_failure": self.first_failure or None}

"""The shim's vocabulary: what a patch is, what it decides, what state it is in.

Cheap to import (stdlib only; no vLLM, torch or wrapt): ``status`` uses it
without importing vLLM. A patch module under ``kimi_hotfix/patches/`` defines one
``Patch`` subclass and an instance named ``PATCH``; ``kimi_hotfix.core`` runs it.

States (``Kind``), as reported by the summary line, ``status`` and ``check``:

  pending       armed; vLLM has not imported the patch's target module yet
  applied       vLLM's methods are patched in this process
  not_needed    fixed upstream: the installed vLLM already behaves right
  not_affected  the feature or code path the patch is about does not exist here
  disabled      switched off (KIMI_HOTFIX, KIMI_HOTFIX_DISABLE, or undo())
  failed        should apply but cannot; vLLM's original behaviour stays
  not_loaded    the process ended without importing the target module
"""

from __future__ import annotations

import abc
import enum
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Optional

from kimi_hotfix import versions


class _StrEnum(str, enum.Enum):
    """A str whose text is its value, on Python 3.9 to 3.13 alike (json, f-strings)."""

    def __str__(self) -> str:
        return str(self.value)

    __format__ = str.__format__


class Kind(_StrEnum):
    PENDING = "pending"
    APPLIED = "applied"
    NOT_NEEDED = "not_needed"
    NOT_AFFECTED = "not_affected"
    DISABLED = "disabled"
    FAILED = "failed"
    NOT_LOADED = "not_loaded"


class Verdict(_StrEnum):
    """What a patch's check found about the loaded vLLM."""

    NEEDED = "needed"
    NOT_NEEDED = "not_needed"  # fixed upstream
    NOT_AFFECTED = "not_affected"  # the code path does not exist
    UNKNOWN = "unknown"  # cannot tell: the shim applies, and warns


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


@dataclass(frozen=True)
class Decision:
    verdict: Verdict
    reason: str

    def __post_init__(self):
        object.__setattr__(self, "verdict", Verdict(self.verdict))

    @property
    def applies(self) -> bool:
        """The shim applies the patch: needed, or it cannot tell (the safe side)."""
        return self.verdict in (Verdict.NEEDED, Verdict.UNKNOWN)


def needed(reason: str) -> Decision:
    return Decision(Verdict.NEEDED, reason)


def fixed(reason: str) -> Decision:
    return Decision(Verdict.NOT_NEEDED, reason)


def absent(reason: str) -> Decision:
    return Decision(Verdict.NOT_AFFECTED, reason)


def cannot_tell(reason: str) -> Decision:
    return Decision(Verdict.UNKNOWN, reason)


@dataclass
class ProbeResult:
    """One run of a patch's preflight probe on the real vLLM, as installed now.

    ok: True when vLLM behaves right (the bug does not show), False when it does,
    None when the probe could not run (``error`` says why). ``affected`` False:
    the feature does not exist in this vLLM (then ``ok`` is True). ``cases``:
    one line per case, shown side by side without and with the patch."""

    ok: Optional[bool]
    detail: str = ""
    cases: dict = field(default_factory=dict)
    affected: bool = True
    error: Optional[str] = None

    def as_dict(self) -> dict:
        return {"ok": self.ok, "detail": self.detail, "cases": dict(self.cases),
                "affected": self.affected, "error": self.error}


class Context(abc.ABC):
    """What ``Patch.apply`` gets, bound to that patch (kimi_hotfix.wrapping)."""

    name: str

    @abc.abstractmethod
    def wrap(self, owner: Any, attr: str, wrapper: Optional[Callable] = None, *,
             replacement: Optional[Callable] = None) -> Any:
        """Put ``wrapper(wrapped, instance, args, kwargs)`` (a wrapt
        FunctionWrapper) around ``owner.attr``, or install ``replacement``."""

    @abc.abstractmethod
    def failed(self, exc: BaseException, instead: str) -> None:
        """For the patch's own code failing at call time: counts it, logs the
        first, says what runs ``instead``; strict mode raises."""


class Patch(abc.ABC):
    """One hotfix. Subclass it once per module under kimi_hotfix.patches."""

    name: str = ""
    target: str = ""  # the module whose import triggers the patch
    wraps: tuple = ()  # qualified names inside ``target`` it may replace ("Class.method")
    wraps_note: str = ""  # prose about ``wraps`` (e.g. "and every other merge with an assert")
    upstream: str = ""  # the upstream PR / issue
    fixed_in: str = ""  # the first vLLM release that carries the fix ("" = none yet)
    affects_from: str = ""  # the first vLLM release with the code path ("" = all)
    # error strings and symptoms an operator sees; a tuple of tuples: one table row each
    symptoms: tuple = ()
    summary: str = ""  # what the patch changes, one line
    decides: str = ""  # how it decides it is needed, one line
    probe_title: str = ""  # what the preflight probe does, one line
    # patches about -O: every release up to this one was measured to guard with assert
    asserts_measured_up_to: str = ""

    @property
    def fixed_in_text(self) -> str:
        return self.fixed_in or "not yet"

    @property
    def symptom_rows(self) -> tuple:
        """The symptoms as rows (the README's table has one row per group)."""
        if self.symptoms and isinstance(self.symptoms[0], tuple):
            return self.symptoms
        return (tuple(self.symptoms),)

    @abc.abstractmethod
    def check(self, module: Any, optimize: int) -> Decision:
        """Decide from the loaded ``module`` (code structure or behaviour, never
        the version string or text a comment could hold) whether a process
        running at ``optimize`` needs it. PatchError: the target is missing."""

    @abc.abstractmethod
    def apply(self, module: Any, ctx: Context) -> Optional[str]:
        """Patch with ``ctx.wrap``; may return a note for the state. All or
        nothing: what it wrapped before raising is put back."""

    @abc.abstractmethod
    def probe(self) -> ProbeResult:
        """Run the preflight probe on the installed vLLM (imports it)."""

    def expect(self, version: Optional[str], optimize: int) -> tuple:
        """(needed or None, text): a guess from the version string alone, for
        ``status``, which does not import vLLM. The shim decides from the code."""
        if version is None:
            return None, "vLLM not installed: nothing to patch"
        dev = " (a dev build: the code decides)" if versions.is_prerelease(version) else ""
        if self.affects_from and not versions.at_least(version, self.affects_from):
            return False, f"not affected: vLLM {version} < {self.affects_from}{dev}"
        if self.fixed_in and versions.at_least(version, self.fixed_in):
            return False, f"not needed: vLLM {version} >= {self.fixed_in}{dev}"
        return True, f"needed: vLLM {version} < {self.fixed_in or 'any fixed release'}{dev}"

    def expect_optimized(self, version: str, guarded: str) -> tuple:
        """``expect`` under -O for a patch about ``guarded``'s bare asserts."""
        measured = self.asserts_measured_up_to
        if versions.is_prerelease(version) or versions.at_least(version, versions.next_micro(measured)):
            return None, (f"under -O: unknown for vLLM {version} (measured up to {measured}); "
                          f"the source check decides (needed while {guarded} guards with assert)")
        return True, (f"needed under -O: {guarded} guards with bare asserts in every release "
                      f"up to {measured}")

    def expect_plain_unaffected(self, version: str, why: str) -> tuple:
        """``expect`` without -O for a patch that only -O needs."""
        dev = " (a dev build: the code decides)" if versions.is_prerelease(version) else ""
        return False, f"not affected without -O ({why}){dev}"

"""The patch API: what a patch is (``Patch``), what it decides (``Decision``:
``needed``, ``fixed``, ``absent``, ``cannot_tell``), what its ``apply`` gets
(``Context``) and what its probe returns (``ProbeResult``); ``Unloadable``
stands for a patch whose module cannot load (kimi_hotfix.runtime.registry).

A patch module under ``kimi_hotfix/patches/`` defines one ``Patch`` subclass
and an instance named ``PATCH``; kimi_hotfix.runtime.core runs it when vLLM imports the
patch's target, so this module loads then, not at arming. Stdlib only.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from kimi_hotfix.runtime import versions
from kimi_hotfix.runtime.base import PatchError, StrEnum, describe


class Verdict(StrEnum):
    """What a patch's check found about the loaded vLLM."""

    NEEDED = "needed"
    NOT_NEEDED = "not_needed"  # fixed upstream
    NOT_AFFECTED = "not_affected"  # the code path does not exist
    UNKNOWN = "unknown"  # cannot tell: the shim applies, and warns


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
    """What ``Patch.apply`` gets, bound to that patch (kimi_hotfix.runtime.wrapping)."""

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

    @abc.abstractmethod
    def spent(self, phase: str, seconds: float) -> None:
        """Seconds the patch's own code spent outside its settle (``first_call``:
        a recompile on the first call), counted on /metrics."""


def run_probe(patch) -> ProbeResult:
    """``run()`` of the ``probe`` module beside ``patch``'s own: the tools
    (``check``) load it; a vLLM process never does, and the patch module never
    imports it (its probe imports the patch)."""
    import importlib

    return importlib.import_module(f"{type(patch).__module__}.probe").run()


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
        """Run the preflight probe on the installed vLLM (imports it); a patch
        package's is ``run_probe(self)``."""

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


class Unloadable(Patch):
    """Stands in the registry for a patch module that cannot be loaded."""

    def __init__(self, modname: str, exc: BaseException, target: str = ""):
        self.name, self.target = modname, target
        self.module = f"{__name__.split('.')[0]}.patches.{modname}"
        self.error = describe(exc)
        self.why = f"cannot load {self.module} ({self.error})"
        self.summary = self.decides = self.probe_title = f"its module {self.module} cannot load"

    def check(self, module, optimize):
        raise PatchError(self.why)

    def apply(self, module, ctx):
        raise PatchError(self.why)

    def probe(self):
        return ProbeResult(ok=None, error=self.why)

    def expect(self, version, optimize):
        return None, self.why

"""The patch API: what a patch is (``Patch``), what it decides (``Decision``:
``needed``, ``fixed``, ``absent``, ``cannot_tell``), what its ``apply`` gets
(``Context``) and what its probe returns (``ProbeResult``); ``Unloadable``
stands for a patch whose module cannot load (kimi_hotfix.runtime.registry).

A patch module under ``kimi_hotfix/patches/`` defines one ``Patch`` subclass
and an instance named ``PATCH``; kimi_hotfix.runtime.core runs it when vLLM imports the
patch's target, so this module loads then, not at arming. Stdlib only. What only
the tools read about a patch (its upstream fix, symptoms, expectations by
release) is kimi_hotfix.tools.about's, in the patch's ``about.py``.
"""

from __future__ import annotations

import abc
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from kimi_hotfix.runtime.base import PatchError, StrEnum, describe


class Verdict(StrEnum):
    """What a patch's decide found about the loaded vLLM."""

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
    """What ``Patch.apply`` gets, bound to that patch (kimi_hotfix.runtime.wrapping):
    the one way a patch reaches the shim."""

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

    @abc.abstractmethod
    def log(self, detail: str) -> None:
        """One line in the patch's name through the shim's log
        (kimi_hotfix.runtime.messages.PATCH_SAYS: the catalog holds its form)."""


QUALNAME = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*")


def find(module: Any, qualname: str) -> tuple:
    """``(owner, attr)`` of ``qualname`` ("func" or "Class.method") in
    ``module``: each part an attribute of its owner's own ``__dict__`` (a
    method a class inherits is not its own); PatchError "<qualname> not found"
    where any part is missing."""
    *path, attr = qualname.split(".")
    owner = module
    for part in path:
        owner = getattr(owner, "__dict__", {}).get(part)
        if not isinstance(owner, type):
            raise PatchError(f"{qualname} not found")
    if attr not in getattr(owner, "__dict__", {}):
        raise PatchError(f"{qualname} not found")
    return owner, attr


class Patch(abc.ABC):
    """One hotfix: a module under kimi_hotfix.patches defines one subclass and
    an instance named ``PATCH``. Its name and target come from the table
    (kimi_hotfix.patches.PATCHES): the registry sets them. What the tools say
    about it (upstream fix, symptoms, probe) lives beside it in ``about.py``.

    A subclass must define ``wraps`` (the qualified names inside the target it
    may replace, "Class.method"), ``decide`` and ``apply``: the class refuses
    to be defined otherwise."""

    name: str = ""  # set from kimi_hotfix.patches.PATCHES
    target: str = ""  # the module whose import triggers the patch (likewise)
    wraps: tuple = ()

    def __init_subclass__(cls, internal: bool = False, **kwargs):
        super().__init_subclass__(**kwargs)
        if internal:
            return
        missing = [m for m in ("decide", "apply") if getattr(cls, m) is getattr(Patch, m)]
        if missing:
            raise TypeError(f"{cls.__qualname__} does not define {' and '.join(missing)}")
        wraps = cls.wraps
        if not isinstance(wraps, tuple) or not wraps:
            raise TypeError(f"{cls.__qualname__}.wraps must be a non-empty tuple of qualified names")
        for qualname in wraps:
            if not isinstance(qualname, str) or not QUALNAME.fullmatch(qualname):
                raise TypeError(f"{cls.__qualname__}.wraps: {qualname!r} is not a qualified name")

    @abc.abstractmethod
    def decide(self, module: Any, optimize: int) -> Decision:
        """Decide from the loaded ``module`` (code structure or behaviour, never
        the version string or text a comment could hold) whether a process
        running at ``optimize`` needs it. PatchError: the target is missing."""

    @abc.abstractmethod
    def apply(self, module: Any, ctx: Context) -> Optional[str]:
        """Patch with ``ctx.wrap``; may return a note for the state. All or
        nothing: what it wrapped before raising is put back."""

    def probe(self) -> ProbeResult:
        """The preflight probe on the installed vLLM (``check``): ``run()`` of
        the ``probe`` module beside the patch's own. The tools load it; a vLLM
        process never does, and the patch module never imports it."""
        import importlib
        import importlib.util

        package = type(self).__module__
        try:
            found = importlib.util.find_spec(f"{package}.probe")
        except (ImportError, ValueError):
            found = None
        if found is None:
            return ProbeResult(ok=None, error=f"no probe ({package}.probe does not exist)")
        return importlib.import_module(f"{package}.probe").run()


class Unloadable(Patch, internal=True):
    """Stands in the registry for a patch module that cannot be loaded."""

    def __init__(self, modname: str, exc: BaseException, target: str = ""):
        self.name, self.target = modname, target
        self.module = f"{__name__.split('.')[0]}.patches.{modname}"
        self.error = describe(exc)
        self.why = f"cannot load {self.module} ({self.error})"

    def decide(self, module, optimize):
        raise PatchError(self.why)

    def apply(self, module, ctx):
        raise PatchError(self.why)

    def probe(self):
        return ProbeResult(ok=None, error=self.why)

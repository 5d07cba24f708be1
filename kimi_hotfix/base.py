"""The shim's vocabulary: what a patch is, what it decides, what state it is in.

Cheap to import (stdlib only; no vLLM, torch or wrapt): ``status`` uses it
without importing vLLM. A patch module under ``kimi_hotfix/patches/`` defines one
``Patch`` subclass and an instance named ``PATCH``; ``kimi_hotfix.core`` runs it.

States (``State.kind``), as reported by the summary line, ``status`` and ``check``:

  pending       armed; vLLM has not imported the patch's target module yet
  applied       vLLM's methods are patched in this process
  not_needed    fixed upstream: the installed vLLM already behaves right
  not_affected  the feature or code path the patch is about does not exist here
  disabled      switched off (KIMI_HOTFIX, KIMI_HOTFIX_DISABLE, or undo())
  failed        should apply but cannot; vLLM's original behaviour stays
  not_loaded    the process ended without importing the target module
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass, field
from typing import Optional

PENDING = "pending"
APPLIED = "applied"
NOT_NEEDED = "not_needed"
NOT_AFFECTED = "not_affected"
DISABLED = "disabled"
FAILED = "failed"
NOT_LOADED = "not_loaded"
KINDS = (PENDING, APPLIED, NOT_NEEDED, NOT_AFFECTED, DISABLED, FAILED, NOT_LOADED)
UNKNOWN = "unknown"  # a Decision only: the check cannot tell (the shim applies, and warns)


class KimiHotfixError(RuntimeError):
    """Raised only in strict mode (KIMI_HOTFIX_STRICT=1)."""


class PatchError(Exception):
    """A patch cannot apply to the installed vLLM; the message says why."""


@dataclass(frozen=True)
class State:
    kind: str
    detail: str = ""

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"unknown state kind {self.kind!r}")

    def __str__(self) -> str:
        text = {NOT_NEEDED: "not needed: upstream fixed", NOT_AFFECTED: "not affected",
                NOT_LOADED: "not loaded"}.get(self.kind, self.kind)
        if not self.detail:
            return text
        return f"{text}: {self.detail}" if self.kind == FAILED else f"{text} ({self.detail})"


@dataclass(frozen=True)
class Decision:
    """What a patch's check found: ``needed``, ``not_needed`` (fixed upstream),
    ``not_affected`` (the code path does not exist) or ``unknown``."""

    verdict: str
    reason: str

    @property
    def applies(self) -> bool:
        return self.verdict in ("needed", UNKNOWN)


def needed(reason: str) -> Decision:
    return Decision("needed", reason)


def fixed(reason: str) -> Decision:
    return Decision(NOT_NEEDED, reason)


def absent(reason: str) -> Decision:
    return Decision(NOT_AFFECTED, reason)


def cannot_tell(reason: str) -> Decision:
    return Decision(UNKNOWN, reason)


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


class Patch:
    """One hotfix. Subclass it once per module under kimi_hotfix.patches."""

    name = ""
    target = ""  # the module whose import triggers the patch
    wraps: tuple = ()  # what it replaces inside ``target``
    upstream = ""  # the upstream PR / issue
    fixed_in = ""  # the first vLLM release that carries the fix ("" = none yet)
    affects_from = ""  # the first vLLM release with the code path ("" = all)
    symptoms: tuple = ()  # error strings and symptoms an operator sees
    summary = ""  # what the patch changes, one line
    decides = ""  # how it decides it is needed, one line
    probe_title = ""  # what the preflight probe does, one line

    @property
    def fixed_in_text(self) -> str:
        return self.fixed_in or "not yet"

    def check(self, module, optimize: int) -> Decision:
        """Decide from the loaded ``module`` (behaviour or source, not the
        version string) whether a process running at ``optimize`` needs it."""
        raise NotImplementedError

    def apply(self, module, wrap) -> Optional[str]:
        """Patch with ``wrap(owner, attr, wrapper)`` or ``wrap(owner, attr,
        replacement=function)``; may return a note for the state."""
        raise NotImplementedError

    def probe(self) -> ProbeResult:
        """Run the preflight probe on the installed vLLM (imports it)."""
        raise NotImplementedError

    def expect(self, version: Optional[str], optimize: int):
        """(needed or None, text): a guess from the version string alone, for
        ``status``, which does not import vLLM. The shim decides from the code."""
        if version is None:
            return None, "vLLM not installed: nothing to patch"
        dev = " (a dev build: the code decides)" if is_prerelease(version) else ""
        if self.affects_from and not version_at_least(version, self.affects_from):
            return False, f"not affected: vLLM {version} < {self.affects_from}{dev}"
        if self.fixed_in and version_at_least(version, self.fixed_in):
            return False, f"not needed: vLLM {version} >= {self.fixed_in}{dev}"
        return True, f"needed: vLLM {version} < {self.fixed_in or 'any fixed release'}{dev}"


# -- versions ------------------------------------------------------------------

_VERSION_RE = re.compile(r"^\s*v?(\d+)\.(\d+)(?:\.(\d+))?(.*)$")


def parse_version(text):
    """(major, minor, micro, is_prerelease) or None. 0.29.1.dev3+gabc is a
    pre-release of 0.29.1: newer than 0.29.0, older than 0.29.1."""
    match = _VERSION_RE.match(text or "")
    if not match:
        return None
    major, minor, micro, rest = match.groups()
    pre = bool(re.match(r"^[.\-_]?(dev|rc|a|b|alpha|beta|pre)", rest or ""))
    return int(major), int(minor), int(micro or 0), pre


def is_prerelease(version: str) -> bool:
    parsed = parse_version(version)
    return bool(parsed and parsed[3])


def version_at_least(version: str, release: str) -> bool:
    have, want = parse_version(version), parse_version(release)
    if have is None or want is None:
        return False
    if have[:3] != want[:3]:
        return have[:3] > want[:3]
    return not have[3]


def vllm_version():
    """The loaded vLLM's version, else the installed distribution's, else None."""
    version = getattr(sys.modules.get("vllm"), "__version__", None)
    if isinstance(version, str) and version:
        return version
    try:
        from importlib.metadata import version as dist_version

        return dist_version("vllm")
    except Exception:  # not installed, or a broken dist-info
        return None

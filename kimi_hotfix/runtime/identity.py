"""Who this process is, as the pod's view on /metrics tells processes apart:
vLLM's role for it, its start time and its pid namespace. Stdlib only (the
JSON log format names the role too)."""

from __future__ import annotations

import os
import re
import sys


def role() -> str:
    """vLLM's name for this process: multiprocessing's (``EngineCore``,
    ``VllmWorker-0``, ``ApiServer_1``), else the ``PREFIX::NAME`` title vLLM
    set (setproctitle), else "main"."""
    mp = sys.modules.get("multiprocessing")
    name = ""
    try:
        name = mp.current_process().name if mp is not None else ""
    except Exception:
        pass
    if name and name != "MainProcess":
        return name
    return title_role("self") or "main"


def title_role(pid) -> str:
    """NAME from the ``PREFIX::NAME`` title vLLM sets (/proc/PID/cmdline), or ""."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            title = f.read().split(b"\0", 1)[0].decode(errors="replace").strip()
    except OSError:
        return ""
    head, sep, name = title.partition("::")
    return name if sep and name and head and "/" not in title and " " not in title else ""


def start_time(pid) -> str:
    """The process's start (clock ticks after boot, /proc/PID/stat): tells a
    reused pid apart; "" where /proc cannot tell."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            found = f.read().rsplit(b")", 1)[1].split()[19].decode()
    except (OSError, IndexError, UnicodeDecodeError):
        return ""
    return found if found.isascii() and found.isdigit() else ""


def pid_ns() -> str:
    """This process's pid namespace (the inode of /proc/self/ns/pid), "" unknown."""
    try:
        found = re.fullmatch(r"pid:\[([0-9]{1,20})\]", os.readlink("/proc/self/ns/pid"), re.ASCII)
    except OSError:
        return ""
    return found.group(1) if found else ""

"""Which bytecode Python runs for a source file: Python's own rule, read by the shim.

Python's import system (``importlib``'s ``SourceLoader.get_code``, 3.9 to 3.13)
loads a module's cached bytecode, ``__pycache__/<name>.<tag>[.opt-N].pyc`` for
the optimize level N it runs at, only where its 16-byte header has this
interpreter's magic number and valid flags, and:

- a *timestamp* ``.pyc`` records the source's mtime (whole seconds) and size,
  both modulo 2**32, as they are now;
- a *checked-hash* ``.pyc`` (PEP 552) records the hash of the source's bytes,
  as they are now (not checked under ``--check-hash-based-pycs never``);
- an *unchecked-hash* ``.pyc`` is used without looking at the source at all
  (unless ``--check-hash-based-pycs always``): reproducible builds make these.

Otherwise it compiles the source (and writes a timestamp ``.pyc``, or a
checked-hash one where it replaces one, unless it may not write bytecode).
``cached`` says which case a file is in, ``load`` gives the code Python would
take from a ``.pyc`` and ``dump`` the ``.pyc`` it would write
(kimi_hotfix.runtime.parity loads vLLM's modules with the plain-Python ``.pyc`` by
this rule), and
``not_the_running_source`` says when the ``.py`` on disk cannot be the source
of the code this process runs: the bytecode Python used records another
source, or the file changed after this process started. Stdlib only.
"""

from __future__ import annotations

import importlib.util
import marshal
import os
import sys
from typing import NamedTuple, Optional

_FLAG_HASH, _FLAG_CHECKED = 1, 2


class Cached(NamedTuple):
    """A source file's ``.pyc`` at one optimize level, judged as Python would now."""

    path: str  # the .pyc's path ("" where the interpreter caches no bytecode)
    kind: str  # "absent", "invalid", "timestamp", "checked-hash", "unchecked-hash"
    used: bool  # Python would load it (True) or compile the source (False)
    same_source: Optional[bool]  # it records the source as it is now (None: absent/invalid)
    data: bytes = b""  # the whole .pyc, where used


def pyc_path(source: str, optimize: int) -> str:
    """Where Python keeps ``source``'s bytecode for ``optimize`` ("" if it keeps none)."""
    try:
        return importlib.util.cache_from_source(source, optimization="" if optimize == 0 else optimize)
    except (NotImplementedError, ValueError):  # sys.implementation.cache_tag is None
        return ""


def _check_hash_based() -> str:
    import _imp

    return getattr(_imp, "check_hash_based_pycs", "default")


def cached(source: str, optimize: int, source_bytes: Optional[bytes] = None) -> Cached:
    """What Python would do now with ``source``'s ``.pyc`` at ``optimize``
    (``source_bytes``: the source's bytes, where the caller has them)."""
    path = pyc_path(source, optimize)
    try:
        with open(path, "rb") as f:
            data = f.read()
    except (OSError, ValueError):
        return Cached(path, "absent", False, None)
    if len(data) < 16 or data[:4] != importlib.util.MAGIC_NUMBER:
        return Cached(path, "invalid", False, None)
    flags = int.from_bytes(data[4:8], "little")
    if flags & ~(_FLAG_HASH | _FLAG_CHECKED):  # as importlib: a checked bit alone is a timestamp .pyc
        return Cached(path, "invalid", False, None)
    if flags & _FLAG_HASH:
        checked = bool(flags & _FLAG_CHECKED)
        kind = "checked-hash" if checked else "unchecked-hash"
        mode = _check_hash_based()
        try:
            if source_bytes is None:
                with open(source, "rb") as f:
                    source_bytes = f.read()
            same = importlib.util.source_hash(source_bytes) == data[8:16]
        except OSError:
            same = None
        validate = mode != "never" and (checked or mode == "always")
        used = bool(same) if validate else True
        return Cached(path, kind, used, same, data if used else b"")
    try:
        info = os.stat(source)
    except OSError:
        return Cached(path, "timestamp", False, None)
    same = (int.from_bytes(data[8:12], "little") == int(info.st_mtime) & 0xFFFFFFFF
            and int.from_bytes(data[12:16], "little") == info.st_size & 0xFFFFFFFF)
    return Cached(path, "timestamp", same, same, data if same else b"")


def load(source: str, optimize: int, source_bytes: Optional[bytes] = None):
    """The code object Python would load from ``source``'s ``.pyc`` at
    ``optimize`` now, or None where it would compile the source."""
    found = cached(source, optimize, source_bytes)
    if not found.used:
        return None
    try:
        code = marshal.loads(found.data[16:])
    except (EOFError, ValueError, TypeError):
        return None
    import _imp

    _imp._fix_co_filename(code, source)  # as importlib does: the path it was found at
    return code


def dump(code, source: str, source_bytes: bytes, hashed: bool = False) -> Optional[bytes]:
    """The ``.pyc`` Python would write for ``code`` compiled from ``source``:
    a timestamp ``.pyc`` (the source's mtime and size), or a checked-hash one
    where the ``.pyc`` it replaces was; None where the source cannot be read."""
    try:
        info = os.stat(source)
    except OSError:
        return None
    if hashed:
        head = (_FLAG_HASH | _FLAG_CHECKED).to_bytes(4, "little") + importlib.util.source_hash(source_bytes)
    else:
        head = (0).to_bytes(4, "little") + (int(info.st_mtime) & 0xFFFFFFFF).to_bytes(4, "little") \
            + (info.st_size & 0xFFFFFFFF).to_bytes(4, "little")
    return importlib.util.MAGIC_NUMBER + head + marshal.dumps(code)


def process_started() -> Optional[float]:
    """When this process started (seconds since the epoch), from /proc; None unknown."""
    try:
        with open("/proc/self/stat", "rb") as f:
            ticks = int(f.read().rsplit(b")", 1)[1].split()[19])
        with open("/proc/stat", "rb") as f:
            boot = int(next(line.split()[1] for line in f if line.startswith(b"btime ")))
        return boot + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, StopIteration):
        return None


def not_the_running_source(source: str, optimize: Optional[int] = None) -> Optional[str]:
    """Why the ``.py`` on disk may not be the source of the code a module of
    this process runs (loaded by Python's own loader at ``optimize``, by
    default this interpreter's level), or None where it is:

    - the file changed after this process started: it was compiled from
      what the file held then (or from bytecode of it);
    - Python ran an unchecked-hash ``.pyc`` that records another source.

    A ``.pyc`` that Python's rule rejects (stale by mtime or size, a hash that
    does not match) was not used: Python compiled the source, so the source is
    the running code's, whatever its mtime against the ``.pyc``'s."""
    level = sys.flags.optimize if optimize is None else optimize
    try:
        info = os.stat(source)
    except OSError as exc:
        return f"{source} cannot be read ({exc.strerror or exc})"
    started = process_started()
    if started is not None and info.st_mtime > started:
        return f"{source} changed after this process started"
    found = cached(source, level)
    if found.used and found.same_source is False:
        return (f"{source} differs from the bytecode Python runs for it "
                f"({os.path.basename(found.path)}, an unchecked hash-based .pyc)")
    return None

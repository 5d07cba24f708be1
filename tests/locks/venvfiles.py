"""What a venv has installed, read from its files (stdlib only, Python 3.9+).

Used by the lock tier (tests/locks/test_locks.py) and by the serving venv's
check in the e2e tier (tests/e2e/test_serve_venv.py, which builds that venv).

The venv's own interpreter lists its distributions (``importlib.metadata``:
name, version, where its RECORD's paths start, the RECORD). Everything else
happens here: every file a RECORD lists with a hash is read and hashed, and
compared with its RECORD entry (hash and size); a file no RECORD lists is
reported too (bytecode aside). A file hard-linked into several venvs (uv links
them from its cache) is hashed once per process.
"""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import json
import os
import re
import subprocess
import threading

LIST = """
import json, sys, sysconfig
from importlib import metadata
print(json.dumps({"site": sysconfig.get_paths()["purelib"], "dists": [
    [d.metadata["Name"], d.version, str(d.locate_file("")), d.read_text("RECORD")]
    for d in metadata.distributions()]}))
"""

# Written by `uv venv` itself for Python < 3.10 (a distutils shim), by no lock.
MADE_BY_UV_VENV = {"_virtualenv.py", "_virtualenv.pth"}

_digests = {}  # (st_dev, st_ino, st_size, st_mtime_ns) -> sha256 digest (bytes)
_lock = threading.Lock()
hashed_bytes = 0  # what this process has read to hash (for the tests' own cost line)


def _sha256(path: str) -> tuple:
    """(urlsafe-b64 sha256 without padding, as RECORD writes it; size) of a file."""
    global hashed_bytes
    st = os.stat(path)
    key = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
    with _lock:
        digest = _digests.get(key)
    if digest is None:
        h = hashlib.sha256()
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
        digest = h.digest()
        with _lock:
            _digests[key] = digest
            hashed_bytes += st.st_size
    return base64.urlsafe_b64encode(digest).rstrip(b"=").decode(), st.st_size


def _check_dist(name, base, rows, contents):
    """({path: digest of the file as found}, [problems]) for one distribution's
    RECORD rows; ``contents=False``: each file's size only (no digest kept)."""
    files, problems = {}, []
    for path, recorded, size in rows:
        if not recorded:  # the RECORD itself, and bytecode an installer compiled, carry no hash
            if not (path.endswith("/RECORD") or path.endswith(".pyc")):
                problems.append(f"{name}: {path}: no hash in RECORD")
            continue
        algorithm, _, want = recorded.partition("=")
        if algorithm != "sha256":
            problems.append(f"{name}: {path}: RECORD hash is {algorithm}, not sha256")
            continue
        full = os.path.normpath(os.path.join(base, path))
        try:
            got, got_size = _sha256(full) if contents else (want, os.stat(full).st_size)
        except OSError as exc:
            problems.append(f"{name}: {path}: {type(exc).__name__}: {exc.strerror}")
            continue
        if got != want or (size and int(size) != got_size):
            problems.append(f"{name}: {path}: differs from its RECORD entry")
        files[path] = got
    return files, problems


def inspect(python, contents=True) -> dict:
    """What the venv of ``python`` holds:

    - ``dists``: {normalised name: (version, digest)}. With ``contents``, the
      digest is a sha256 over its site-packages files' actual contents (scripts
      under ../bin are checked against RECORD but left out of it: their shebang
      names the venv's path); without, over the RECORD's site-packages rows;
    - ``problems``: every RECORD entry whose file is missing or differs from it
      (its hash and size with ``contents``, its size without), every file in
      site-packages that no RECORD lists (bytecode aside);
    - ``files``: how many files were checked; ``site``: its site-packages.
    """
    proc = subprocess.run([str(python), "-I", "-c", LIST], capture_output=True, text=True, check=True,
                          env={"PATH": os.environ.get("PATH", "")})
    listing = json.loads(proc.stdout)
    dists, problems, claimed, count = {}, [], set(), 0
    for name, version, base, record in listing["dists"]:
        rows = [(row + ["", ""])[:3] for row in csv.reader(io.StringIO(record or "")) if row]
        files, found = _check_dist(name, base, rows, contents)
        problems += found
        count += len(files)
        claimed.update(os.path.normpath(os.path.join(base, path)) for path, _, _ in rows)
        own = "".join(sorted(f"{p} {d}\n" for p, d in files.items() if not p.startswith("../")))
        dists[normalise(name)] = (version, hashlib.sha256(own.encode()).hexdigest())
    site = listing["site"]
    for root, dirs, names in os.walk(site):
        dirs[:] = [d for d in dirs if d != "__pycache__"]
        for n in names:
            path = os.path.join(root, n)
            if path not in claimed and not n.endswith(".pyc"):
                rel = os.path.relpath(path, site)
                if rel not in MADE_BY_UV_VENV:
                    problems.append(f"{rel}: in site-packages, listed by no RECORD")
    return {"dists": dists, "problems": problems, "files": count, "site": site}


def normalise(name):
    return re.sub(r"[-_.]+", "-", name).lower()

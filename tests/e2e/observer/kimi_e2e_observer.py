"""Test-only vLLM plugin (tests/e2e): logs the KV-cache groups of a live server.

vLLM logs the planner's result only as a token count ("GPU KV cache size"), so
the end-to-end tier needs the groups themselves. This directory is a tiny
installed distribution (``kimi_e2e_observer-0.1.dist-info`` with a
``vllm.general_plugins`` entry point): on ``sys.path`` (PYTHONPATH, or a .pth
line in a throwaway venv) vLLM's own plugin loader calls ``register()`` in
every process it starts. ``register()`` puts a plain function (no wrapt: the
bundle runs have none) around ``vllm.v1.core.kv_cache_utils.get_kv_cache_groups``
that calls vLLM's function unchanged and prints its result, one line on stderr:

    KIMI_E2E_GROUPS {"pid": N, "groups": [{"spec": "SlidingWindowSpec", "layers": [...], ...}]}

and, once per process, how that process was started (vLLM may override the
start method it was asked for), which of kimi-hotfix's target modules the
process had imported when vLLM loaded its plugins, and whether kimi-hotfix was
armed by then (vLLM loads plugins in the order of sys.path: the shim's
directory comes before this one, so a shim armed by its own plugin entry is
armed here; ``null`` where no kimi-hotfix is loaded):

    KIMI_E2E_PROCESS {"pid": N, "ppid": M, "start": "spawn", "imported": [...], "shim_armed": true,
                      "sitecustomize": "/path/of/the/sitecustomize/module/site.py/imported"}

``start`` is read from the call stack, not from settings: a child started by
multiprocessing runs under ``multiprocessing/spawn.py`` (spawn and forkserver's
``spawn_main``/``_main``), ``popen_fork.py`` (fork) or ``forkserver.py``; the
top process has none of them (``null``).

It changes no argument, result or exception (an exception is printed as
``{"error": "AttributeError: ..."}`` and re-raised). It runs the same way with
and without kimi-hotfix, so it cannot tell them apart.
"""

import json
import os
import sys

MARK = "KIMI_E2E_GROUPS "
PROCESS_MARK = "KIMI_E2E_PROCESS "
_reported = []


def _describe(spec):
    out = {"spec": type(spec).__name__}
    for field in ("block_size", "sliding_window", "attention_chunk_size", "num_kv_heads",
                  "head_size", "page_size_bytes"):
        value = getattr(spec, field, None)
        if value is not None:
            out[field] = value if isinstance(value, (int, str)) else str(value)
    return out


def _emit(payload, mark=MARK):
    payload["pid"] = os.getpid()
    sys.stderr.write(mark + json.dumps(payload, sort_keys=True) + "\n")
    sys.stderr.flush()


# kimi-hotfix's patch targets (tests/e2e/test_served.py checks them against its registry:
# the observer imports nothing of kimi-hotfix, and runs the same way without it)
TARGETS = ("vllm.v1.kv_cache_interface", "vllm.v1.worker.gpu.cudagraph_utils",
           "vllm.models.kimi_k3.nvidia.kda_metadata", "vllm.distributed.parallel_state",
           "vllm.config.vllm")


def _shim_armed():
    state = sys.modules.get("kimi_hotfix.runtime.state")
    if state is None:
        return None
    try:
        return state.config() is not None
    except Exception:
        return None


def _report_process():
    if os.getpid() in _reported:
        return
    _reported.append(os.getpid())
    _emit({"ppid": os.getppid(), "start": _start_method(),
           "imported": [t for t in TARGETS if t in sys.modules], "shim_armed": _shim_armed(),
           "sitecustomize": getattr(sys.modules.get("sitecustomize"), "__file__", None)},
          PROCESS_MARK)


def _start_method():
    """How multiprocessing started this process, from the outermost frame of its stack."""
    frame, outermost = sys._getframe(), None
    while frame is not None:
        name = os.path.basename(frame.f_code.co_filename)
        if frame.f_code.co_filename.replace(os.sep, "/").find("/multiprocessing/") >= 0 and name in (
                "spawn.py", "popen_fork.py", "forkserver.py"):
            outermost = name
        frame = frame.f_back
    return {"spawn.py": "spawn", "popen_fork.py": "fork", "forkserver.py": "forkserver"}.get(outermost)


TARGET = "vllm.v1.core.kv_cache_utils"


def _wrap(kv_cache_utils):
    original = kv_cache_utils.get_kv_cache_groups
    if getattr(original, "_kimi_e2e_observer", False):
        return

    def get_kv_cache_groups(vllm_config, kv_cache_spec):
        layers = {name: _describe(spec) for name, spec in kv_cache_spec.items()}
        try:
            groups = original(vllm_config, kv_cache_spec)
        except BaseException as exc:
            _emit({"layers": layers, "error": f"{type(exc).__name__}: {exc}"})
            raise
        _emit({"layers": layers,
               "groups": [dict(_describe(g.kv_cache_spec), layers=list(g.layer_names))
                          for g in groups]})
        return groups

    get_kv_cache_groups._kimi_e2e_observer = True
    get_kv_cache_groups.__wrapped__ = original
    kv_cache_utils.get_kv_cache_groups = get_kv_cache_groups


class _Finder:
    """Wraps the planner when its module is imported, so the observer imports
    nothing a process would not import anyway (the shim's states depend on it)."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname != TARGET:
            return None
        sys.meta_path.remove(self)
        try:
            import importlib.util

            spec = importlib.util.find_spec(fullname)
        finally:
            sys.meta_path.insert(0, self)
        if spec is None or spec.loader is None:
            return spec
        loader = spec.loader

        class Loader:
            def create_module(self, spec):
                return loader.create_module(spec)

            def exec_module(self, module):
                module.__loader__ = module.__spec__.loader = loader
                loader.exec_module(module)
                _wrap(module)

        spec.loader = Loader()
        return spec


def register():
    _report_process()
    module = sys.modules.get(TARGET)
    if module is not None:
        _wrap(module)
    elif not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.insert(0, _Finder())

"""capture_workspace: keep RecoverSSM's mixed CUDA-graph captures inside its workspace.

Why: with ``--use-replayssm`` (``cache_config.use_kda_recoverssm``), Kimi-K3's KDA
layers hold a speculative activation window of ``num_speculative_tokens + 1``
tokens for at most ``max_num_seqs`` requests: ``max_num_reqs * decode_query_len``
tokens (48 * 9 = 432). vLLM 0.29.0's ``CudaGraphManager._init_candidates`` plans
one mixed-mode (PIECEWISE or FULL-mixed) graph per capture size, up to 512 on
Hopper; sizes above the workspace become dummy batches of 48 requests with 10 or
11 tokens each, and startup dies on the first (largest) capture with
``ValueError: KDA RecoverSSM speculative decode query length exceeds its
activation capacity (9)``.

What it changes: when ``use_kda_recoverssm`` is on, ``_init_candidates`` runs
against a view of the compilation config whose ``cudagraph_capture_sizes`` holds
only the sizes that fit in ``max_num_reqs * decode_query_len``. No mixed-mode
descriptor above the workspace is planned; larger batches run eagerly, as
upstream does. Uniform and varlen decode descriptors were already bounded by the
same limit, so the plan (``_capture_descs`` and ``_candidates``) equals the one
vLLM 0.30.0 builds. The view lives only for that call: the shared
``CompilationConfig`` (also read by the speculator's manager) is never modified.
With RecoverSSM off the call is passed through untouched.

Upstream: vllm-project/vllm PR #55774, released in 0.30.0.

Needed when (``check``): the installed vLLM has RecoverSSM
(``CacheConfig.use_kda_recoverssm``) and its ``_init_candidates`` does not consult
it (source check). Not affected where RecoverSSM does not exist (0.28.0); not
needed once ``_init_candidates`` bounds the mixed captures itself (0.30.0). Where
the source is unavailable it cannot tell: the shim applies it and warns (with
RecoverSSM off the wrapper passes every call through).
"""

from __future__ import annotations

import importlib
import inspect

from kimi_hotfix import base, core

FIELD = "use_kda_recoverssm"


class ClampedCompilationConfig:
    """Read-only view of a CompilationConfig with capture sizes clamped."""

    __slots__ = ("_config", "cudagraph_capture_sizes")

    def __init__(self, config, sizes):
        object.__setattr__(self, "_config", config)
        object.__setattr__(self, "cudagraph_capture_sizes", sizes)

    def __getattr__(self, name):
        return getattr(self._config, name)

    def __setattr__(self, name, value):
        setattr(self._config, name, value)


def workspace_tokens(manager) -> int:
    return manager.max_num_reqs * manager.decode_query_len


def clamped_view(manager):
    """The view to plan with, or None when nothing needs clamping."""
    cache_config = manager.vllm_config.cache_config
    if not getattr(cache_config, FIELD, False):
        return None
    config = manager.compilation_config
    sizes = config.cudagraph_capture_sizes
    if not sizes:
        return None
    limit = workspace_tokens(manager)
    kept = [size for size in sizes if size <= limit]
    if len(kept) == len(sizes):
        return None
    return ClampedCompilationConfig(config, kept)


def init_candidates_wrapper(wrapped, instance, args, kwargs):
    try:
        view = clamped_view(instance)
    except Exception as exc:
        core.wrapper_failed(PATCH.name, exc, "vLLM's own capture plan is used")
        view = None
    if view is None:
        return wrapped(*args, **kwargs)
    shared = instance.compilation_config
    instance.compilation_config = view
    try:
        return wrapped(*args, **kwargs)
    finally:
        instance.compilation_config = shared


class CaptureWorkspacePatch(base.Patch):
    name = "capture_workspace"
    target = "vllm.v1.worker.gpu.cudagraph_utils"
    wraps = ("CudaGraphManager._init_candidates",)
    upstream = "PR #55774"
    fixed_in = "0.30.0"
    affects_from = "0.29.0"
    symptoms = ("ValueError: KDA RecoverSSM speculative decode query length exceeds its "
                "activation capacity",
                "at startup, while capturing CUDA graphs (--use-replayssm)")
    summary = "RecoverSSM: no mixed CUDA graph above max_num_seqs * (1 + k) tokens"
    decides = ("RecoverSSM present (CacheConfig.use_kda_recoverssm) and a source check: "
               "_init_candidates does not consult it")
    probe_title = ("capture plan for 48 seqs, k=8, Hopper capture sizes (to 512): "
                   "largest mixed graph vs RecoverSSM workspace")

    def _method(self, module):
        manager = getattr(module, "CudaGraphManager", None)
        method = vars(manager).get("_init_candidates") if manager is not None else None
        if method is None:
            raise base.PatchError("CudaGraphManager._init_candidates not found")
        return manager, method

    def check(self, module, optimize):
        _, method = self._method(module)
        cache_config = importlib.import_module("vllm.config").CacheConfig
        if FIELD not in getattr(cache_config, "__dataclass_fields__", {}):
            return base.absent("this vLLM has no RecoverSSM (no CacheConfig.use_kda_recoverssm)")
        try:
            source = inspect.getsource(method)
        except (OSError, TypeError) as exc:
            return base.cannot_tell(f"source of _init_candidates unavailable ({exc})")
        if FIELD in source:
            return base.fixed("_init_candidates bounds mixed captures for RecoverSSM")
        return base.needed("_init_candidates plans mixed graphs above the RecoverSSM workspace")

    def apply(self, module, wrap):
        manager, _ = self._method(module)
        wrap(manager, "_init_candidates", init_candidates_wrapper)

    def probe(self):
        from kimi_hotfix.patches.capture_workspace import probe

        return probe.run()


PATCH = CaptureWorkspacePatch()

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

Needed when: the installed ``_init_candidates`` does not consult
``use_kda_recoverssm`` (source check); without source, by version (< 0.30.0).
"""

from __future__ import annotations

import inspect

from kimi_hotfix import core


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
    if not getattr(cache_config, "use_kda_recoverssm", False):
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
        core.wrapper_failed(PATCH.name, exc)
        view = None
    if view is None:
        return wrapped(*args, **kwargs)
    shared = instance.compilation_config
    instance.compilation_config = view
    try:
        return wrapped(*args, **kwargs)
    finally:
        instance.compilation_config = shared


class CaptureWorkspacePatch(core.Patch):
    name = "capture_workspace"
    target = "vllm.v1.worker.gpu.cudagraph_utils"
    wraps = ("CudaGraphManager._init_candidates",)
    upstream = "vllm-project/vllm PR #55774"
    fixed_in = "0.30.0"
    summary = "RecoverSSM: no mixed CUDA graph above max_num_reqs * decode_query_len"
    decides = "source check: _init_candidates consults use_kda_recoverssm (else version < 0.30.0)"

    def _method(self, module):
        manager = getattr(module, "CudaGraphManager", None)
        method = vars(manager).get("_init_candidates") if manager is not None else None
        if method is None:
            raise core.PatchError("CudaGraphManager._init_candidates not found")
        return manager, method

    def check(self, module):
        _, method = self._method(module)
        try:
            source = inspect.getsource(method)
        except (OSError, TypeError):
            return self.version_fallback("source of _init_candidates unavailable")
        if "use_kda_recoverssm" in source:
            return False, "_init_candidates bounds mixed captures for RecoverSSM"
        return True, "_init_candidates plans mixed graphs above the RecoverSSM workspace"

    def apply(self, module, wrap):
        manager, _ = self._method(module)
        wrap(manager, "_init_candidates", init_candidates_wrapper)


PATCH = CaptureWorkspacePatch()

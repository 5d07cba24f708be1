"""The probes' scaffolding for capture_workspace and kda_overlong_rows: real
vLLM objects built on a CPU, with no model. Only their probes (``check``)
import it, never a vLLM process (``has_recoverssm()``, the patches' common
first question, lives in capture_workspace). Importing this module imports
nothing heavy; its functions import vLLM and torch (set VLLM_TARGET_DEVICE=cpu first). What is
not the real vLLM there, and why (inputs only, never behaviour):

- ``CudaGraphManager.__init__`` asks ``get_pp_group()`` for its pipeline rank
  and the platform for a CUDA graph pool; both are stubbed during construction
  (one rank, no pool).
- The CPU platform turns CUDA graphs off, so the capture sizes are computed by
  vLLM's own ``VllmConfig._set_cudagraph_sizes`` after the mode is set back on.
  That method reads ``model_config.enforce_eager`` only, and there is no model:
  a stand-in with ``enforce_eager=False`` is in place for that one call. The
  default list is what vLLM computes for a Hopper GPU (capture ceiling 512).
- Builders that read ``model_config.hf_text_config`` in their constructor get
  an empty stand-in for that call only.
"""

from __future__ import annotations

import contextlib
import types

from kimi_hotfix.patches.capture_workspace import FIELD as RECOVERSSM_FIELD
from kimi_hotfix.patches.capture_workspace import has_recoverssm
from kimi_hotfix.runtime import wrapping

SEED = {"max_num_seqs": 48, "num_spec": 8}  # the failing deployment: 48 x (1 + 8) = 432


def vllm_config(max_num_seqs=48, num_spec=8, recoverssm=True, max_num_batched_tokens=8192,
                max_model_len=8192):
    """A real VllmConfig with an n-gram SpeculativeConfig for ``num_spec`` draft
    tokens (it needs no draft model), RecoverSSM on or off where it exists."""
    from vllm.config import SchedulerConfig, SpeculativeConfig, VllmConfig

    speculative = SpeculativeConfig(method="ngram", num_speculative_tokens=num_spec)
    scheduler = SchedulerConfig(
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max_num_batched_tokens,
        max_model_len=max_model_len,
        is_encoder_decoder=False,
    )
    config = VllmConfig(speculative_config=speculative, scheduler_config=scheduler)
    if has_recoverssm():
        setattr(config.cache_config, RECOVERSSM_FIELD, bool(recoverssm))
    return config


@contextlib.contextmanager
def model_config_standin(config, **attrs):
    """``config.model_config`` reads as a namespace holding ``attrs`` (no model)."""
    saved = config.model_config
    config.model_config = types.SimpleNamespace(**attrs)
    try:
        yield
    finally:
        config.model_config = saved


def graph_mode(name):
    from vllm.config.compilation import CUDAGraphMode

    return name if isinstance(name, CUDAGraphMode) else CUDAGraphMode[str(name).upper()]


def set_capture_sizes(config, mode, sizes=None):
    """Turn CUDA graphs on in ``config`` and let vLLM size them, as a GPU would:
    ``sizes=None`` yields vLLM's default list (Hopper: up to 512 tokens); an
    explicit list goes through vLLM's handling of a user-given list."""
    compilation = config.compilation_config
    compilation.cudagraph_mode = mode
    compilation.max_cudagraph_capture_size = None
    compilation.cudagraph_capture_sizes = None if sizes is None else [int(s) for s in sizes]
    with model_config_standin(config, enforce_eager=False):
        config._set_cudagraph_sizes()


@contextlib.contextmanager
def cpu_graph_stubs():
    """The two things CudaGraphManager.__init__ asks of a GPU process."""
    from vllm.platforms import current_platform
    from vllm.v1.worker.gpu import cudagraph_utils

    single_rank = types.SimpleNamespace(is_first_rank=True, is_last_rank=True)
    saved_pp = cudagraph_utils.get_pp_group
    had_pool = "get_global_graph_pool" in vars(current_platform)
    saved_pool = vars(current_platform).get("get_global_graph_pool")
    cudagraph_utils.get_pp_group = lambda: single_rank
    current_platform.get_global_graph_pool = lambda: None
    try:
        yield
    finally:
        cudagraph_utils.get_pp_group = saved_pp
        if had_pool:
            current_platform.get_global_graph_pool = saved_pool
        else:
            del current_platform.get_global_graph_pool


def wrapped(owner, attr) -> bool:
    return wrapping.is_wrapped(vars(owner).get(attr))


def plain(value):
    """A JSON-able copy of a tensor or a plain value."""
    return value.tolist() if hasattr(value, "tolist") and not isinstance(value, list) else value


def device():
    import torch

    return torch.device("cpu")

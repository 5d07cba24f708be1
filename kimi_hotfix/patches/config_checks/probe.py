"""config_checks' probe: a DCP8 configuration whose interleave size does not fit the block.

Imports vLLM (CPU is enough). A model-less ``VllmConfig()`` with
``decode_context_parallel_size=8``, ``block_size=64`` and
``cp_kv_cache_interleave_size=128``; vLLM's own ``validate_block_size`` (what
the engine core calls after planning the KV cache) must refuse it, as plain
Python does.
"""

from __future__ import annotations

from kimi_hotfix.patching import ProbeResult

CASE = {"decode_context_parallel_size": 8, "block_size": 64, "cp_kv_cache_interleave_size": 128}


def misfit_config():
    from vllm.config import VllmConfig

    config = VllmConfig()
    config.parallel_config.decode_context_parallel_size = CASE["decode_context_parallel_size"]
    config.cache_config.block_size = CASE["block_size"]
    config.parallel_config.cp_kv_cache_interleave_size = CASE["cp_kv_cache_interleave_size"]
    return config


def validate(config) -> str:
    """What validate_block_size does with ``config``: "accepted" or the error
    (AssertionError up to 0.33.0; ValueError with upstream/0003 applied)."""
    try:
        config.validate_block_size()
    except (AssertionError, ValueError) as exc:
        return f"{type(exc).__name__}: {exc}"
    return "accepted"


def run() -> ProbeResult:
    config = misfit_config()
    if not hasattr(config, "validate_block_size"):
        return ProbeResult(ok=True, affected=False, detail="no VllmConfig.validate_block_size")
    outcome = validate(config)
    label = "DCP 8, block 64, interleave 128"
    if outcome == "accepted":
        return ProbeResult(ok=False, cases={label: outcome},
                           detail="validate_block_size accepts an interleave size that does not "
                                  "fit the block (plain Python refuses it)")
    return ProbeResult(ok=True, cases={label: outcome},
                       detail="validate_block_size refuses it, as plain Python does")

"""Which of vLLM's own test files the tier runs, and why (stdlib only).

The rule (``rule_files``): every test file of the release's sdist (``tests/**/test_*.py``)
that imports a module the shim patches (``kimi_hotfix.patches.PATCHES``' targets), or a
module where ``audit`` found an AssertionError-steered site, or a function such a site
reaches, that is not reviewed harmless (covered, uncovered or not reviewed: where ``-O``
can change what vLLM does); plus all of ``tests/v1/core/`` (the KV-cache manager, its
block pool and the planner, whose asserts guard block ownership), whatever they import.
Sites reviewed harmless are left out: their modules (the attention backend base, the
multimodal config, the workspace) are imported by about 130 more test files, most of
them GPU kernels, servers and model downloads, and the review says ``-O`` cannot change
what a server does there.

Each file the rule finds is run, or excluded here with the reason (``EXCLUDED``):
nothing the rule finds is dropped silently, and a file the rule no longer finds is a
stale exclusion (tests/vllm_suite/test_vllm_suite.py checks both). The reasons were
measured on 0.29.0 in plain Python without the shim (2026-12-04): a file is run when at
least one of its tests passes on this CPU-only venv; the others cannot say anything
about ``-O`` here.

Inside a file: where vLLM marks tests ``cpu_test`` (its CPU CI runs ``-m cpu_test``),
only the marked ones run; a file without the mark runs whole (it was measured to run on
CPU, above).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

# the named files: they must be selected (a test checks)
NAMED = (
    "tests/v1/test_kv_cache_spec_registry.py",
    "tests/v1/attention/test_mla_noncausal.py",
    "tests/v1/kv_connector/unit/test_nixl_connector_hma.py",
)
ALWAYS = ("tests/v1/core/",)  # every test file under these runs (unless excluded below)
HARMLESS = "harmless"

# reason -> the files the rule finds that the tier does not run (measured: none of
# their tests passes here, or they cannot be collected)
EXCLUDED_BY_REASON: dict = {
    "imports tests/utils.py, which imports anthropic and then the OpenAI server stack "
    "(uvicorn, ...): engine, server and model tests, which need a GPU or models from the "
    "hub besides": [
        "tests/distributed/test_mnnvl_alltoall.py",
        "tests/distributed/test_nccl_symm_mem.py",
        "tests/distributed/test_rocm_quick_reduce.py",
        "tests/entrypoints/openai/chat_completion/test_serving_chat.py",
        "tests/kernels/core/test_minimax_reduce_rms.py",
        "tests/kernels/mamba/test_mamba_mixer2.py",
        "tests/kernels/test_kimi_k3_gemm_rs_ar.py",
        "tests/lora/test_fused_moe_lora_kernel.py",
        "tests/models/multimodal/generation/test_maverick.py",
        "tests/models/multimodal/generation/test_moondream3.py",
        "tests/models/multimodal/generation/test_moondream3_moe.py",
        "tests/models/multimodal/test_mimo_v2_omni.py",
        "tests/models/test_initialization.py",
        "tests/models/test_vision.py",
        "tests/v1/e2e/spec_decode/draft_model/test_draft_model.py",
        "tests/v1/e2e/test_hybrid_chunked_prefill.py",
        "tests/v1/engine/test_engine_core.py",
        "tests/v1/engine/test_engine_core_client.py",
        "tests/v1/worker/test_gpu_model_runner_v2_cudagraph_profiling.py",
    ],
    "imports vLLM's Mooncake connector, which imports httpx (then tests/utils.py's server "
    "stack, above)": [
        "tests/v1/kv_connector/unit/test_mooncake_connector.py",
        "tests/v1/kv_connector/unit/test_mooncake_connector_hybrid_mamba.py",
    ],
    "imports ray (multi-process NCCL and NIXL transfer tests; ray is a venv kind of its own, "
    "1 GB more)": [
        "tests/distributed/test_comm_ops.py",
        "tests/distributed/test_custom_all_gather_reduce_scatter.py",
        "tests/distributed/test_custom_all_reduce.py",
        "tests/distributed/test_quick_all_reduce.py",
        "tests/distributed/test_rocm_aiter_custom_ar.py",
        "tests/v1/kv_connector/unit/test_nixl_connector.py",
    ],
    "torch.compile fusion passes for CUDA kernels: imports depyf": [
        "tests/compile/passes/distributed/test_async_tp.py",
        "tests/compile/passes/distributed/test_fusion_all_reduce.py",
        "tests/compile/passes/distributed/test_sequence_parallelism.py",
        "tests/compile/passes/test_fusion_attn.py",
        "tests/compile/passes/test_mla_attn_quant_fusion.py",
        "tests/compile/passes/test_mla_rope_kvcache_cat_fusion.py",
        "tests/compile/passes/test_rocm_aiter_qk_norm_rope_kvcache_fusion.py",
        "tests/compile/passes/test_rope_kvcache_fusion.py",
    ],
    "NCCL tests: import multiprocess": [
        "tests/distributed/test_pynccl.py",
        "tests/distributed/test_split_group.py",
    ],
    "scripts for torchrun (RANK and WORLD_SIZE from the launcher); no test functions": [
        "tests/distributed/test_node_count.py",
        "tests/distributed/test_same_node.py",
        "tests/distributed/test_torchrun_example.py",
        "tests/distributed/test_torchrun_example_moe.py",
    ],
    "imports a package the CPU venv does not hold (msgpack: MoRIIO, a ROCm connector; numba; "
    "mistral_common; datasets; torchvision, whose registry build is CUDA's and breaks "
    "vllm.config)": [
        "tests/v1/kv_connector/unit/test_moriio_connector.py",
        "tests/models/inkling/test_contract_validation.py",
        "tests/models/multimodal/generation/test_voxtral_realtime.py",
        "tests/renderers/test_mistral.py",
        "tests/v1/e2e/general/test_mamba_prefix_cache.py",
        "tests/kernels/attention/test_minimax_m3.py",
    ],
    "needs a GPU (CUDA, ROCm, FlashInfer, Triton or FlashAttention kernels): every test skips "
    "or fails on CPU, or the module skips itself": [
        "tests/distributed/test_eplb_execute.py",
        "tests/distributed/test_eplb_fused_moe_layer.py",
        "tests/distributed/test_eplb_fused_moe_layer_dep_nvfp4.py",
        "tests/distributed/test_symm_mem_allreduce.py",
        "tests/kernels/attention/test_flash_attn.py",
        "tests/kernels/attention/test_mla_cross_layer_kernel_equivalence.py",
        "tests/kernels/attention/test_rocm_aiter_fa.py",
        "tests/kernels/attention/test_rocm_aiter_mla_causal_verify_mask.py",
        "tests/kernels/attention/test_rocm_aiter_mla_decode_metadata.py",
        "tests/kernels/attention/test_triton_unified_attention.py",
        "tests/kernels/attention/test_triton_unified_attention_diffkv.py",
        "tests/kernels/attention/test_trtllm_kvfp8_dequant.py",
        "tests/kernels/mamba/test_gdn_forward_core_split.py",
        "tests/kernels/mamba/test_gdn_fused_mtp.py",
        "tests/models/quantization/test_fp8.py",
        "tests/quantization/test_per_token_kv_cache.py",
        "tests/v1/attention/test_flashinfer_dcp_spec_reorder.py",
        "tests/v1/attention/test_trtllm_attention_integration.py",
        "tests/v1/e2e/general/test_attention_backend_per_kind.py",
        "tests/v1/engine/test_abort_final_step.py",
        "tests/v1/kv_connector/unit/test_moriio_kv_layout.py",
        "tests/v1/kv_connector/unit/test_nixl_rocm_gpu_mem_diag.py",
        "tests/v1/simple_kv_offload/test_worker.py",
        "tests/v1/worker/test_gpu_warmup_blocks.py",
    ],
    "every test builds a ModelConfig for a model on the Hugging Face hub (facebook/opt-125m "
    "and others), offline here: each fails in ModelConfig before vLLM's KV-cache code runs": [
        "tests/v1/attention/test_attention_backends.py",
        "tests/v1/attention/test_gdn_metadata_builder.py",
        "tests/v1/attention/test_linear_attention_metadata_builder.py",
        "tests/v1/attention/test_replayssm_metadata_builder.py",
        "tests/v1/kv_connector/unit/test_decode_bench_connector.py",
        "tests/v1/kv_connector/unit/test_flexkv_connector.py",
        "tests/v1/kv_connector/unit/test_kv_connector_lifecycle.py",
        "tests/v1/kv_connector/unit/test_nixl_desc_geometry.py",
        "tests/v1/kv_connector/unit/test_nixl_simple_cpu_offload.py",
        "tests/v1/kv_connector/unit/test_scheduler_kv_connector_override.py",
        "tests/v1/spec_decode/test_dflash_lookahead.py",
    ],
}
EXCLUDED = {f: why for why, files in EXCLUDED_BY_REASON.items() for f in files}


def audit_modules(result: dict) -> set:
    """The modules of the audit's sites of the package (not vLLM's tests': ``audit
    --tests``, whose blocks the tier checks against its runs instead, agreement.py)
    and the functions they reach, not reviewed harmless."""
    found = set()
    package_sites = [s for s in result["sites"] if s["kind"] != "raises"]
    for entry in [*package_sites, *(h for s in package_sites for h in s["reaches"])]:
        if entry["verdict"] != HARMLESS:
            found.add(entry["file"][:-len(".py")].replace("/", ".").removesuffix(".__init__"))
    return found


def imported_modules(source: str) -> set:
    """Every module a file's import statements name (absolute ones), at any depth,
    with ``from pkg import mod`` also giving ``pkg.mod``."""
    names = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def rule_files(tree: Path, modules: set) -> dict:
    """{path relative to the sdist: why the rule finds it} for the test files under
    ``tree/tests`` that import one of ``modules`` or lie under ``ALWAYS``."""
    tails = re.compile("|".join(re.escape(m.rsplit(".", 1)[-1]) for m in sorted(modules)))
    found = {}
    for path in sorted((tree / "tests").rglob("test_*.py")):
        rel = path.relative_to(tree).as_posix()
        if rel.startswith(ALWAYS):
            found[rel] = "under " + next(a for a in ALWAYS if rel.startswith(a))
            continue
        source = path.read_text(errors="replace")
        if not tails.search(source):  # cheap: most files name none of the modules
            continue
        hit = sorted(imported_modules(source) & modules)
        if hit:
            found[rel] = "imports " + ", ".join(hit)
    return found


def check_exclusions(found: dict) -> list:
    """Problems of the table against what the rule found: an exclusion under ALWAYS,
    twice, or of a file the rule does not find (stale)."""
    problems = []
    seen: dict = {}
    for why, files in EXCLUDED_BY_REASON.items():
        for f in files:
            if f in seen:
                problems.append(f"{f}: excluded twice")
            seen[f] = why
            if f.startswith(ALWAYS):
                problems.append(f"{f}: under {ALWAYS}, which runs whole")
            elif f not in found:
                problems.append(f"{f}: excluded, but the rule does not find it (stale)")
    return problems


def selected(found: dict) -> list:
    """The files the tier runs: what the rule finds, less the exclusions."""
    return sorted(f for f in found if f not in EXCLUDED)

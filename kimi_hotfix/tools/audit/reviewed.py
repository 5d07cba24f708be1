"""The one reviewed table: what each AssertionError-steered site does under ``-O``.

Keyed by qualified name and the normalised source hash of the function
(kimi_hotfix.tools.audit.summary.source_hash: formatting, comments and docstrings do
not count; any change to code does). A function found with a hash that is not
listed here shows as "not reviewed (changed since review)", whatever its name
says. Each row was decided by reading the function in the release named next
to its hash, and its callers where the row says so.

Verdicts:
  covered    the shim restores plain-Python behaviour there: ``o_parity`` (-O
             parity, kimi_hotfix.runtime.parity: every assert of vLLM's own modules) or
             a patch of this package
  harmless   ``-O`` cannot change what a server does there (the reason says why)
  uncovered  ``-O`` can change behaviour there and the shim does not cover it
             (the reason says where it matters, and why not: another package's
             asserts, which -O parity, vLLM's modules only, does not restore)

Two kinds of rows: a ``site`` (a handler catching AssertionError, a
``contextlib.suppress(AssertionError)`` block, a pydantic validator holding
``assert``), and a function with bare asserts that a site's guarded block
reaches (``reached``). Where the reasons speak of "the deployments", they mean
the Kimi-K3 DSpark/DCP8 servers (MLA + KDA, TP8, 2 nodes, CUDA) and the hybrid
sliding-window servers of docs/o-parity.md.
"""

from __future__ import annotations

import importlib
import importlib.util
from dataclasses import dataclass

from kimi_hotfix.patches import PATCHES

O_PARITY = "o_parity"  # -O parity (kimi_hotfix.runtime.parity): armed by the shim, not a registry patch

COVERED = "covered"
HARMLESS = "harmless"
UNCOVERED = "uncovered"
NOT_REVIEWED = "not reviewed"
VERDICTS = (COVERED, HARMLESS, UNCOVERED)


@dataclass(frozen=True)
class Review:
    qualname: str
    hashes: dict  # normalised source hash -> the release it was reviewed in
    verdict: str
    why: str
    patch: str = ""  # for ``covered``: the patch's name
    # for ``harmless``: the path -O changes serves tests, not servers (a process-group
    # getter's except path, say). vLLM's own tests may then differ under -O: the
    # vLLM-suite tier accepts such a row as the explanation of a test that differs
    # (tests/vllm_suite/agreement.py); a harmless row without it claims -O changes
    # nothing there at all.
    serves_tests: bool = False


TABLE: dict = {}  # qualname -> [Review]


def _add(qualname, hashes, verdict, why, patch="", serves_tests=False):
    if verdict not in VERDICTS:
        raise ValueError(f"unknown verdict {verdict!r} for {qualname}")
    if (verdict == COVERED) != bool(patch):
        raise ValueError(f"{qualname}: 'covered' names a patch, other verdicts none")
    if serves_tests and verdict != HARMLESS:
        raise ValueError(f"{qualname}: only a harmless row says its path serves tests")
    TABLE.setdefault(qualname, []).append(Review(qualname, dict(hashes), verdict, why, patch,
                                                 serves_tests))


def covered(qualname, hashes, patch, why):
    _add(qualname, hashes, COVERED, why, patch)


def harmless(qualname, hashes, why, serves_tests=False):
    _add(qualname, hashes, HARMLESS, why, serves_tests=serves_tests)


def uncovered(qualname, hashes, why):
    _add(qualname, hashes, UNCOVERED, why)


def lookup(qualname, source_hash):
    """(Review or None, changed): the row for this exact source, or None with
    ``changed`` True when the name was reviewed with other sources only."""
    rows = TABLE.get(qualname, [])
    for row in rows:
        if source_hash in row.hashes:
            return row, False
    return None, bool(rows)


def reviewed_hashes(qualname) -> dict:
    out: dict = {}
    for row in TABLE.get(qualname, []):
        out.update(row.hashes)
    return out


# -- the KV-cache planner (Kimi-K3 and the hybrid sliding-window servers) -----------
# The planner's fallbacks and the spec merges: -O strips the merges' asserts; -O
# parity restores them (the capability patch changes only how the draft flag merges).

_PLANNER = ("The planner tells KV-cache specs that cannot share a group apart by the "
            "AssertionError their merge raises. -O strips the asserts in the spec merges "
            "(KVCacheSpec.merge too, in 0.29.0): incompatible specs merge, or the merge runs "
            "into an AttributeError nothing catches. -O parity runs the merges with their "
            "asserts, as plain Python does.")
_MERGE = ("A KV-cache spec merge the planner calls through is_kv_cache_spec_uniform and "
          "the page-size bucketing; -O parity keeps its asserts (docs/o-parity.md).")
_KVI = "vllm.v1.kv_cache_interface."
for _module, _releases in (("vllm.v1.core.kv_cache_utils", "0.29.0, 0.30.0"),
                           ("vllm.v1.core.kv_cache_planning", "0.33.0")):
    covered(f"{_module}.is_kv_cache_spec_uniform", {"4fb234c47f924b49": _releases}, O_PARITY,
            _PLANNER)
    covered(f"{_module}._get_kv_cache_groups_uniform_page_size", {"878f77328682ee52": _releases},
            O_PARITY, _PLANNER)
covered(_KVI + "KVCacheSpec.merge", {"6aa5555bea667a3a": "0.29.0"}, O_PARITY,
        _MERGE + " 0.30.0 raises explicitly here.")
for _name, _hashes in (
    ("FullAttentionSpec.merge", {"347f6a4dc51a21f1": "0.29.0, 0.30.0", "7c4172adfc14adba": "0.33.0"}),
    ("MLAAttentionSpec.merge", {"b05f2f8b2bfb5c4f": "0.29.0", "565140f506465636": "0.30.0",
                                "749336663f30638d": "0.33.0"}),
    ("RSWASpec.merge", {"362f0b74c6ba6989": "0.29.0, 0.30.0", "9edf63275ff6eae5": "0.33.0"}),
    ("SinkFullAttentionSpec.merge", {"d53a168aa6ab5a9b": "0.29.0, 0.30.0",
                                     "f519f660bb338c67": "0.33.0"}),
    ("SlidingWindowMLASpec.merge", {"c7f1a63b666cda03": "0.29.0, 0.30.0",
                                    "fc0e8db89c7a2ed4": "0.33.0"}),
):
    covered(_KVI + _name, _hashes, O_PARITY, _MERGE)

# -- the CPU KV-offload barrier ------------------------------------------------------------

covered("vllm.distributed.parallel_state.get_inner_dp_world_group",
        {"7f6ca7e4dca1e0cc": "0.29.0-0.33.0"}, O_PARITY,
        "The inner-DP world group exists only when a DP replica spans nodes "
        "(nnodes_within_dp > 1); otherwise the getter asserts and "
        "kv_offload/cpu/spec.py falls back to the world group. Under -O it returns None "
        "and the CPU KV offload barrier fails with AttributeError at worker start-up "
        "(measured: tests/real/test_o_parity.py). -O parity keeps the assert.")
covered("vllm.v1.kv_offload.cpu.spec._all_workers_barrier", {"e1651cbe5deffb59": "0.29.0-0.33.0"},
        O_PARITY,
        "CPU KV offload on CUDA/XPU (the shared mmap region) calls this barrier when the "
        "worker is created. Plain Python: get_inner_dp_world_group() asserts unless a DP "
        "replica spans nodes, and the barrier runs on the world group. -O: the getter "
        "returns None and None.barrier() raises AttributeError: the worker fails to start "
        "(single node, or multi-node under Ray, where parallel_config.nnodes stays 1). "
        "-O parity keeps the getter's AssertionError.")

_KVI = "vllm.v1.kv_cache_interface."
harmless(_KVI + "SlidingWindowMLASpec.__post_init__", {"be27ae528b6cab2a": "0.29.0-0.33.0"},
         "Reached when SlidingWindowMLASpec.merge builds the merged spec (cls(...)). Its "
         "assert checks model_version, which the merged spec copies from the specs being "
         "merged; those went through this same __post_init__ when vLLM built them.")
harmless("vllm.models.kimi_k3.nvidia.specialized_decode.cutedsl.common.primitives.load_words",
         {"eb751b0090021d7c": "0.33.0"},
         "By-name match only: the planner's merge calls are on KV-cache specs, whose merges "
         "never call this CuTe DSL helper (it is reached through an unrelated 'merge').")

# -- process-group getters (parallel_state) --------------------------------------------

_GROUPS = ("initialize_model_parallel creates the {name} group in every worker (size 1 "
           "when unused) before model, attention and block-table code runs, so in a server "
           "the getter returns it and never asserts; the except path serves unit tests "
           "without process groups.")
_PS = "vllm.distributed.parallel_state."
harmless(_PS + "get_dcp_group", {"e0cc24c5a17c24eb": "0.29.0-0.33.0"},
         _GROUPS.format(name="DCP"), serves_tests=True)
harmless(_PS + "get_pcp_group", {"c2da8fcf1827620a": "0.29.0-0.33.0"},
         _GROUPS.format(name="PCP"), serves_tests=True)
harmless(_PS + "get_tp_group", {"8ca9538f9b9a4bfb": "0.29.0-0.33.0"},
         _GROUPS.format(name="TP") + " Outside workers see the Inkling row.", serves_tests=True)
harmless(_PS + "get_pp_group", {"94f562d98e743ddf": "0.30.0-0.33.0"},
         _GROUPS.format(name="PP"), serves_tests=True)
harmless(_PS + "get_world_group", {"4e6a8dcd6ea653c7": "0.29.0-0.33.0"},
         "init_distributed_environment creates the world group in every worker before "
         "weights load; the except path serves unit tests.", serves_tests=True)
harmless(_PS + "get_ep_group", {"4a9d947711dca489": "0.29.0 (tests), 0.33.0"},
         "By-name match only (P2P tier manager: a 'get' on a dict of sessions reaches "
         "SingleWriterShmObjectStorage.get, which calls this getter; in 0.29.0's tests, a "
         "model's load_weights matched by name); not the call guarded there.")

_GROUP_SITE = ("The guarded call is a process-group getter; " + _GROUPS.format(name="group")
               + " Same behaviour with and without -O in a server.")
for _name, _hashes in (
    ("vllm.model_executor.layers.attention.mla_attention.MLACommonMetadataBuilder.__init__",
     {"3c47c718c7d761e9": "0.29.0, 0.30.0", "feea687633961093": "0.33.0"}),
    ("vllm.model_executor.layers.attention.sparse_mla_attention."
     "SparseMLACommonMetadataBuilder.__init__",
     {"54fd3daef49c0173": "0.29.0", "d218b19b6828a6f6": "0.30.0, 0.33.0"}),
    ("vllm.v1.attention.backend.AttentionImplBase.__new__",
     {"e6cb138cb5c458cf": "0.29.0, 0.30.0", "93fd9e002b8db49d": "0.33.0"}),
    ("vllm.v1.attention.backends.flash_attn.FlashAttentionMetadataBuilder.__init__",
     {"3c41b911c8e67e02": "0.29.0", "77905580c9ddf674": "0.30.0"}),
    ("vllm.v1.attention.backends.flashinfer.FlashInferMetadataBuilder.__init__",
     {"12e1caacb7c98797": "0.29.0", "a839d2f417590a16": "0.30.0"}),
    ("vllm.v1.worker.block_table.BlockTable.__init__",
     {"94c19b1005408c50": "0.29.0, 0.30.0", "8fdc240272609a94": "0.33.0"}),
    ("vllm.v1.worker.cp_utils.get_kv_cache_shard_count", {"15f9076acc24fcc5": "0.29.0"}),
    ("vllm.model_executor.model_loader.weight_utils.instanttensor_weights_iterator",
     {"c5083cc2f09a5530": "0.29.0, 0.30.0", "d5a7efbe1e44c9f7": "0.33.0"}),
    ("vllm.distributed.ec_transfer.ec_connector.mooncake.worker.ECMooncakeWorker."
     "_resolve_consumer_rank", {"0f7a0b294808d670": "0.30.0, 0.33.0"}),
):
    harmless(_name, _hashes, _GROUP_SITE, serves_tests=True)

covered("vllm.models.inkling.configs.InklingModelConfig.mamba2_cache_params",
        {"a5cdeeb212076dee": "0.29.0-0.33.0"}, O_PARITY,
        "Inkling models only. Outside a worker (config checks in the API server or the "
        "engine core) the TP group does not exist: plain Python falls back to tp_size=1, "
        "-O gets None from get_tp_group() and fails with AttributeError. -O parity keeps "
        "get_tp_group's assert, so the fallback runs.")

# -- forward context, workspace ---------------------------------------------------------

harmless("vllm.forward_context.get_forward_context", {"cf8079108daec076": "0.30.0, 0.33.0"},
         "Model forward passes (dummy runs, capture and serving steps) run inside "
         "set_forward_context, so the getter does not assert there; the except paths serve "
         "callers outside a forward pass (unit tests).", serves_tests=True)
harmless("vllm.model_executor.layers.fused_moe.prepare_finalize.moonep."
         "MoonEPPrepareAndFinalize.prepare", {"4ffc985ad8005059": "0.33.0"},
         "prepare() runs inside a model forward pass, in a forward context; the fallback "
         "serves tests. Same with and without -O in a server.", serves_tests=True)
harmless("vllm.distributed.device_communicators.cuda_communicator.CudaCommunicator."
         "_can_use_aiter_ag_rs", {"af50ce7b2bafaf92": "0.30.0, 0.33.0"},
         "ROCm AITER all-gather/reduce-scatter only (use_aiter_ag_rs); not on CUDA.")
harmless("vllm.v1.worker.workspace.current_workspace_manager", {"7a7e86eeb6a38f66": "0.29.0-0.33.0"},
         "Reached from the quantized-KV attention pre-warm, which first checks "
         "is_workspace_manager_initialized(); the manager's own growth check raises "
         "AssertionError explicitly (not an assert statement).")
for _name, _hashes in (
    ("vllm.v1.attention.backends.turboquant_attn.TurboQuantAttentionImpl._ensure_on_device",
     {"e059eadee20db84d": "0.29.0-0.33.0"}),
    ("vllm.v1.attention.backends.ultraquant_attn.UltraQuantAttentionImpl._ensure_on_device",
     {"68de9bd6dc842b82": "0.33.0"}),
):
    harmless(_name, _hashes,
             "Suppresses the workspace manager's locked-growth error, which get_simultaneous "
             "raises explicitly (raise AssertionError, kept under -O); the getter before it "
             "is guarded by is_workspace_manager_initialized().")

# -- attention backend selection ---------------------------------------------------------

covered("vllm.v1.attention.backends.fa_utils.get_flash_attn_version",
        {"249739b558c069d8": "0.29.0-0.33.0"}, O_PARITY,
        "The assert sits in the try body: plain Python returns None when the chosen "
        "flash-attention version is not supported (after logging an error); -O returns "
        "that unsupported version. The default choice only picks supported versions, so "
        "it differs only when the operator forces flash_attn_version (attention config) "
        "to one the GPU or the build lacks. GPU-only (not shown on the CPU wheels); -O "
        "parity keeps the assert.")
harmless("vllm.v1.attention.backends.fa_utils.flash_attn_supports_mla",
         {"48e3e0f837f83a0e": "0.29.0, 0.30.0", "a08860a8bcca116a": "0.33.0"},
         "No assert in the guarded block; the AssertionError would come from "
         "vllm_flash_attn's is_fa_version_supported (not in vLLM's Python tree). The "
         "reached DeviceCapability.to_int asserts minor < 10, which holds for every GPU.")
harmless("vllm.platforms.interface.DeviceCapability.to_int", {"449057ef49a261ae": "0.29.0-0.33.0"},
         "Asserts 0 <= minor < 10; CUDA compute capabilities satisfy it.")
harmless("vllm.distributed.device_communicators.cuda_wrapper.CudaRTLibrary.__init__",
         {"0c554dee059cce6a": "0.33.0"},
         "Asserts libcudart was found. Under -O ctypes.CDLL(None) loads the process itself "
         "and the first function lookup raises AttributeError, which _load_cudart catches "
         "too: the same warning and fallback.")
harmless("vllm.v1.kv_offload.cpu.host_register._load_cudart", {"44bff61e3c741e06": "0.33.0"},
         "Catches (AssertionError, AttributeError, OSError); see CudaRTLibrary.__init__.")

# -- ROCm only ----------------------------------------------------------------------------

for _name, _hashes in (
    ("vllm._aiter_ops.rocm_aiter_ops.is_triton_gemm_w8a8_tuned", {"4665ef503c919f18": "0.33.0"}),
    ("vllm._aiter_ops.rocm_aiter_ops.is_triton_gemm_afp4wfp4_presh_ws_tuned",
     {"50e9d7cc27e265d2": "0.33.0"}),
    ("vllm.model_executor.warmup.rocm_segmented_attn_autotune_warmup._tune_workload",
     {"d1bd04cef26ada48": "0.33.0"}),
    ("vllm.model_executor.warmup.rocm_segmented_attn_autotune_warmup._load_records",
     {"b26703bb53fe19bb": "0.33.0"}),
    ("vllm.model_executor.warmup.rocm_segmented_attn_autotune_warmup.warmup_segmented_attention",
     {"0cc09f6e0f6ea64f": "0.33.0"}),
):
    harmless(_name, _hashes,
             "ROCm only (returns early or is registered only when current_platform.is_rocm()); "
             "the AssertionErrors caught come from AITER/torch.testing or explicit raises, "
             "not from asserts in vLLM's tree. Not on CUDA.")
harmless("vllm.v1.metrics.stats.LoRAStats.update", {"f14ebaa46d74deb2": "0.33.0"},
         "By-name match only: the guarded calls are dict/set 'update's, never LoRA stats.")

# -- start-up warm-up, requests, validators -----------------------------------------------

harmless("vllm.model_executor.warmup.jit_warmup_triton_helper._DecoratedTritonJitKernel."
         "get_warmup_keys", {"f97d9ff2942cf586": "0.30.0, 0.33.0"},
         "Start-up warm-up key derivation: a dispatch function that rejects placeholder "
         "inputs makes it retry with fake tensors. -O can change which kernel variants the "
         "warm-up precompiles, not what a request computes (serving compiles on first use).")
uncovered("vllm.renderers.mistral.safe_apply_chat_template", {"133a8f9f4459a9b1": "0.29.0-0.33.0"},
          "mistral-common validates requests with its own asserts; -O strips them too, so "
          "malformed requests that plain Python answers with HTTP 400 get through. Only "
          "with tokenizer_mode=mistral (Mistral models), not the deployments' tokenizers; "
          "the asserts are in another package, outside what the shim patches.")
harmless("vllm.distributed.device_communicators.shm_object_storage.SingleWriterShmObjectStorage.get",
         {"bb90490c43a5d89b": "0.29.0, 0.30.0", "acfb81a999ae382c": "0.33.0"},
         "By-name match only: the guarded calls are dict.get/kwargs.get.")
uncovered("vllm.entrypoints.openai.responses.utils.decode_custom_tool_input_prefix",
          {"925138e2b993ceb7": "0.33.0"},
          "The AssertionError comes from partial-json-parser's own asserts, which -O strips "
          "too; streamed custom-tool-call deltas of the Responses API may then differ for "
          "malformed partial JSON (not measured). Another package: not patched here.")
harmless("vllm.v1.kv_offload.tiering.p2p.manager.P2PSecondaryTierManager._accept_new_peers",
         {"c2106ee7c5be53f4": "0.29.0, 0.30.0", "e5666aa023c2747b": "0.33.0"},
         "No assert statement in the guarded block or in what it calls precisely; the "
         "functions listed as reached are by-name matches of dict 'get' calls.")
harmless("vllm.config.quantization.QuantizationConfigArgs._coerce_spec",
         {"40b10ec7309466d7": "0.29.0-0.33.0"},
         "Asserts info.field_name is not None; pydantic always passes the field name to a "
         "field validator.")
harmless("vllm.config.multimodal.MultiModalConfig._validate_mm_encoder_attn_backend",
         {"4b1c1f1c8cadc24a": "0.29.0-0.33.0"},
         "Under -O a value that is neither a string nor an enum fails on value.upper() with "
         "AttributeError instead of a ValidationError: still rejected, another message.")
covered("vllm.config.kernel.IrOpPriorityConfig._to_list_str", {"f691aba5361f1709": "0.29.0-0.33.0"},
        O_PARITY,
        "Validates the IR op priority lists of the kernel config: -O accepts non-string "
        "entries that plain Python rejects with a ValidationError. -O parity keeps the "
        "validator's asserts.")
harmless("vllm.v1.metrics.perf.FfnMetrics.validate_moe_fields", {"2d85f66dd805c736": "0.29.0-0.33.0"},
         "Checks fields vLLM's own config parsers fill for MoE models (MFU metrics); for a "
         "model vLLM parses as MoE they are set, so the asserts hold in both modes.")


# -- vLLM's own tests (audit --tests: a sdist's tests/, reviewed on 0.29.0's) ---------------
# vLLM steers by these asserts in its tests (pytest.raises(AssertionError)), not in its
# code: the package scan cannot see them, the tier (tests/vllm_suite) measures them.
# Rows of three kinds: the guards the tests pin (vLLM functions with bare asserts: every
# one of them is vLLM's own, so -O parity restores it), functions a test block reaches
# by name only, and the test sites themselves (keyed by the test function).

_T = "0.29.0"
_PIN = ("vLLM's own test {tests} expects its AssertionError; under -O the assert is "
        "stripped and the call goes on. -O parity restores it.")
_PINNED = (
    # (qualified name, hash, what the assert guards, the test that pins it)
    # -- the KV-cache manager, its block pool and the planner (every step, every start-up)
    ("vllm.v1.core.kv_cache_utils.FreeKVCacheBlockQueue.append_n", "8ede3e41b738bb60",
     "The free-block queue is a doubly linked list: appending needs the tail sentinel's "
     "predecessor (under -O a broken list raises AttributeError on None instead).",
     "test_free_kv_cache_block_queue_append_n"),
    ("vllm.v1.core.kv_cache_utils.get_kv_cache_configs", "d157e26fa754bb1a",
     "Every worker must report the same spec for a layer, and the projected groups must "
     "cover every layer (under -O: worker 0's spec wins, or a short grouping goes on; "
     "docs/o-parity.md, planner invariants).", "test_get_kv_cache_configs_multiple_workers"),
    ("vllm.v1.core.kv_cache_utils.resolve_block_hashes", "d8979afc0f93f513",
     "A block-hash view built at another block size must not be reused: it would be read "
     "at the wrong granularity (prefix-cache hits on wrong blocks).",
     "test_resolve_block_hashes_rejects_mismatched_view"),
    ("vllm.v1.core.kv_cache_utils.BlockHashListWithBlockSize.__init__", "f5b0c912aa674a36",
     "A block-size view of the block hashes needs a block size that is a multiple of the "
     "hash block size.", "test_resolve_block_hashes_rejects_mismatched_view (its constructor)"),
    ("vllm.v1.core.kv_cache_manager.KVCacheManager.truncate_computed_blocks",
     "0a0423fb35cb23d4",
     "Only a Mamba group may come back short from the prefix-cache lookup, truncation must "
     "be block-aligned and within the computed blocks (under -O a full-attention group "
     "keeps blocks it does not own).", "test_truncate_computed_blocks_allows_short_mamba_group_only"),
    ("vllm.v1.core.block_pool.BlockPool.cache_partial_block", "54a77dbcc3075b47",
     "Partial-block caching needs a block size that is a multiple of the hash block size "
     "and a partial (not full) block.", "test_cache_partial_block_requires_hash_boundary"),
    ("vllm.v1.core.block_pool.BlockPool._get_partial_block_hash", "7ee3fc15a436bc35",
     "A partial block is cached only at a hash-block boundary, with its hashes computed "
     "(under -O it is cached under the wrong hash).",
     "test_cache_partial_block_requires_hash_boundary"),
    ("vllm.v1.core.single_type_kv_cache_manager.MambaManager._relocate_speculative_block",
     "32d614fc3b97c0e2",
     "Mamba/KDA state blocks relocated under speculative decoding (Kimi-K3's own setting) "
     "must be exclusively owned and unhashed: under -O a shared or cached block is "
     "overwritten.", "test_mamba_speculative_block_relocation_requires_exclusive_ownership"),
    ("vllm.v1.core.kv_cache_metrics.KVCacheMetricsCollector.__init__", "cba50dd7668339ea",
     "The KV-cache metrics sample rate must lie in (0, 1].",
     "TestKVCacheMetricsCollector::test_sample_rate_validation"),
    ("vllm.v1.kv_cache_interface.KVCacheSpec.is_uniform_with_collection", "4ef19e8e64d05bc6",
     "A KV-cache spec type the registry does not know is refused before the planner groups "
     "it (under -O: a TypeError from isinstance(None) instead).",
     "test_unregistered_spec_no_registered_parent_raises"),
    ("vllm.v1.kv_cache_spec_registry.KVCacheSpecRegistry.register", "5a4c0c716bfb14e7",
     "A registered KV-cache spec needs its manager class and must inherit from its uniform "
     "base spec; re-registration must agree (under -O a spec without a manager registers).",
     "test_custom_spec_register_requires_manager"),
    ("vllm.v1.cudagraph_dispatcher.CudagraphDispatcher.__init__", "061e25245ca76872",
     "Piecewise CUDA graphs need piecewise compilation of attention (or breakable graphs).",
     "TestCudagraphDispatcher::test_dispatcher"),
    # -- Mamba/KDA state copies (speculative decoding)
    ("vllm.v1.worker.mamba_utils.stage_postprocess_inputs_to_gpu", "fd28ca30f963fdd6",
     "Every request's Mamba state index must be known before the post-step state copy "
     "(under -O: a TypeError on None, or a copy to the wrong slot).",
     "test_stage_postprocess_inputs_to_gpu_asserts_on_missing_state_idx"),
    ("vllm.model_executor.layers.mamba.mamba_utils.get_conv_copy_spec", "d2b1bb55af7249cb",
     "The DS conv-state layout cannot copy from an offset when several draft tokens were "
     "accepted.", "test_ds_conv_copy_spec_reproduces_multi_accept_assert"),
    # -- KV connectors: NIXL (P/D disaggregation), multi-connector, Mooncake store, EC
    ("vllm.distributed.kv_transfer.kv_connector.v1.nixl.base_worker.NixlBaseConnectorWorker."
     "_apply_prefix_caching", "2295fb30384f2bd6",
     "Prefill and decode block lists must pair up (SSM state slots included) before blocks "
     "are transferred: under -O an unpairable slot transfers the wrong state.",
     "test_apply_prefix_caching_ssm_unpairable_slots_rejected"),
    ("vllm.distributed.kv_transfer.kv_connector.v1.nixl.base_worker.NixlBaseConnectorWorker."
     "_build_local_splits_from_plan", "281ade654450a742",
     "Heterogeneous block sizes need replicated (not head-sharded) FA descriptors.",
     "TestMambaPlanSplitHandles::test_hetero_block_size_head_sharded_asserts"),
    ("vllm.distributed.kv_transfer.kv_connector.v1.nixl.base_worker.NixlBaseConnectorWorker."
     "_fa_desc_replicated", "c8e1b8ba954216d6",
     "One replication flag per FA descriptor, and a transfer topology set.",
     "TestMambaPlanSplitHandles::test_hetero_block_size_head_sharded_asserts"),
    ("vllm.distributed.kv_transfer.kv_connector.v1.nixl.base_worker.NixlBaseConnectorWorker."
     "add_remote_agent", "58e0dc30799809a7",
     "A remote agent's handshake metadata must cover the layers addressed.",
     "TestNixlHandshake::test_handshake_mixed_fa_mla_hetero_tp"),
    ("vllm.distributed.kv_transfer.kv_connector.v1.nixl.base_worker.NixlBaseConnectorWorker."
     "_validate_remote_agent_handshake", "ae8450b9fcadc137",
     "The remote engine's TP/DCP sizes, block lengths, block-size ratio and block count "
     "must match the local layout before KV blocks are read from it (under -O a mismatched "
     "prefill engine is accepted and transfers land at wrong offsets).",
     "TestNixlHandshake::test_handshake_rejects_wrong_block_len_without_gqa_replication"),
    ("vllm.distributed.kv_transfer.kv_connector.v1.nixl.base_worker.NixlBaseConnectorWorker."
     "_build_fa_remote", "70692ade9ca19121",
     "The remote's KV-cache base addresses must be known before its FA descriptors are built.",
     "TestNixlHandshake::test_handshake_mixed_fa_mla_hetero_tp (reached from add_remote_agent)"),
    ("vllm.distributed.kv_transfer.kv_connector.v1.nixl.base_worker.NixlBaseConnectorWorker."
     "_build_mamba_remote", "42b60e65db8fa475",
     "The remote's base addresses and the conv decomposition must be known before its "
     "Mamba descriptors are built.",
     "TestNixlHandshake::test_handshake_mixed_fa_mla_hetero_tp (reached from add_remote_agent)"),
    ("vllm.distributed.kv_transfer.kv_connector.v1.nixl.base_worker.NixlBaseConnectorWorker."
     "register_local_xfer_handler", "e6cc1f101f5f8bd1",
     "The local transfer descriptors must number the blocks' descriptors times the "
     "block-size ratio.",
     "TestNixlHandshake::test_handshake_mixed_fa_mla_hetero_tp (reached from add_remote_agent)"),
    ("vllm.distributed.kv_transfer.kv_connector.v1.multi_connector.MultiConnector."
     "build_kv_connector_stats", "271215a81d037734",
     "Serialized connector stats must be dicts with a 'data' field (under -O: KeyError).",
     "TestMultiConnectorStats::test_build_kv_connector_stats_handles_malformed_data"),
    ("vllm.distributed.kv_transfer.kv_connector.v1.mooncake.store.scheduler."
     "MooncakeStoreScheduler.__init__", "80850083e8d09130",
     "The Mooncake store needs a KV-transfer config and, for Mamba groups, "
     "mamba_cache_mode='align'.", "test_scheduler_requires_align_mode_for_mamba"),
    ("vllm.distributed.kv_transfer.kv_connector.v1.mooncake.store.data.ChunkedTokenDatabase."
     "prepare_values", "b456d118f0c1033d",
     "Stored chunks must be aligned to the hash block size.",
     "test_prepare_values_rejects_unaligned_chunk"),
    ("vllm.distributed.kv_transfer.kv_connector.v1.offloading.metrics.OffloadPromMetrics."
     "observe", "0499ed94d3391c0f",
     "Offloading metrics must be declared and carry numbers (unknown keys and types it "
     "refuses explicitly, which -O keeps).", "test_prom_metrics_rejects_undeclared_metric"),
    ("vllm.distributed.ec_transfer.ec_connector.cpu.scheduler.embedding_cache.EmbeddingCache."
     "alloc", "ffd857ac4e4179d9",
     "The encoder-cache connector's CPU embedding cache: no duplicate key, no allocation "
     "beyond capacity.", "test_alloc_asserts_duplicate_key"),
    ("vllm.distributed.ec_transfer.ec_connector.cpu.scheduler.embedding_cache.EmbeddingCache."
     "mark_ready", "b83a37b7d5b55d15",
     "An embedding-cache entry is marked ready once.", "test_mark_ready_asserts_already_ready"),
    ("vllm.distributed.ec_transfer.ec_connector.cpu.scheduler.embedding_cache.EmbeddingCache."
     "pin", "a1542e67c1521379",
     "Only a ready embedding-cache entry is pinned.", "test_pin_asserts_not_ready"),
    ("vllm.distributed.ec_transfer.ec_connector.cpu.scheduler.embedding_cache.EmbeddingCache."
     "unpin", "d021b0c645c20446",
     "Only a pinned embedding-cache entry is unpinned (the pin count stays non-negative).",
     "test_unpin_asserts_on_unpinned"),
    ("vllm.distributed.ec_transfer.ec_connector.cpu.worker.ECCPUWorker.save_caches",
     "bf1368db0b8e5738",
     "Saved encoder outputs must fit the blocks allocated for them (under -O a copy "
     "overruns them).", "test_save_caches_raises_when_allocated_blocks_too_small"),
    ("vllm.distributed.ec_transfer.ec_connector.base.ECConnectorBase._get_connector_metadata",
     "77808126e1c182d0",
     "The encoder-cache connector's metadata must be bound before it is read.",
     "TestMetadataBindingLifecycle::test_get_connector_metadata_not_set"),
    # -- KV offload (CPU region, tiering)
    ("vllm.v1.kv_offload.cpu.shared_offload_region.SharedOffloadRegion."
     "create_next_worker_view", "3ba277b4e551d382",
     "A worker's view of the shared CPU offload region must end inside its area (under -O "
     "it overlaps the next worker's).", "test_create_next_worker_view_single_overflow_raises"),
    ("vllm.v1.kv_offload.tiering.p2p.control.zmq.ZmqTransport.connect", "7dad11ff77696c3c",
     "One live connection per peer in the P2P tier.",
     "TestZmqTransportConnectivity::test_duplicate_connect_asserts"),
    ("vllm.v1.kv_offload.tiering.async_lookup.AsyncLookupManager.drain_results",
     "efef4c4f8c475835",
     "A lookup's result is enqueued once.",
     "TestAsyncLookupManager::test_enqueue_once_invariant_enforced"),
    ("vllm.v1.kv_offload.tiering.factory.SecondaryTierFactory.get_tier_class",
     "8e4824a9e5d31f9c",
     "A secondary tier named by module path must be a SecondaryTierManager.",
     "test_module_path_not_subclass_raises"),
    ("vllm.v1.kv_offload.tiering.manager.TieringOffloadingManager."
     "_cascade_existing_blocks_to_request_level_tiers", "569ff8bd231d03d8",
     "Cascading to request-level tiers starts only from blocks the primary tier misses.",
     "TestTieringOffloadingManager::test_cascade_rejects_retry_from_primary"),
    ("vllm.v1.kv_offload.tiering.manager.TieringOffloadingManager.create_store_job",
     "92ea015839f8fd70",
     "A store job's primary blocks are CPU blocks.",
     "TestTieringOffloadingManager::test_cascade_rejects_retry_from_primary (reached from the "
     "cascade)"),
    # -- attention, sampling, Kimi-K3's MLA
    ("vllm.models.kimi_k3.nvidia.mla.MultiHeadLatentAttention._compute_prefill_context",
     "c0ccab2304b694cb",
     "Kimi-K3's chunked-context prefill expects the query quantized by the new-token "
     "epilogue (its dtype is the prefill's q dtype): under -O an unquantized query goes "
     "into the fused context kernel.", "test_fused_context_rejects_an_unquantized_query"),
    ("vllm.v1.attention.backends.mla.sparse_utils.triton_convert_req_index_to_global_index",
     "fa5946294ca21cca",
     "Sparse MLA index conversion: int32 inputs, request ids and token indices covering "
     "the same tokens, top-k a multiple of the block (GPU kernel).",
     "test_triton_convert_rejects_req_id_longer_than_token_indices"),
    ("vllm.v1.worker.gpu.sample.gumbel.gumbel_sample", "5cf78399a0edf724",
     "The logits cache must be at least as wide as the vocabulary.",
     "test_logits_cache_narrower_than_logits_is_rejected"),
    ("vllm.model_executor.layers.fusion.quant_activation.as_quantized_activation",
     "58b9ce90e4f82599",
     "A quantized activation is used only with the quantization key it was made for.",
     "test_as_quantized_activation_validates_key"),
    ("vllm.ir.op.register_op.<locals>.decorator", "8b82cb449de44a4c",
     "An IR op is registered once.", "test_registration_overloads"),
    ("vllm.ir.op.IrOp.register_impl", "410278c2222bc0fc",
     "An IR op implementation may not take a reserved provider name.",
     "TestIrOpImplDispatch::test_reserved_provider_rejected"),
    ("vllm.ir.op.IrOpImpl.__init__", "b6d1facbbdc2c437",
     "One implementation per provider and op; in-place variants only where allowed.",
     "TestIrOpImplDispatch::test_register_impl"),
    # -- compilation passes, MoE and EPLB, models, loaders
    ("vllm.compilation.passes.fusion.collective_fusion.AsyncTPPass.is_applicable_for_range",
     "ed2f9203601a5139", "The async-TP pass requires full-graph compilation.",
     "test_async_tp_pass_requires_full_graph_compilation"),
    ("vllm.compilation.passes.fusion.sequence_parallelism.SequenceParallelismPass."
     "is_applicable_for_range", "9559139ab10f1689",
     "The sequence-parallelism pass requires full-graph compilation.",
     "test_sequence_parallelism_pass_requires_full_graph_compilation"),
    ("vllm.compilation.passes.pass_manager.PostGradPassManager.add", "69d490854fbc37d8",
     "Custom post-grad passes must be InductorPass instances.", "test_bad_callable"),
    ("vllm.distributed.eplb.policy.default.DefaultEplbPolicy.rebalance_experts_hierarchical",
     "2ec5f91783431e00",
     "Hierarchical EPLB needs experts, groups, nodes and GPUs that divide evenly.",
     "test_parameter_validation (test_eplb_algo.py)"),
    ("vllm.distributed.eplb.eplb_state._commit_eplb_maps_for_layer", "66c5dd5b9d2f92fd",
     "An EPLB map is committed only with the shape of the one it replaces.",
     "test_commit_eplb_maps_for_layer_shape_assert"),
    ("vllm.distributed.eplb.eplb_state._pad_out_tensor", "4f5dbea1cada5018",
     "EPLB maps are padded, never truncated.",
     "test_commit_eplb_maps_for_layer_shape_assert (reached from the commit)"),
    ("vllm.distributed.eplb.eplb_state.compute_logical_maps", "ef5e6ab09aefb368",
     "The physical-to-logical expert map is a 2-D CPU tensor.",
     "test_commit_eplb_maps_for_layer_shape_assert (reached from the commit)"),
    ("vllm.model_executor.layers.fused_moe.expert_map_manager.determine_expert_map",
     "8e27af28e0210e65", "Expert placement needs a positive EP size.",
     "test_expert_placement_edge_cases"),
    ("vllm.model_executor.layers.fused_moe.routed_experts_capturer.RoutedExpertsCapturer."
     "capture", "b046e238b1768793",
     "Routed-expert capture under DP needs shard sizes that divide among the DP ranks (the "
     "batch-dimension check the test pins is an explicit raise, which -O keeps).",
     "test_routed_experts_capturer_dp_unexpected_batch_raises"),
    ("vllm.model_executor.models.whisper.WhisperForConditionalGeneration."
     "parse_language_detection_output", "98fe577ef15993fe",
     "Whisper's language detection must decode a <|xx|> token of a supported language.",
     "test_parse_language_detection_output"),
    ("vllm.model_executor.models.nano_nemotron_vl.NemotronH_Nano_VL_V2.load_weights."
     "<locals>.llm_weights_gen", "829b8a2a7048b8e7",
     "Sound-encoder weights need a model built with a sound encoder.",
     "test_nano_nemotron_vl_requires_sound_encoder_for_sound_weights"),
    ("vllm.model_executor.layers.quantization.inc.inc.INCConfig._validate_raw_config",
     "bf69580bcb989d85",
     "INC block-wise FP8 needs a tuple group size (the activation fields the tests pin are "
     "asserted one call deeper, in _check_expected).",
     "test_inc_config_rejects_invalid_block_fp8_activation_config"),
    ("vllm.utils.registry.ExtensionManager.load", "eb713adea2224bb4",
     "An extension (a video loader, say) must be registered under the name asked for "
     "(under -O: TypeError calling None).", "test_video_loader_type_doesnt_exist"),
)
for _name, _hash, _what, _tests in _PINNED:
    covered(_name, {_hash: _T}, O_PARITY, _what + " " + _PIN.format(tests=_tests))

covered("vllm.distributed.kv_transfer.kv_connector.v1.ssm_conv_transfer_utils."
        "derive_mamba_conv_split", {"37a19da46177f042": _T}, O_PARITY,
        "Its assert has a side effect: `assert is_conv_state_dim_first()` calls "
        "get_conv_state_layout(), which caches the conv-state layout for the process "
        "(lru_cache). Under -O the call goes with the assert and the layout is cached "
        "later, from another environment: vLLM's own test_mamba_utils.py tests change "
        "outcome after a NIXL test ran (the vLLM-suite tier's BY_HAND). -O parity keeps "
        "the assert, and with it plain Python's cache.")

_BY_NAME = (
    # (qualified name, hash, the call the test block makes)
    ("vllm.outputs.RequestOutput.add", "bc1054d1cc1bafaf", "pass_manager.add"),
    ("vllm.v1.worker.gpu.cudagraph_utils.CudaGraphManager.capture", "f4cad02c62af70a4",
     "capturer.capture (a RoutedExpertsCapturer)"),
    ("vllm.v1.worker.gpu.mm.encoder_runner.EncoderRunner.capture", "a40e9a392a50e60d",
     "capturer.capture (a RoutedExpertsCapturer)"),
    ("vllm.v1.worker.gpu.spec_decode.autoregressive.speculator.AutoRegressiveSpeculator."
     "capture", "14e3967e7a53c8b1", "capturer.capture (a RoutedExpertsCapturer)"),
    ("vllm.v1.worker.gpu.spec_decode.dflash.speculator.DFlashSpeculator.capture",
     "453fc1213ca479b8", "capturer.capture (a RoutedExpertsCapturer)"),
    ("vllm.v1.worker.gpu.spec_decode.multi_module_mtp.speculator.MultiModuleMTPSpeculator."
     "capture", "5be09a34204aef32", "capturer.capture (a RoutedExpertsCapturer)"),
    ("vllm.model_executor.layers.attention.mla_attention.MLACommonBaseImpl."
     "_compute_prefill_context", "48deab9a45dea0d8",
     "layer._compute_prefill_context (Kimi-K3's MultiHeadLatentAttention)"),
    ("vllm.model_executor.layers.attention.mla_attention.accumulate_mla_context_chunk",
     "a086fefec988a508", "layer._compute_prefill_context (Kimi-K3's MultiHeadLatentAttention)"),
    ("vllm.models.kimi_k3.nvidia.mla.MultiHeadLatentAttention._compute_prefill_context."
     "<locals>.run_chunk", "05c6b1d9e4e1a077",
     "layer._compute_prefill_context: its query check fails first"),
    ("vllm.compilation.compiler_interface.InductorAdaptor.load", "8e288bc900f13d89",
     "VIDEO_LOADER_REGISTRY.load and a video loader's load_bytes"),
    ("vllm.compilation.compiler_interface.InductorStandaloneAdaptor.load", "d9d219742f21d2b9",
     "VIDEO_LOADER_REGISTRY.load and a video loader's load_bytes"),
    ("vllm.compilation.backends.CompilerManager.load.<locals>.parse_value", "02e704449f390ed8",
     "VIDEO_LOADER_REGISTRY.load"),
    ("vllm.third_party.tml_fa4.flash_fwd_sm100.FlashAttentionForwardSm100.load",
     "45273f40fa8a18f8", "VIDEO_LOADER_REGISTRY.load and a video loader's load_bytes"),
    ("vllm.third_party.tml_fa4.paged_kv.PagedKVManager.create", "6b994cd42097e00d",
     "VIDEO_LOADER_REGISTRY.load"),
    ("vllm.third_party.tml_fa4.pipeline.make_pipeline_state", "5f44063edbed11cb",
     "VIDEO_LOADER_REGISTRY.load"),
    ("vllm.vllm_flash_attn.cute.flash_bwd_sm100.FlashAttentionBackwardSm100.load",
     "5d010aa1219bdfc3", "VIDEO_LOADER_REGISTRY.load and a video loader's load_bytes"),
    ("vllm.vllm_flash_attn.cute.flash_fwd_sm100.FlashAttentionForwardSm100.load",
     "febe98a4e8588853", "VIDEO_LOADER_REGISTRY.load and a video loader's load_bytes"),
    ("vllm.vllm_flash_attn.cute.paged_kv.PagedKVManager.create", "57865950b4c529ad",
     "VIDEO_LOADER_REGISTRY.load"),
    ("vllm.distributed.device_communicators.base_device_communicator.DeviceCommunicatorBase."
     "gather", "4015c1b32d978eef", "a tensor's gather in gumbel_sample"),
    ("vllm.distributed.device_communicators.cpu_communicator.CpuCommunicator.gather",
     "2d4976a4c6aacbc0", "a tensor's gather in gumbel_sample"),
    ("vllm.distributed.device_communicators.xpu_communicator.XpuCommunicator.gather",
     "dadc70b5dd261534", "a tensor's gather in gumbel_sample"),
    ("vllm.distributed.ec_transfer.ec_connector.cpu.connector.ECCPUConnector.save_caches",
     "5aa35a69acd9437c", "worker.save_caches (an ECCPUWorker)"),
    ("vllm.distributed.kv_transfer.kv_connector.v1.base.KVConnectorBase_V1."
     "_get_connector_metadata", "cee1aeffbd6dafe5",
     "connector._get_connector_metadata (an encoder-cache connector)"),
    ("vllm.distributed.kv_transfer.kv_connector.v1.lmcache_mp_connector."
     "LMCacheMPConnectorUpstream._get_connector_metadata", "cee1aeffbd6dafe5",
     "connector._get_connector_metadata (an encoder-cache connector)"),
    ("vllm.distributed.kv_transfer.kv_connector.v1.metrics.KVConnectorLogging.observe",
     "4543fbf31217798e", "prom_metrics.observe (OffloadPromMetrics)"),
    ("vllm.distributed.kv_transfer.kv_connector.v1.mooncake.store.metrics."
     "MooncakeStorePromMetrics.observe", "1685427af530761d",
     "prom_metrics.observe (OffloadPromMetrics)"),
    ("vllm.distributed.kv_transfer.kv_connector.v1.multi_connector.MultiKVConnectorPromMetrics."
     "observe", "64394d9eb3a2b2aa", "prom_metrics.observe (OffloadPromMetrics)"),
    ("vllm.v1.metrics.perf.PerfMetricsDebugLogging.observe", "887f2a9a5939fc99",
     "prom_metrics.observe (OffloadPromMetrics)"),
    ("vllm.v1.metrics.perf.PerfMetricsLogging.observe", "c961d5bf0b2cc7e7",
     "prom_metrics.observe (OffloadPromMetrics)"),
)
_LOAD_WEIGHTS = "model.load_weights (a NemotronH_Nano_VL_V2)"
_BY_NAME += tuple((_name, _hash, _LOAD_WEIGHTS) for _name, _hash in (
    ("vllm.model_executor.models.AXK1.AXK1Model.load_weights", "bd171505eb2a184b"),
    ("vllm.model_executor.models.colpali.ColPaliModel.load_weights", "5f9511f3b82c3fab"),
    ("vllm.model_executor.models.deepseek_mtp.DeepSeekMTP.load_weights", "419cc61de8ac0131"),
    ("vllm.model_executor.models.deepseek_v2.DeepseekV2Model.load_weights", "2e79bd06565e6be5"),
    ("vllm.model_executor.models.glm4_moe_lite.Glm4MoeLiteModel.load_weights", "5d5bbb55335aa5e5"),
    ("vllm.model_executor.models.glm4_moe_lite_mtp.Glm4MoeLiteMTP.load_weights",
     "30b7b9d0a8d9d75c"),
    ("vllm.model_executor.models.hy_v3_mtp.HYV3MTP.load_weights", "2af0f5a8d690b77f"),
    ("vllm.model_executor.models.longcat_flash.FlashModel.load_weights", "edc1e269d226a516"),
    ("vllm.model_executor.models.medusa.Medusa.load_weights", "334d3a84bf95deb1"),
    ("vllm.model_executor.models.mllama4.Llama4ForConditionalGeneration.load_weights",
     "b8c5b00398d70c47"),
    ("vllm.model_executor.models.qwen3_dflash.DFlashQwen3ForCausalLM.load_weights",
     "70296fee4a3019b3"),
    ("vllm.model_executor.models.step3p5.Step3p5Model.load_weights", "4e34d84d7723237c"),
    ("vllm.model_executor.models.step3p5_mtp.Step3p5MTP.load_weights", "1f828f8d02543bda"),
    ("vllm.models.deepseek_v32.amd.mtp.DeepseekV32MTP.load_weights", "99c95b88b4d9efe2"),
    ("vllm.model_executor.layers.quantization.utils.int8_utils.block_dequant",
     "326b62525e63c5b7"),
    ("vllm.model_executor.model_loader.weight_utils.default_weight_loader", "e5d2eaa4098a102d"),
    ("vllm.model_executor.model_loader.weight_utils.get_quant_config", "775440c2a5d2d6e2"),
    ("vllm.model_executor.models.bailing_moe_v3."
     "_maybe_pad_block_fp8_shared_expert_checkpoint_tensor", "812749d4a06f61e1"),
    ("vllm.model_executor.models.colbert.ColBERTMixin._load_colbert_weights", "f17522dce0389b7e"),
    ("vllm.model_executor.models.gpt_oss.GptOssModel._load_weights_quark", "07ecbc19a291ce77"),
    ("vllm.model_executor.models.llama4.Llama4Model.load_moe_expert_weights", "16925b11f160cc3d"),
    ("vllm.model_executor.models.utils.extract_layer_index", "b9f9d60704f06ad1"),
    ("vllm.models.deepseek_v4.nvidia.model.DeepseekV4Model._pad_shared_expert_weight",
     "c7c13adc991ca09d"),
))
for _name, _hash, _call in _BY_NAME:
    harmless(_name, {_hash: _T},
             f"By-name match only: a test's pytest.raises block calls {_call}, which the audit "
             "resolves to every function of that name; this one is not what the test runs, "
             "and it is vLLM's own, so -O parity keeps its asserts wherever it does run.")

# The test sites (pytest.raises(AssertionError) blocks), keyed by the test function:
# where the AssertionError the test expects comes from, and what -O does to the test.
_SITE_PINS = ("The test expects the AssertionError of {guard}, a bare assert of vLLM's: under "
              "-O without the shim it is stripped and the test fails; -O parity restores it.")
_TEST_SITES_COVERED = (
    # (test qualname, hash, the vLLM assert the block ends in)
    ("tests.v1.core.test_kv_cache_utils.test_free_kv_cache_block_queue_append_n",
     "4c8598626eab1c77", "FreeKVCacheBlockQueue.append_n"),
    ("tests.v1.core.test_kv_cache_utils.test_get_kv_cache_configs_multiple_workers",
     "53d977810286f4b9", "get_kv_cache_configs (workers' specs must agree)"),
    ("tests.v1.core.test_kv_cache_utils.test_merge_kv_cache_spec", "dd83a89bb2a66710",
     "the spec merges (KVCacheSpec.merge, FullAttentionSpec.merge)"),
    ("tests.v1.core.test_kv_cache_utils.test_merge_mla_spec", "9bad58d0054bcd50",
     "MLAAttentionSpec.merge (cache dtypes and layer types must agree)"),
    ("tests.v1.core.test_kv_cache_utils.test_resolve_block_hashes_rejects_mismatched_view",
     "48f419f73c9d4b2a", "resolve_block_hashes"),
    ("tests.v1.core.prefix_cache.test_partial_prefix_cache_hits."
     "test_truncate_computed_blocks_allows_short_mamba_group_only", "a64f6ea26bfc451e",
     "KVCacheManager.truncate_computed_blocks"),
    ("tests.v1.core.prefix_cache.test_partial_prefix_cache_primitives."
     "test_cache_partial_block_requires_hash_boundary", "d3bb42d23c68ec3d",
     "BlockPool._get_partial_block_hash"),
    ("tests.v1.core.test_kv_cache_metrics.TestKVCacheMetricsCollector."
     "test_sample_rate_validation", "22e95386e96a8a6e", "KVCacheMetricsCollector.__init__"),
    ("tests.v1.core.test_single_type_kv_cache_manager."
     "test_mamba_speculative_block_relocation_requires_exclusive_ownership",
     "1f2ae2c651797135", "MambaManager._relocate_speculative_block"),
    ("tests.v1.test_kv_cache_spec_registry.TestKVCacheSpecRegistry."
     "test_custom_spec_register_requires_manager", "5d43988e0f530410",
     "KVCacheSpecRegistry.register (reached through the register_kv_cache_spec decorator)"),
    ("tests.v1.test_kv_cache_spec_registry.TestKVCacheSpecRegistry."
     "test_unregistered_spec_no_registered_parent_raises", "128e40656d2e451a",
     "KVCacheSpec.is_uniform_with_collection"),
    ("tests.v1.cudagraph.test_cudagraph_dispatch.TestCudagraphDispatcher.test_dispatcher",
     "94fc91fc3aa3a704", "CudagraphDispatcher.__init__"),
    ("tests.v1.worker.test_mamba_utils."
     "test_stage_postprocess_inputs_to_gpu_asserts_on_missing_state_idx", "be616e88be4ceb01",
     "stage_postprocess_inputs_to_gpu"),
    ("tests.kernels.mamba.test_precopy_mamba_align."
     "test_ds_conv_copy_spec_reproduces_multi_accept_assert", "8b2e838131915340",
     "get_conv_copy_spec"),
    ("tests.v1.kv_connector.unit.test_nixl_connector_hma."
     "test_apply_prefix_caching_ssm_unpairable_slots_rejected", "1b12c8fca8a4827e",
     "NIXL's _apply_prefix_caching"),
    ("tests.v1.kv_connector.unit.test_tp_mapping.TestMambaPlanSplitHandles."
     "test_hetero_block_size_head_sharded_asserts", "9ac83a87b0fb0920",
     "NIXL's _build_local_splits_from_plan"),
    ("tests.v1.kv_connector.unit.test_nixl_connector.TestNixlHandshake."
     "test_handshake_mixed_fa_mla_hetero_tp", "3f7958f2f5a8d47f",
     "NIXL's handshake validation (_validate_remote_agent_handshake)"),
    ("tests.v1.kv_connector.unit.test_nixl_connector.TestNixlHandshake."
     "test_handshake_rejects_wrong_block_len_without_gqa_replication", "3bb75446286388d6",
     "NIXL's handshake validation (_validate_remote_agent_handshake)"),
    ("tests.v1.kv_connector.unit.test_nixl_desc_geometry."
     "test_mismatched_mla_kernel_page_rejected_for_mla_hybrid", "309de6a13fafb9c3",
     "NIXL's handshake validation (the block lengths of an MLA hybrid)"),
    ("tests.v1.kv_connector.unit.test_multi_connector.TestMultiConnectorStats."
     "test_build_kv_connector_stats_handles_malformed_data", "b5a3ef3f2e40cd1c",
     "MultiConnector.build_kv_connector_stats"),
    ("tests.v1.kv_connector.unit.test_mooncake_store_connector."
     "test_scheduler_requires_align_mode_for_mamba", "b0eb2b1a442d3412",
     "MooncakeStoreScheduler.__init__"),
    ("tests.v1.kv_connector.unit.test_mooncake_store_prepare_values."
     "test_prepare_values_rejects_unaligned_chunk", "a2c8ecc8df65facb",
     "ChunkedTokenDatabase.prepare_values"),
    ("tests.v1.kv_connector.unit.offloading_connector.test_metrics."
     "test_prom_metrics_rejects_undeclared_metric", "08139696b832674b",
     "OffloadPromMetrics.observe (a declared type, an undeclared metric)"),
    ("tests.v1.ec_connector.unit.cpu.scheduler.test_embedding_cache."
     "test_alloc_asserts_duplicate_key", "1fa0ae81c9b89e8e", "EmbeddingCache.alloc"),
    ("tests.v1.ec_connector.unit.cpu.scheduler.test_embedding_cache."
     "test_alloc_asserts_n_blocks_exceeds_capacity", "80d05c9cc1bf32be", "EmbeddingCache.alloc"),
    ("tests.v1.ec_connector.unit.cpu.scheduler.test_embedding_cache."
     "test_mark_ready_asserts_already_ready", "293ab65b62513fb6", "EmbeddingCache.mark_ready"),
    ("tests.v1.ec_connector.unit.cpu.scheduler.test_embedding_cache."
     "test_pin_asserts_not_ready", "8e902634cce8ab74", "EmbeddingCache.pin"),
    ("tests.v1.ec_connector.unit.cpu.scheduler.test_embedding_cache."
     "test_unpin_asserts_on_unpinned", "a0757f11af46c4de", "EmbeddingCache.unpin"),
    ("tests.v1.ec_connector.unit.cpu.worker.test_worker."
     "test_save_caches_raises_when_allocated_blocks_too_small", "55fd47a3ea6fe608",
     "ECCPUWorker.save_caches"),
    ("tests.v1.ec_connector.unit.test_ec_example_connector.TestMetadataBindingLifecycle."
     "test_get_connector_metadata_not_set", "37f2908d3e213f17",
     "ECConnectorBase._get_connector_metadata"),
    ("tests.v1.kv_offload.cpu.test_shared_offload_region."
     "test_create_next_worker_view_single_overflow_raises", "1de5a4232d42ed08",
     "SharedOffloadRegion.create_next_worker_view"),
    ("tests.v1.kv_offload.cpu.test_shared_offload_region."
     "test_create_next_worker_view_cumulative_overflow_raises", "0296eed15d034b5b",
     "SharedOffloadRegion.create_next_worker_view"),
    ("tests.v1.kv_offload.cpu.test_shared_offload_region."
     "test_create_next_worker_view_overflow_does_not_mutate_cursor", "d200ba9cb439fe1c",
     "SharedOffloadRegion.create_next_worker_view"),
    ("tests.v1.kv_offload.tiering.p2p.test_zmq_transport.TestZmqTransportConnectivity."
     "test_duplicate_connect_asserts", "772b8dc4fdbae813", "ZmqTransport.connect"),
    ("tests.v1.kv_offload.tiering.test_async_lookup.TestAsyncLookupManager."
     "test_enqueue_once_invariant_enforced", "89ef8eb817cdd266",
     "AsyncLookupManager.drain_results"),
    ("tests.v1.kv_offload.tiering.test_factory.test_module_path_not_subclass_raises",
     "3f79af00ffa546f7", "SecondaryTierFactory.get_tier_class"),
    ("tests.v1.kv_offload.tiering.test_tiering_offloading.TestTieringOffloadingManager."
     "test_cascade_rejects_retry_from_primary", "ca1c91a5b2b233ac",
     "TieringOffloadingManager._cascade_existing_blocks_to_request_level_tiers"),
    ("tests.models.kimi_k3.test_mla_prefill_context."
     "test_fused_context_rejects_an_unquantized_query", "f332f99d7fb973f5",
     "Kimi-K3's MultiHeadLatentAttention._compute_prefill_context (reached by name)"),
    ("tests.v1.attention.test_sparse_mla_backends."
     "test_triton_convert_rejects_req_id_longer_than_token_indices", "7a2564e315d17e5b",
     "triton_convert_req_index_to_global_index"),
    ("tests.v1.attention.test_group_head_counts."
     "test_mixed_head_counts_in_one_group_are_rejected", "38361359f7530407",
     "vllm/v1/attention/backends/utils.py's group head count (every layer of an attention "
     "group shares num_heads), reached through the test's own builder, beyond the audit's "
     "depth"),
    ("tests.v1.worker.test_gpu_gumbel_sample."
     "test_logits_cache_narrower_than_logits_is_rejected", "9bf3011e2962eede", "gumbel_sample"),
    ("tests.fusion.test_quant_activation_contract.test_as_quantized_activation_validates_key",
     "f46498acd990705c", "as_quantized_activation"),
    ("tests.ir.test_op.test_registration_overloads", "fbb60e3c8f00ab7f",
     "register_op's decorator (an op registered twice)"),
    ("tests.ir.test_op.TestIrOpImplDispatch.test_register_impl", "c8506e42d89bc853",
     "IrOpImpl.__init__ (a provider registered twice)"),
    ("tests.ir.test_op.TestIrOpImplDispatch.test_reserved_provider_rejected",
     "292c5c3adccc8d03", "IrOp.register_impl"),
    ("tests.compile.passes.distributed.test_async_tp."
     "test_async_tp_pass_requires_full_graph_compilation", "6928b1866c9477ea",
     "AsyncTPPass.is_applicable_for_range"),
    ("tests.compile.passes.distributed.test_sequence_parallelism."
     "test_sequence_parallelism_pass_requires_full_graph_compilation", "2f9c991b804c5503",
     "SequenceParallelismPass.is_applicable_for_range"),
    ("tests.compile.passes.test_pass_manager.test_bad_callable", "9f95268e2443291a",
     "PostGradPassManager.add"),
    ("tests.distributed.test_eplb_algo.test_parameter_validation", "7c65380b1fd193e0",
     "DefaultEplbPolicy.rebalance_experts_hierarchical"),
    ("tests.distributed.test_eplb_utils.test_commit_eplb_maps_for_layer_shape_assert",
     "7fc8a41bf9e7b348", "_commit_eplb_maps_for_layer"),
    ("tests.distributed.test_expert_placement.test_expert_placement_edge_cases",
     "7b24943a2180ae8c", "determine_expert_map"),
    ("tests.distributed.test_ray_v2_executor.test_ray_v2_invalid_bundle_indices",
     "e38c457a613e99ed",
     "ray_utils.get_bundles_for_indices (VLLM_RAY_BUNDLE_INDICES: the world size, no "
     "duplicates), reached from the Ray executor's start beyond the audit's depth"),
    ("tests.kernels.attention.test_attention.test_num_heads_not_divisible_by_num_kv_heads",
     "1ea89d3b6c838a2f",
     "Attention's and MMEncoderAttention's constructors (num_heads divisible by "
     "num_kv_heads; the class is a test parameter, which the audit does not resolve)"),
    ("tests.kernels.quantization.test_triton_w4a16."
     "test_triton_w4a16_gemm_requires_contiguous_inputs", "9d1c95ab1ef6a647",
     "triton_w4a16_gemm (contiguous inputs; the test loads the module with importlib, which "
     "the audit does not follow)"),
    ("tests.lora.test_fused_moe_lora_kernel."
     "test_fused_moe_lora_kernel_rejects_bad_block_size_m", "7378f62b341bb96f",
     "fused_moe_lora's block sizes (shrink_block_size_m == expand_block_size_m), beyond the "
     "audit's depth from the test's own helper"),
    ("tests.models.multimodal.generation.test_whisper.test_parse_language_detection_output",
     "f332662680f54e23", "WhisperForConditionalGeneration.parse_language_detection_output"),
    ("tests.models.multimodal.test_nano_nemotron_vl."
     "test_nano_nemotron_vl_requires_sound_encoder_for_sound_weights", "e57938e867bbfdbe",
     "NemotronH_Nano_VL_V2.load_weights' llm_weights_gen (reached by name)"),
    ("tests.multimodal.test_video.test_video_loader_type_doesnt_exist", "7e95de2a37906bb2",
     "ExtensionManager.load"),
    ("tests.quantization.test_auto_round."
     "test_inc_config_rejects_invalid_mxfp8_activation_config", "3f2d8c5822345b78",
     "INCConfig._check_expected, one call beyond the audit's depth"),
    ("tests.quantization.test_auto_round."
     "test_inc_config_rejects_invalid_block_fp8_activation_config", "18bdb2d744e6fea9",
     "INCConfig._check_expected, one call beyond the audit's depth"),
)
for _name, _hash, _guard in _TEST_SITES_COVERED:
    covered(_name, {_hash: _T}, O_PARITY, _SITE_PINS.format(guard=_guard))
harmless("tests.v1.attention.test_mla_noncausal.test_mla_cache_marker_is_a_group_property",
         {"d08b84a4ec3f2176": _T},
         "The test pins 0.29.0's MLAAttentionSpec.merge refusing a marked (DSpark draft) and "
         "an unmarked MLA spec: under -O without the shim the assert is stripped and the "
         "test fails. With the shim the merge takes the capability with any(), upstream's "
         "fix (vLLM PR #55234, 0.30.0), plain and -O alike, so -O changes nothing there; "
         "the vLLM-suite tier allows this test's difference (ALLOWED). The merge's other "
         "asserts are -O parity's (its own row).")
_TEST_SITES_KEPT = (
    # (test qualname, hash, where the AssertionError comes from: -O keeps it)
    ("tests.model_executor.test_routed_experts_capture."
     "test_routed_experts_capturer_dp_unexpected_batch_raises", "b23ac07a953d4518",
     "RoutedExpertsCapturer.capture raises it explicitly (raise AssertionError)"),
    ("tests.v1.kv_connector.unit.offloading_connector.test_metrics."
     "test_prom_metrics_rejects_wrong_label_count", "b8cddd88b50cdfd9",
     "OffloadPromMetrics._get_prometheus_metric raises it explicitly (raise AssertionError)"),
    ("tests.multimodal.test_video.test_torchcodec_backend_rejects_frame_recovery",
     "84ea14570ffdb30a",
     "vllm/multimodal/video_decoders raises it explicitly (raise error, error = "
     "AssertionError for torchcodec)"),
    ("tests.multimodal.media.test_video.test_video_media_io_kwargs", "13c98e504834a203",
     "the video loader the test registers itself (assert_10_frames_1_fps): the test's own "
     "asserts, which pytest rewrites"),
    ("tests.kernels.attention.test_minimax_m3.test_padded_main_cache_is_flagged",
     "0a2c4611871d121d", "the test's own nested helper's asserts, which pytest rewrites"),
    ("tests.kernels.helion.test_benchmark_script."
     "test_check_correctness_reports_mutated_input_mismatch", "3e79c620761a39ff",
     "the sdist's scripts/benchmark_helion_kernels.py (not vLLM's package): its numerics "
     "check raises explicitly or through torch.testing"),
    ("tests.kernels.helion.test_benchmark_script."
     "test_check_correctness_reports_return_value_mismatch", "44ce710dcda2f211",
     "the sdist's scripts/benchmark_helion_kernels.py (not vLLM's package): its numerics "
     "check raises explicitly or through torch.testing"),
    ("tests.entrypoints.openai.chat_completion.test_chat.test_response_format_json_schema",
     "dcdd0029f8eb462d", "the test's own assert on a served response"),
    ("tests.v1.e2e.general.test_async_scheduling.run_test", "9a621e84b2ec2a51",
     "the tests' helper check_outputs_equal (tests/models/utils.py), whose asserts pytest "
     "rewrites"),
)
for _name, _hash, _source in _TEST_SITES_KEPT:
    harmless(_name, {_hash: _T},
             f"The AssertionError the test expects comes from {_source}: -O keeps it, so the "
             "test passes under -O as in plain Python; no vLLM assert is in play.")


# -- covered rows: each patch lists the sites it covers in its own covers.py --------------

def _patch_rows():
    """``covered`` rows from ``kimi_hotfix.patches.<name>.covers.COVERS``:
    (qualified name, {hash: release}, why) triples, kept next to the patch."""
    for name in PATCHES:
        modname = f"kimi_hotfix.patches.{name}.covers"
        try:
            spec = importlib.util.find_spec(modname)
        except ModuleNotFoundError:  # a patch that is one module, not a package
            spec = None
        if spec is None:
            continue
        for qualname, hashes, why in importlib.import_module(modname).COVERS:
            covered(qualname, hashes, name, why)


_patch_rows()

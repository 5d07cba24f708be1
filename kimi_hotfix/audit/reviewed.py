"""The one reviewed table: what each AssertionError-steered site does under ``-O``.

Keyed by qualified name and the normalised source hash of the function
(kimi_hotfix.audit.summary.source_hash: formatting, comments and docstrings do
not count; any change to code does). A function found with a hash that is not
listed here shows as "not reviewed (changed since review)", whatever its name
says. Each row was decided by reading the function in the release named next
to its hash, and its callers where the row says so.

Verdicts:
  covered    the shim restores plain-Python behaviour there: ``o_parity`` (-O
             parity, kimi_hotfix.parity: every assert of vLLM's own modules) or
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

from kimi_hotfix.patches import PATCH_MODULES

O_PARITY = "o_parity"  # -O parity (kimi_hotfix.parity): armed by the shim, not a registry patch

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


TABLE: dict = {}  # qualname -> [Review]


def _add(qualname, hashes, verdict, why, patch=""):
    if verdict not in VERDICTS:
        raise ValueError(f"unknown verdict {verdict!r} for {qualname}")
    if (verdict == COVERED) != bool(patch):
        raise ValueError(f"{qualname}: 'covered' names a patch, other verdicts none")
    TABLE.setdefault(qualname, []).append(Review(qualname, dict(hashes), verdict, why, patch))


def covered(qualname, hashes, patch, why):
    _add(qualname, hashes, COVERED, why, patch)


def harmless(qualname, hashes, why):
    _add(qualname, hashes, HARMLESS, why)


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
         _GROUPS.format(name="DCP"))
harmless(_PS + "get_pcp_group", {"c2da8fcf1827620a": "0.29.0-0.33.0"},
         _GROUPS.format(name="PCP"))
harmless(_PS + "get_tp_group", {"8ca9538f9b9a4bfb": "0.29.0-0.33.0"},
         _GROUPS.format(name="TP") + " Outside workers see the Inkling row.")
harmless(_PS + "get_pp_group", {"94f562d98e743ddf": "0.30.0-0.33.0"},
         _GROUPS.format(name="PP"))
harmless(_PS + "get_world_group", {"4e6a8dcd6ea653c7": "0.29.0-0.33.0"},
         "init_distributed_environment creates the world group in every worker before "
         "weights load; the except path serves unit tests.")
harmless(_PS + "get_ep_group", {"4a9d947711dca489": "0.33.0"},
         "By-name match only (P2P tier manager: a 'get' on a dict of sessions reaches "
         "SingleWriterShmObjectStorage.get, which calls this getter); not the call guarded "
         "there.")

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
    harmless(_name, _hashes, _GROUP_SITE)

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
         "callers outside a forward pass (unit tests).")
harmless("vllm.model_executor.layers.fused_moe.prepare_finalize.moonep."
         "MoonEPPrepareAndFinalize.prepare", {"4ffc985ad8005059": "0.33.0"},
         "prepare() runs inside a model forward pass, in a forward context; the fallback "
         "serves tests. Same with and without -O in a server.")
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


# -- covered rows: each patch lists the sites it covers in its own covers.py --------------

def _patch_rows():
    """``covered`` rows from ``kimi_hotfix.patches.<name>.covers.COVERS``:
    (qualified name, {hash: release}, why) triples, kept next to the patch."""
    for name in PATCH_MODULES:
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

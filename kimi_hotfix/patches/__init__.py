"""The patch registry: one module (or subpackage) per patch, named here with
the vLLM module whose import triggers it.

Each defines ``PATCH``, an instance of a ``kimi_hotfix.runtime.patching.Patch`` subclass
(its ``target`` is the module named here: a unit test keeps them equal), and
its header says why it exists, what it changes, the upstream fix and the vLLM
release that carries it, and how the patch decides it is no longer needed.
A process loads a patch's module when vLLM imports its target, not before:
arming reads this table only. Adding a patch is its module plus one line
below (DEVELOPING.md); the README's table is generated from the patches'
metadata (scripts/docs).
"""

PATCHES = {
    "kv_spec_merge": "vllm.v1.kv_cache_interface",
    "capture_workspace": "vllm.v1.worker.gpu.cudagraph_utils",
    "kda_overlong_rows": "vllm.models.kimi_k3.nvidia.kda_metadata",
}
PATCH_MODULES = tuple(PATCHES)

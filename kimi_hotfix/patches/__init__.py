"""The table of patches: each patch's name (its folder under kimi_hotfix/patches/)
and the vLLM module whose import triggers it. Arming reads this table only;
the registry (kimi_hotfix.runtime.registry) loads a patch's folder when vLLM
imports its target, and gives the patch its name and target from here.

A patch's folder: ``__init__.py``, what a vLLM process runs (the ``Patch``
subclass and ``PATCH``; its header says why it exists, what it changes, the
upstream fix and the release that carries it, and how the patch decides it is
no longer needed); ``about.py``, what the tools say about it
(kimi_hotfix.tools.about); ``probe.py``, its preflight probe (``check``);
``standins.py``, the stand-in target modules the unit tier builds
(tests/standins/vllm_tree.py); where the audit has rows the patch covers,
``covers.py`` (kimi_hotfix.tools.audit.reviewed). Adding a patch: ``scripts/new-patch NAME
MODULE:QUALNAME`` (DEVELOPING.md).
"""

PATCHES = {
    "kv_spec_merge": "vllm.v1.kv_cache_interface",
    "capture_workspace": "vllm.v1.worker.gpu.cudagraph_utils",
    "kda_overlong_rows": "vllm.models.kimi_k3.nvidia.kda_metadata",
}

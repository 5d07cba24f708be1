"""One module per patch. Each defines ``PATCH``, an instance of
``kimi_hotfix.core.Patch`` whose module header says why it exists, what it
changes, the upstream fix and the vLLM release that carries it, and how the
patch decides it is no longer needed. Importing these modules imports neither
vLLM nor wrapt: that happens in ``check``/``apply``, after vLLM loaded them.

| name               | target module                                 | upstream       | fixed in |
|--------------------|-----------------------------------------------|----------------|----------|
| kv_spec_merge      | vllm.v1.kv_cache_interface                    | PR #55234 (#54649) | 0.30.0 (capability); -O asserts: not yet |
| capture_workspace  | vllm.v1.worker.gpu.cudagraph_utils            | PR #55774      | 0.30.0   |
| kda_overlong_rows  | vllm.models.kimi_k3.nvidia.kda_metadata       | PR #55774 follow-up | 0.31.0 |
"""

PATCH_MODULES = ("kv_spec_merge", "capture_workspace", "kda_overlong_rows")

"""The ``-O`` audit's sites this patch covers (python -m kimi_hotfix audit).

Rows of kimi_hotfix.audit.reviewed, kept next to the patch: (qualified name,
{normalised source hash: the release it was reviewed in}, why). Read only by
the audit, never when vLLM is imported.
"""

COVERS = (
    ("vllm.distributed.parallel_state.get_inner_dp_world_group",
     {"7f6ca7e4dca1e0cc": "0.29.0-0.33.0"},
     "The inner-DP world group exists only when a DP replica spans nodes "
     "(nnodes_within_dp > 1); otherwise the getter asserts and "
     "kv_offload/cpu/spec.py falls back to the world group. Under -O it returns None "
     "and the CPU KV offload barrier fails with AttributeError at worker start-up "
     "(measured: tests/real/test_o_parity.py). inner_dp_group makes it raise."),
    ("vllm.v1.kv_offload.cpu.spec._all_workers_barrier", {"e1651cbe5deffb59": "0.29.0-0.33.0"},
     "CPU KV offload on CUDA/XPU (the shared mmap region) calls this barrier when the "
     "worker is created. Plain Python: get_inner_dp_world_group() asserts unless a DP "
     "replica spans nodes, and the barrier runs on the world group. -O: the getter "
     "returns None and None.barrier() raises AttributeError: the worker fails to start "
     "(single node, or multi-node under Ray, where parallel_config.nnodes stays 1). "
     "inner_dp_group restores the AssertionError."),
)

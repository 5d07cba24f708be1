"""Stand-ins for capture_workspace (the unit tier's fake vLLM, tests/standins/vllm_tree.py;
NOT vLLM, never imported by a vLLM process).

COMPLETE: each module as it looks where the patch applies. RENAMED: the target
with the symbols the patch wraps renamed away (the tree adds HOST_VALUE), and
RENAMED_STATE, the state the patch reads there: it warns, skips, the host runs.
"""

COMPLETE = {
    "vllm.v1.worker.gpu.cudagraph_utils": '''\
"""Stand-in (shim mechanics only, NOT vLLM): CudaGraphManager._init_candidates
without the RecoverSSM bound, so capture_workspace applies."""
from types import SimpleNamespace


class CudaGraphManager:
    def __init__(self, sizes, max_num_reqs=4, decode_query_len=2, recoverssm=False):
        self.vllm_config = SimpleNamespace(
            cache_config=SimpleNamespace(use_kda_recoverssm=recoverssm)
        )
        self.compilation_config = SimpleNamespace(cudagraph_capture_sizes=list(sizes))
        self.max_num_reqs = max_num_reqs
        self.decode_query_len = decode_query_len
        self._init_candidates()

    def _init_candidates(self):
        self._candidates = list(self.compilation_config.cudagraph_capture_sizes)
''',
    "vllm.config": '''\
"""Stand-in (shim mechanics only, NOT vLLM): a CacheConfig that has RecoverSSM."""
from dataclasses import dataclass, field


@dataclass
class CacheConfig:
    use_kda_recoverssm: bool = field(default=False, init=False)
''',
}
RENAMED = {
    "vllm.v1.worker.gpu.cudagraph_utils": '''\
"""Stand-in (shim mechanics only, NOT vLLM): CudaGraphManager renamed."""


class CUDAGraphManager:
    def _init_candidates(self):
        return "planned"
''',
}
RENAMED_STATE = "failed: CudaGraphManager._init_candidates not found"

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

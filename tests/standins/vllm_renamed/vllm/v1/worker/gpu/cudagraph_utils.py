"""Stand-in (shim mechanics only, NOT vLLM): CudaGraphManager renamed."""


class CUDAGraphManager:
    def _init_candidates(self):
        return "planned"


HOST_VALUE = "cudagraph_utils works"

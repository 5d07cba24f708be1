"""Stand-in (shim mechanics only, NOT vLLM): VllmConfig renamed away."""


class EngineConfig:
    pass


HOST_VALUE = "vllm works"

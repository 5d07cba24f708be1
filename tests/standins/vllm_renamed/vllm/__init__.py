"""Stand-in for vllm (shim mechanics tests only): NOT vLLM."""
__version__ = "0.29.0"
STANDIN = "vllm_renamed"

"""Constants shared by the mechanics tests (test_bootstrap, test_fault_matrix)."""

from pathlib import Path

from kimi_hotfix import __version__

STANDINS = Path(__file__).resolve().parent
TARGETS = (
    "vllm.v1.kv_cache_interface",
    "vllm.v1.worker.gpu.cudagraph_utils",
    "vllm.models.kimi_k3.nvidia.kda_metadata",
)
PATCHES = ("kv_spec_merge", "capture_workspace", "kda_overlong_rows")
# The child appends the helpers' directory after start-up: it shadows nothing.
PRELUDE = f"import sys; sys.path.append({str(STANDINS)!r}); import mechanics\n"
SUMMARY = f"kimi-hotfix {__version__} ("

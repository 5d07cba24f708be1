"""vLLM plugin entry point (``vllm.general_plugins``).

When the package is pip-installed, vLLM calls ``register()`` in every process it
starts (API server, engine core, workers), so the shim arms without PYTHONPATH.
Arming is idempotent: with the sitecustomize bootstrap active too, each method is
wrapped once.
"""


def register() -> None:
    from kimi_hotfix import core

    core.arm("vllm-plugin")

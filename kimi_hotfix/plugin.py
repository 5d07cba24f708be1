"""vLLM plugin entry point (``vllm.general_plugins``).

When the package is pip-installed, vLLM calls ``register()`` in every process it
starts (API server, engine core, workers), so the shim arms without PYTHONPATH.
Arming is idempotent: with the sitecustomize bootstrap active too, each method is
wrapped once.

vLLM's loader catches a plugin that fails to *load* (it logs "Failed to load
plugin") but not one whose function raises: a shim whose core cannot be loaded
must not take the vLLM process down from here. It logs the bootstrap's INACTIVE
line (same text, same prefix) and returns; strict mode raises.
"""

import sys

# the same texts as kimi_hotfix.runtime.messages.INACTIVE and FORMAT (tests/unit/test_registry.py)
INACTIVE = "kimi-hotfix inactive: cannot load kimi_hotfix.runtime.core (%s); vLLM runs unpatched"
FORMAT = "%(asctime)s kimi-hotfix[%(process)d] %(levelname)s %(message)s"


def register() -> None:
    try:
        from kimi_hotfix.runtime import core
    except Exception as exc:
        if inactive(exc):
            raise
        return
    core.arm("vllm-plugin")


def inactive(exc):
    """Log INACTIVE as kimi_hotfix.runtime.messages would (FORMAT, stderr, the level
    KIMI_HOTFIX_LOG_LEVEL allows), without it: it may be what is broken.
    Returns True in strict mode (the caller raises). sitecustomize.py and
    kimi_hotfix/plugin.py each hold this function (tests/unit/test_registry.py
    keeps them equal): each entry point may be the only one present."""
    import logging
    import os

    level = os.environ.get("KIMI_HOTFIX_LOG_LEVEL", "").strip().upper()
    if level not in ("ERROR", "CRITICAL"):
        log = logging.getLogger("kimi_hotfix")
        record = log.makeRecord(log.name, logging.WARNING, __file__, 0, INACTIVE, (repr(exc),), None)
        sys.stderr.write(logging.Formatter(FORMAT).format(record) + "\n")
        sys.stderr.flush()
    return os.environ.get("KIMI_HOTFIX_STRICT", "").strip().lower() in ("1", "on", "true", "yes")

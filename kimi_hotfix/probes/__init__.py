"""Probes that run the real, installed vLLM code (CPU only, no model weights).

Used by ``python -m kimi_hotfix check`` (preflight), the demo and the tests.
Importing a probe module imports vLLM; import them only where that is intended.
"""

"""Stand-in package (shim mechanics tests only; not vLLM)."""

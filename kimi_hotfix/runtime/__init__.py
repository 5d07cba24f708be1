"""What a vLLM process loads of the shim: the lifecycle (core), the store, the
patch API, the wrappers, -O parity, the exporter, and what they share. Nothing
here imports kimi_hotfix.tools (tests/unit/test_import_graph.py)."""

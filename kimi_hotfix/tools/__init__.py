"""What the commands load (``python -m kimi_hotfix status|check|audit``, the
docs): never a vLLM process. Imports the runtime; the runtime never imports
this (tests/unit/test_import_graph.py)."""

"""Stand-in for an APM launcher's sitecustomize (mechanics only).

``opentelemetry-instrument`` puts a directory like this one first on
PYTHONPATH: its ``sitecustomize.py`` initialises the agent and never runs the
next sitecustomize on sys.path, so the shim's bootstrap, later on PYTHONPATH,
does not run. This one does the same and records that it ran
(``STANDIN_APM_RAN``). The real launcher runs in the e2e tier
(tests/e2e/runs.py, ``sf-O-otel``).
"""
import os

os.environ["STANDIN_APM_RAN"] = __file__

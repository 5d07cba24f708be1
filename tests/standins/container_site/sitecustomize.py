"""Stand-in for a container's own sitecustomize (tests only): logs each run."""
import os

ORIGIN = "container-standin"
_log = os.environ.get("STANDIN_SITE_LOG")
if _log:
    with open(_log, "a") as f:
        f.write("container sitecustomize ran\n")
if os.environ.get("STANDIN_SITE_RAISE") == "1":
    raise RuntimeError("container sitecustomize failed on purpose")

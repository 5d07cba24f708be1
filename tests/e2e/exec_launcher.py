"""A launcher that imports vLLM in its own process, then execs the server
(issue 36 item 2): the shape of an APM or profiling launcher that loads the
application's packages first. Here the shim arms at ``import vllm``, makes the
pod directory and holds its lock; ``exec`` then replaces the image with the
command that follows (the same pid; close-on-exec descriptors gone; the
environment, ``KIMI_HOTFIX_POD_DIR`` included, kept).

    python -O exec_launcher.py /path/to/python -O -m vllm.entrypoints.openai.api_server ...
"""

import os
import sys

import vllm  # noqa: F401 (the shim's bootstrap arms here: the pod directory is made)

os.execv(sys.argv[1], sys.argv[1:])

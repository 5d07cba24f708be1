"""The flaky threaded import, reproduced on the real vLLM and setuptools, by hand
(issue 30 item 10; the suite's own check is tests/unit/test_meta_path_race.py).

Thread B imports ``vllm.utils.gpu_sync_debug``; its walk of sys.meta_path is
parked inside the finder before PathFinder while this thread runs setuptools'
own ``_distutils_hack.shim()`` (insert at 0, then remove, in place). Run with
a vLLM venv's python, with the shim (PYTHONPATH=<checkout>) and without it::

    VLLM_TARGET_DEVICE=cpu python tests/real/meta_path_race.py vllm.utils.gpu_sync_debug race
    VLLM_TARGET_DEVICE=cpu python tests/real/meta_path_race.py vllm.utils.gpu_sync_debug control

``race`` prints ``ModuleNotFoundError: No module named 'vllm.utils.gpu_sync_debug'``
either way on CPython 3.9 to 3.12 and 3.13.0; ``control`` (no shim() call) imports it.
"""
import importlib
import json
import sys
import threading
from importlib.machinery import PathFinder

import _distutils_hack  # setuptools' own hack (its .pth put its finder on sys.meta_path)

VICTIM, MODE = sys.argv[1], sys.argv[2]
importlib.import_module(VICTIM.rpartition(".")[0])  # vllm: arms the shim if it is on PYTHONPATH
before_path = sys.meta_path[sys.meta_path.index(PathFinder) - 1]
inserted, parked, removed = threading.Event(), threading.Event(), threading.Event()
out = {"meta_path": [getattr(f, "__name__", type(f).__name__) for f in sys.meta_path],
       "parked_in": getattr(before_path, "__name__", type(before_path).__name__)}

def tracer(frame, event, arg):
    if (event == "call" and frame.f_code.co_name == "find_spec"
            and frame.f_locals.get("fullname") == VICTIM
            and before_path in (frame.f_locals.get("cls"), frame.f_locals.get("self"))):
        sys.settrace(None)
        parked.set()
        removed.wait(30)
    return None

def victim():
    inserted.wait(30)
    sys.settrace(tracer)
    try:
        importlib.import_module(VICTIM)
        out["import"] = "ok"
    except BaseException as exc:
        out["import"] = f"{type(exc).__name__}: {exc}"
    finally:
        sys.settrace(None)

thread = threading.Thread(target=victim)
thread.start()
if MODE == "race":
    with _distutils_hack.shim():          # sys.meta_path.insert(0, DISTUTILS_FINDER) ... .remove(...)
        inserted.set()
        out["parked"] = parked.wait(30)
else:
    inserted.set()
    out["parked"] = parked.wait(30)
removed.set()
thread.join(60)
out["shim_armed"] = "kimi_hotfix.runtime.core" in sys.modules
print("KIMI_JSON:" + json.dumps(out))

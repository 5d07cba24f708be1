"""The container matrix's driver (tests/unit/test_container_matrix.py; shim
mechanics, not vLLM): one interpreter per (optimize level, writability), with
the shim's bootstrap on PYTHONPATH and nothing of ``vllm`` imported, forks one
child per (bytecode state, start) cell. Each cell imports the stand-in
``vllm.distributed.parallel_state`` from the tree of its bytecode state, calls
its guarded getter and writes one JSON result.

    python [-O|-OO] matrix_driver.py PLAN.json

Starts (how the process that runs vLLM's code starts):
  direct  the cell imports vLLM: the bootstrap arms the shim there and then
  exec    the cell imports ``vllm`` (the shim arms, makes its pod directory),
          then execs a new interpreter (same flags) that imports the module
  fork    the cell imports ``vllm`` (armed), then forks; the fork imports it
  spawn   the cell imports ``vllm`` (armed), then a multiprocessing ``spawn``
          child (a fresh interpreter) imports it
  late    the bootstrap is shadowed (a launcher's sitecustomize: its trigger
          taken off ``sys.meta_path``); the module is imported first, and
          vLLM's plugin entry point arms the shim afterwards

No ``assert`` here: it runs under -O.
"""

import json
import multiprocessing
import os
import subprocess
import sys
import traceback

import wrapt  # noqa: F401 (loaded once in the driver: the cells fork with it)

MODULE = "vllm.distributed.parallel_state"


def guard_outcome():
    """What the stand-in getter does here: plain Python's assert, or -O's None."""
    import importlib

    module = importlib.import_module(MODULE)
    try:
        return f"returned {module.get_inner_dp_world_group()!r}"
    except AssertionError as exc:
        return f"AssertionError: {exc}"


def state():
    """-O parity's state and the loader of the module, in this process."""
    from kimi_hotfix.runtime import core
    module = sys.modules.get(MODULE)
    loader = type(getattr(getattr(module, "__spec__", None), "loader", None)).__name__
    return {"o_parity": str(core.parity_state()), "loader": loader,
            "optimize": sys.flags.optimize}


def report():
    return {"guard": guard_outcome(), **state()}


def spawned(queue):
    try:
        queue.put(report())
    except BaseException:
        queue.put({"error": traceback.format_exc()[-2000:]})


EXECED = """
import json, sys
sys.path.insert(0, sys.argv[2])
sys.path.append(sys.argv[3])
import matrix_driver
out = matrix_driver.report()
out["pid"] = __import__("os").getpid()
with open(sys.argv[1], "w") as f:
    json.dump(out, f)
"""


def cell(start, tree, result, standins):
    sys.path.insert(0, tree)
    if start == "direct":
        return report()
    if start == "late":
        sys.meta_path[:] = [f for f in sys.meta_path if type(f).__name__ != "VllmImportTrigger"]
        __import__(MODULE)
        from kimi_hotfix import plugin
        plugin.register()  # what vLLM's plugin loader calls
        return report()
    import vllm  # noqa: F401 (the bootstrap arms the shim here)

    if start == "fork":
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(read)
            try:
                data = json.dumps(report())
            except BaseException:
                data = json.dumps({"error": traceback.format_exc()[-2000:]})
            os.write(write, data.encode())
            os._exit(0)
        os.close(write)
        chunks = []
        while True:
            chunk = os.read(read, 65536)
            if not chunk:
                break
            chunks.append(chunk)
        os.waitpid(pid, 0)
        return json.loads(b"".join(chunks))
    if start == "spawn":
        context = multiprocessing.get_context("spawn")
        queue = context.Queue()
        child = context.Process(target=spawned, args=(queue,))
        child.start()
        try:
            return queue.get(timeout=60)
        finally:
            child.join(60)
            if child.is_alive():
                child.kill()
    if start == "exec":
        sys.stdout.flush()
        sys.stderr.flush()
        flags = subprocess._args_from_interpreter_flags()
        os.execv(sys.executable, [sys.executable, *flags, "-c", EXECED, result, tree, standins])
    raise ValueError(f"unknown start {start!r}")


def run(plan):
    for item in plan["cells"]:
        pid = os.fork()
        if pid == 0:
            err = os.open(item["result"] + ".err", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            os.dup2(err, 2)
            try:
                out = cell(item["start"], item["tree"], item["result"], plan["standins"])
                out["pid"] = os.getpid()
            except BaseException:
                out = {"error": traceback.format_exc()[-2000:]}
            with open(item["result"], "w") as f:
                json.dump(out, f)
            sys.stderr.flush()
            os._exit(0)
        os.waitpid(pid, 0)


if __name__ == "__main__":
    with open(sys.argv[1]) as f:
        run(json.load(f))

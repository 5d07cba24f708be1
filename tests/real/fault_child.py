"""The fault tier's driver (tests/real/fault_tier.py), run by the interpreter
under test, plain or -O: ``python [-O] fault_child.py CONFIG.json``.

It loads what no case changes (the stdlib, wrapt; with the real vLLM, vLLM's
own dependencies, measured by the first healthy run), then forks one child
per case, one at a time. A child deploys its tree as its mode does (the
bootstrap run as site.py runs it; or vLLM's own ``load_general_plugins()``,
after the driver imported vLLM), forks ``python -m kimi_hotfix status`` as
``-m`` runs it (``runpy._run_module_as_main``, before vLLM is imported, as an
operator's separate command would see it), imports vLLM, uses it, and
writes what it saw. Every child runs under an alarm. The result (one JSON
file, CONFIG's "out") has the healthy run of each mode, the files each loaded,
every case and the child-seconds spent.
"""

import importlib
import json
import os
import shutil
import signal
import sys
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import fault_tier as ft  # noqa: E402

sys.path.remove(HERE)

STDLIB = ("logging", "ast", "inspect", "dataclasses", "argparse", "json", "textwrap", "enum",
          "typing", "functools", "linecache", "weakref", "runpy", "copy", "types", "re", "abc",
          "contextlib", "threading", "site", "importlib.metadata", "importlib.util", "atexit",
          "wrapt")
# prometheus_client: a vLLM server's processes import it (vllm.v1.metrics), and the
# shim's serving side (kimi_hotfix.runtime.scrape) loads there
REAL_TARGETS = ("vllm", "vllm.v1.kv_cache_interface", "vllm.config.vllm",
                "vllm.distributed.parallel_state", "prometheus_client")
PLUGIN_TARGETS = REAL_TARGETS + ("vllm.v1.worker.gpu.cudagraph_utils",
                                 "vllm.models.kimi_k3.nvidia.kda_metadata", "vllm.plugins")
FORK_TARGETS = ("vllm", "vllm.v1.kv_cache_interface", "vllm.config.vllm")
STANDIN_TARGETS = ("vllm", "vllm.v1.kv_cache_interface", "vllm.config.vllm",
                   "vllm.distributed.parallel_state", "vllm.v1.worker.gpu.cudagraph_utils",
                   "vllm.models.kimi_k3.nvidia.kda_metadata")
TIMEOUT = 120
OWN = ("vllm", "kimi_hotfix", "sitecustomize", "__")  # never preloaded: the cases import them


def works(target):
    """vLLM used in ways whose result is the same patched or not."""
    if target == "standin":
        from types import SimpleNamespace

        from vllm.config.vllm import VllmConfig
        from vllm.distributed import parallel_state
        from vllm.models.kimi_k3.nvidia.kda_metadata import KimiK3KDAMetadataBuilder
        from vllm.v1.kv_cache_interface import FullAttentionSpec
        from vllm.v1.worker.gpu.cudagraph_utils import CudaGraphManager

        spec = FullAttentionSpec(16, 64)
        parallel_state._INNER_DP_WORLD = "group"
        VllmConfig(16, 4).validate_block_size()
        return [FullAttentionSpec.merge([spec, spec]) == spec,
                CudaGraphManager([1, 2, 4])._candidates,
                KimiK3KDAMetadataBuilder(1).build(0, SimpleNamespace(max_query_len=2)),
                parallel_state.get_inner_dp_world_group()]
    import torch
    from vllm.config import VllmConfig
    from vllm.v1.kv_cache_interface import FullAttentionSpec

    spec = FullAttentionSpec(block_size=16, num_kv_heads=1, head_size=64, dtype=torch.float16)
    return [FullAttentionSpec.merge([spec, spec]) == spec, type(VllmConfig()).__name__]


def tree_files(tree):
    """The files of ``tree`` loaded in this process, relative."""
    found = set()
    for module in list(sys.modules.values()):
        path = getattr(module, "__file__", None)
        if isinstance(path, str) and path.startswith(tree + os.sep):
            found.add(os.path.relpath(path, tree))
    return sorted(found)


def redirect(stdout, stderr):
    for path, fd in ((stdout, 1), (stderr, 2)):
        target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(target, fd)
        os.close(target)


def read(path):
    try:
        with open(path, errors="replace") as f:
            return f.read()
    except OSError:
        return ""


def run_status(tree, base):
    """``python -m kimi_hotfix status`` as -m runs it, in a fork of this child."""
    pid = os.fork()
    if pid == 0:
        signal.alarm(TIMEOUT)
        redirect(base + ".status.out", base + ".status.err")
        sys.argv = ["-m", "status"]
        code = 0
        try:
            import runpy

            runpy._run_module_as_main("kimi_hotfix")
        except SystemExit as exc:
            if isinstance(exc.code, str):
                sys.stderr.write(exc.code + "\n")
                code = 1
            else:
                code = exc.code or 0
        except BaseException:
            traceback.print_exc()
            code = 1
        with open(base + ".status.json", "w") as f:
            json.dump(tree_files(tree), f)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    rc = os.waitstatus_to_exitcode(status)
    return {"rc": rc, "stdout": read(base + ".status.out"), "stderr": read(base + ".status.err"),
            "loaded": json.loads(read(base + ".status.json") or "[]")}


def child(config, case, tree, base):
    signal.alarm(TIMEOUT)
    redirect(base + ".out", base + ".err")
    mode, target = case["mode"], config["target"]
    if case["strict"]:
        os.environ["KIMI_HOTFIX_STRICT"] = "1"
    if mode == "plugin":
        os.environ.pop("PYTHONPATH", None)
        sys.path.append(tree)  # where pip puts it: site-packages, after everything
    else:
        front = [tree] + ([config["standin"]] if target == "standin" else [])
        if case.get("chain"):  # the bundle first, the checkout next, the container's own last
            front = [config["masters"]["bundle"], tree, case["chain"]]
            os.environ["STANDIN_SITE_LOG"] = base + ".site.log"
        os.environ["PYTHONPATH"] = os.pathsep.join(front)
        sys.path[0:0] = front
    importlib.invalidate_caches()
    if mode != "plugin":
        import site

        site.execsitecustomize()  # what site.py does at start-up, errors reported its way
    out = dict(case, import_error=None, import_traceback="", works=None, states=None)
    if not case["strict"] and config["opt"] == "plain":
        out["status"] = run_status(tree, base)
    armed_before = "kimi_hotfix.runtime.core" in sys.modules
    try:
        if mode == "plugin":
            importlib.import_module("vllm.plugins").load_general_plugins()
        else:
            for name in case.get("targets") or (STANDIN_TARGETS if target == "standin"
                                                 else REAL_TARGETS):
                importlib.import_module(name)
        if case.get("fork"):
            out["fork"] = fork_safety(config)
    except BaseException as exc:
        out["import_error"] = f"{type(exc).__name__}: {exc}"
        out["import_traceback"] = traceback.format_exc()[-4000:]
    if out["import_error"] is None:
        try:
            out["works"] = repr(works(target))
        except BaseException as exc:
            out["works"] = f"raised {type(exc).__name__}: {exc}"
    core = sys.modules.get("kimi_hotfix.runtime.core")
    if core is not None:
        out["states"] = {name: str(s) for name, s in core.states().items()}
    out["loaded"] = tree_files(tree)
    if case.get("chain"):
        bootstrap = sys.modules.get("kimi_hotfix_sitecustomize")
        sys.path.append(config["standins"])
        import mechanics

        out["chain"] = {"bundle": config["masters"]["bundle"], "checkout": tree,
                        "site_log": read(base + ".site.log").splitlines(),
                        "sitecustomize": getattr(sys.modules.get("sitecustomize"), "__file__", None),
                        "bootstrap": getattr(bootstrap, "__file__", None),
                        "chained": list(getattr(bootstrap, "CHAINED", [])),
                        "copies": list(getattr(bootstrap, "COPIES", [])),
                        "wrapped": mechanics.wrapped_layers(sys.modules["vllm.v1.kv_cache_interface"])}
    if case["rel"] is None and target == "real" and mode != "plugin":
        out["deps"] = sorted(m for m in list(sys.modules) if not m.startswith(OWN))
    if case["rel"] is None and target == "real" and mode == "plugin" and core is not None:
        # the pip-installed plugin, no PYTHONPATH, vLLM imported first: what arms, what is
        # wrapped, and the merge's behaviour (test_fault_tier: the plugin alone)
        sys.path.append(config["standins"])
        import mechanics

        kv = sys.modules["vllm.v1.kv_cache_interface"]
        out["plugin_report"] = mechanics.report(
            armed_before=armed_before, tree=tree, capability=mechanics.mla_capability(kv),
            vllm_own_merge_capability=mechanics.mla_capability(kv, original=True))
    sys.stdout.flush()
    sys.stderr.flush()
    with open(base + ".json", "w") as f:
        json.dump(out, f)
    os._exit(0)


LATE = "vllm.models.kimi_k3.nvidia.kda_metadata"  # imported by the forked children only


def fork_safety(config):
    """tests/standins/forks.py on the real vLLM, with the shim armed: fork while
    wrapt's import hook lock and -O parity's lock are held; then a Popen with a
    preexec_fn and a plain fork."""
    import subprocess

    sys.path.append(config["standins"])
    import forks
    from vllm.config import VllmConfig
    from vllm.distributed import parallel_state

    import kimi_hotfix

    def states():
        return {n: str(s) for n, s in kimi_hotfix.states().items()}

    def work():
        importlib.import_module(LATE)
        return {"first_call": forks.outcome(lambda: type(VllmConfig()).__name__),
                "getter": forks.outcome(parallel_state.get_inner_dp_world_group),
                "states": states()}

    holds = forks.locks()
    # a lock a fork used to hang on, and parity's (every lock: tests/unit/test_fork_safety.py)
    order = ["wrapt.importer._post_import_hooks_lock", "kimi_hotfix.runtime.parity._lock"]
    results = [forks.fork_while_held(name, holds[name], work) for name in order]
    parent = {"late_imported": LATE in sys.modules}
    importlib.import_module(LATE)
    parent["states"] = states()
    parent["getter"] = forks.outcome(parallel_state.get_inner_dp_world_group)
    popen = subprocess.Popen([sys.executable, "-c", "pass"], preexec_fn=lambda: None)
    popen.wait(60)
    forked = os.fork()
    if forked == 0:
        os._exit(0)
    os.waitpid(forked, 0)
    return {"results": results, "parent": parent, "pid": os.getpid(), "popen_pid": popen.pid,
            "fork_pid": forked}


def run_case(config, case, master):
    """Fork one case; its result (with the stderr it wrote)."""
    work = config["work"]
    base = os.path.join(work, f"case{run_case.count}")
    run_case.count += 1
    tree = base + ".tree"
    ft.link_tree(master, tree, case.get("rel"))
    if case.get("rel"):
        ft.inject(tree, case["rel"], case["fault"])
    started = time.monotonic()
    pid = os.fork()
    if pid == 0:
        try:
            child(config, case, tree, base)
        finally:
            os._exit(70)
    _, status = os.waitpid(pid, 0)
    seconds = time.monotonic() - started
    result = json.loads(read(base + ".json") or "null") or dict(
        case, crashed=os.waitstatus_to_exitcode(status), import_error="the child did not finish",
        states=None, works=None, loaded=[])
    result.update(stderr=read(base + ".err"), stdout=read(base + ".out"), seconds=seconds,
                  exit=os.waitstatus_to_exitcode(status))
    shutil.rmtree(tree, ignore_errors=True)
    for suffix in (".err", ".out", ".json", ".site.log", ".status.out", ".status.err",
                   ".status.json"):
        if os.path.exists(base + suffix):
            os.unlink(base + suffix)
    return result


run_case.count = 0


PRELOAD_FAILED = {}  # name -> its error: the driver reports them (issue 30 item 9)


def preload(names):
    """Import ``names`` here once, so that each case pays only for vLLM's own
    modules. One that fails (what it needs at import, a platform, may be
    absent) is left for the case to import, and recorded: the test fails when a
    target or a module of the shim's own needs is among them."""
    for name in names:
        if name not in sys.modules:
            try:
                importlib.import_module(name)
            except Exception as exc:
                PRELOAD_FAILED[name] = f"{type(exc).__name__}: {exc}"[:300]


def main():
    with open(sys.argv[1]) as f:
        config = json.load(f)
    started = time.monotonic()
    os.environ.pop("PYTHONPATH", None)
    preload(STDLIB)
    target, opt = config["target"], config["opt"]
    result = {"target": target, "opt": opt, "baselines": {}, "files": {}, "cases": [],
              "seconds": {}}
    if config.get("deps"):  # what importing vLLM loads besides vLLM (another driver's list)
        preload(config["deps"])
        result["deps"] = len(config["deps"])
    for mode in config["modes"]:
        if mode == "plugin":  # vLLM imported before the plugin is loaded, as vLLM does
            # (in plain Python the cheap targets only: the -O driver settles them all)
            preload(PLUGIN_TARGETS if opt == "O" else REAL_TARGETS + ("vllm.plugins",))
            result["deps_list"] = sorted(m for m in list(sys.modules) if not m.startswith(OWN))
        master = config["masters"][mode]
        t0 = time.monotonic()
        healthy = run_case(config, {"mode": mode, "rel": None, "fault": None, "strict": False},
                           master)
        result["baselines"][mode] = healthy
        if "deps" in healthy and "deps" not in result:
            # what importing vLLM loaded besides vLLM and the shim, loaded here once:
            # each later case imports vLLM's own modules only
            preload(healthy["deps"])
            result["deps"] = len(healthy.pop("deps"))
        loaded = set(healthy["loaded"]) | set((healthy.get("status") or {}).get("loaded", []))
        files = [rel for rel in ft.shim_files(master) if rel in loaded]
        result["files"][mode] = {"all": ft.shim_files(master), "vllm": healthy["loaded"],
                                 "status": (healthy.get("status") or {}).get("loaded", []),
                                 "cases": files}
        for rel, fault, strict in ft.plan(target, opt, mode, files):
            case = {"mode": mode, "rel": rel, "fault": fault, "strict": strict,
                    "id": ft.case_id(mode, rel, fault, strict)}
            result["cases"].append(run_case(config, case, master))
        if config.get("fork_safety") and mode == "pythonpath":  # (the real -O driver)
            result["chain"] = run_case(config, {"mode": mode, "rel": None, "fault": None,
                                                "strict": False, "chain": os.path.join(
                                                    config["standins"], "container_site")},
                                       master)
            t1 = time.monotonic()
            result["fork"] = run_case(config, {"mode": mode, "rel": None, "fault": None,
                                               "strict": False, "fork": True,
                                               "targets": FORK_TARGETS}, master)
            result["seconds"]["fork"] = round(time.monotonic() - t1, 1)
        result["seconds"][mode] = round(time.monotonic() - t0, 1)
    result["seconds"]["total"] = round(time.monotonic() - started, 1)
    import resource

    used = [resource.getrusage(who) for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)]
    result["cpu_seconds"] = round(sum(u.ru_utime + u.ru_stime for u in used), 1)
    result["preload_failed"] = PRELOAD_FAILED
    with open(config["out"], "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main()

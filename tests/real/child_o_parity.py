"""The -O hazards that -O parity covers, without and with it (child side).

``run()`` is child.py's ``o_parity`` section, in the children that run with
``KIMI_HOTFIX=0`` (harness.PLAN's ``off`` configurations, seed 0): the shim arms
nothing by itself, so vLLM runs as released. "With" parity, this module gives
the modules a case runs their plain code in place, as -O parity does for a
module imported before the shim armed (kimi_hotfix.runtime.parity.swap: the late
path, checked by Python's rule for bytecode), and puts vLLM's code back after
each case. It runs last in the child: it leaves a one-process gloo world.
Alone, ``python [-O] tests/real/child_o_parity.py`` prints one ``KIMI_JSON:`` line.

  barrier   vLLM's ``_all_workers_barrier`` (CPU KV offload) in a one-process
            gloo world built with vLLM's own ``init_world_group``, no inner-DP
            group (a single-node worker): "ok" or the error
  config    ``VllmConfig.validate_block_size`` on a DCP8 config whose interleave
            size does not fit the block, and on one that fits; the NIXL P/D
            DCP check of ``VllmConfig.__post_init__`` where the release has it
  planner   the planner's start-up invariants (workers that disagree, a grouping
            that leaves a layer out)
  decide    -O parity's decision in this interpreter
  probes    -O parity's probe (check's), without and with it

No ``assert`` here: the child runs under -O.
"""

import json
import os
import socket
import sys
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
if REPO not in sys.path:
    sys.path.append(REPO)
SECTIONS = {}  # name -> function, in order


def section(name):
    def register(fn):
        SECTIONS[name] = fn
        return fn

    return register


def run() -> dict:
    out = {}
    for name, fn in SECTIONS.items():
        try:
            out[name] = fn()
        except Exception:
            out[name] = {"error": traceback.format_exc()[-3000:]}
    return out


def outcome(call):
    try:
        value = call()
    except Exception as exc:
        return " ".join(f"{type(exc).__name__}: {exc}".split())[:400]
    return "ok" if value is None else f"returned {value!r}"[:300]


def with_parity(modules, call):
    """``call()`` with the functions of ``modules`` given their plain code in
    place (kimi_hotfix.runtime.parity.swap); vLLM's own code back after."""
    import importlib

    from kimi_hotfix.runtime import parity
    report = parity.Report()
    done = len(parity._swaps)
    for name in modules:
        parity.swap([importlib.import_module(name)], report)
    try:
        if report.refused:
            return f"refused: {report.refused}"
        return call()
    finally:
        while len(parity._swaps) > done:
            func, old = parity._swaps.pop()
            func.__code__ = old


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@section("process")
def _process():
    import vllm

    return {"optimize": sys.flags.optimize, "vllm": vllm.__version__,
            "kimi_hotfix": os.environ.get("KIMI_HOTFIX")}


@section("barrier")
def _barrier():
    import torch.distributed as dist
    from vllm.distributed import parallel_state
    from vllm.v1.kv_offload.cpu import spec

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}",
                            world_size=1, rank=0)
    parallel_state._WORLD = parallel_state.init_world_group([0], 0, "gloo")
    inner = parallel_state._INNER_DP_WORLD
    own = parallel_state.get_inner_dp_world_group  # vLLM's own, before any patch
    out = {"inner_dp_world": None if inner is None else repr(inner)}
    out["without"] = outcome(spec._all_workers_barrier)
    modules = ("vllm.distributed.parallel_state",)
    out["with"] = with_parity(modules, lambda: outcome(spec._all_workers_barrier))
    def getter():
        return outcome(lambda: repr(parallel_state.get_inner_dp_world_group()))

    out["getter_without"] = getter()
    out["getter_with"] = with_parity(modules, getter)
    # identity, not __module__ (wrapt forwards it: a wrapper still in place reads the same)
    out["restored"] = parallel_state.get_inner_dp_world_group is own
    return out


def _nixl(config_module):
    """VllmConfig(...) with NIXL P/D and DCP 4 on TP 8 (the check wants 1 or 8)."""
    import inspect

    source = inspect.getsource(config_module.VllmConfig.__post_init__)
    if "NIXL transfer parallel size" not in source:
        return {"present": False}

    def build():
        from vllm.config import KVTransferConfig, ParallelConfig, VllmConfig

        VllmConfig(
            parallel_config=ParallelConfig(tensor_parallel_size=8, decode_context_parallel_size=4),
            kv_transfer_config=KVTransferConfig(kv_connector="NixlConnector", kv_role="kv_both"),
        )

    return {"present": True, "without": outcome(build),
            "with": with_parity(CONFIG, lambda: outcome(build))}


@section("config")
def _config():
    from vllm.config import vllm as config_module

    out = {}
    for label, interleave in (("misfit", 128), ("fit", 64)):
        def run(interleave=interleave):
            config = config_module.VllmConfig()
            config.parallel_config.decode_context_parallel_size = 8
            config.cache_config.block_size = 64
            config.parallel_config.cp_kv_cache_interleave_size = interleave
            return outcome(config.validate_block_size)

        out[label] = {"without": run(), "with": with_parity(CONFIG, run)}
    out["nixl"] = _nixl(config_module)
    out["default_config"] = {
        "without": outcome(lambda: config_module.VllmConfig() and None),
        "with": with_parity(CONFIG, lambda: outcome(lambda: config_module.VllmConfig() and None)),
    }
    return out


CONFIG = ("vllm.config.vllm",)


@section("planner")
def _planner():
    """The planner's start-up invariants: workers whose specs differ, and
    (0.33) a grouping that leaves a layer out."""
    import importlib

    import torch
    from vllm.config import VllmConfig
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheGroupSpec

    def spec(dtype):
        return FullAttentionSpec(block_size=16, num_kv_heads=2, head_size=64, dtype=dtype)

    workers = [{"model.layers.0.attn": spec(torch.bfloat16)},
               {"model.layers.0.attn": spec(torch.float16)}]
    out = {}
    try:
        planning = importlib.import_module("vllm.v1.core.kv_cache_planning")
    except ImportError:
        planning = None
    if planning is not None and hasattr(planning, "get_global_kv_cache_groups"):
        out["where"] = "kv_cache_planning.get_global_kv_cache_groups"
        modules = ("vllm.v1.core.kv_cache_planning",)
        differ = lambda: outcome(  # noqa: E731
            lambda: planning.get_global_kv_cache_groups(VllmConfig(), workers) and None)
        groups = [KVCacheGroupSpec(["model.layers.0.attn"], spec(torch.bfloat16))]
        specs = {"model.layers.0.attn": spec(torch.bfloat16),
                 "model.layers.1.attn": spec(torch.bfloat16)}
        partition = lambda: outcome(  # noqa: E731
            lambda: planning._check_exact_partition(groups, specs))
        out["partition_misses_a_layer"] = {"without": partition(),
                                           "with": with_parity(modules, partition)}
    else:
        utils = importlib.import_module("vllm.v1.core.kv_cache_utils")
        out["where"] = "kv_cache_utils.get_kv_cache_configs"
        modules = ("vllm.v1.core.kv_cache_utils",)
        differ = lambda: outcome(  # noqa: E731
            lambda: utils.get_kv_cache_configs(VllmConfig(), workers, [1 << 30, 1 << 30]) and None)
    out["workers_differ"] = {"without": differ(), "with": with_parity(modules, differ)}
    return out


@section("decide")
def _decide():
    import vllm

    from kimi_hotfix.tools.parity_probe import PROBE

    decision = PROBE.decide(vllm, sys.flags.optimize)
    return {PROBE.name: {"verdict": decision.verdict, "reason": decision.reason}}


@section("probes")
def _probes():
    from vllm.distributed import parallel_state

    from kimi_hotfix.tools.parity_probe import PROBE

    saved_world = parallel_state._WORLD
    parallel_state._WORLD = None  # the probe's getter case wants no distributed state
    out = {}
    try:
        with PROBE.toggled(False):
            out["without"] = PROBE.probe().as_dict()
        out["with"] = PROBE.probe().as_dict()
    finally:
        parallel_state._WORLD = saved_world
    return {PROBE.name: out}


if __name__ == "__main__":
    print("KIMI_JSON:" + json.dumps({"sections": run()}), flush=True)

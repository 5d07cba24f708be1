#!/usr/bin/env python3
"""Two ways to give vLLM's code its plain-Python checks back under -O, side by side.

    V=~/.cache/kimi-hotfix/uv-venvs/vllm-0.29.0-py3.11/bin/python
    KIMI_HOTFIX=0 PYTHONPATH=. VLLM_TARGET_DEVICE=cpu $V -O bench/o_parity_mechanism.py [--rounds 15]

(a) per function, targeted (the design before issue 37): recompile each named
    function from vLLM's own source with its asserts as explicit raises
    (``AssertToRaise`` below, what the shim's hardening module did before -O parity), checked byte
    for byte against the running code (kimi_hotfix.runtime.recompile), one patch per
    site found. Here: the 11 functions three patches covered, plus the 9
    functions behind the 9 vLLM tests -O still failed (issue 37).
(b) per package, what the shim does now (kimi_hotfix.runtime.parity): vLLM's modules
    load with the plain ``.pyc`` (pip writes it at install) or, where Python's
    rule rejects it, the source compiled with ``optimize=0``; a module imported
    before arming gets its plain code in place (the late path).

Part 1, import cost per module that holds a site, in one process, paired
rounds in a shuffled order (bench/stats.py: differences to what -O does on
import, unmarshalling the ``.opt-1.pyc``; median and bootstrap standard error;
an A/A control):
  (b) plain .pyc       unmarshal the plain .pyc (parity, the wheel as installed)
  (b) source           compile the source with optimize=0 (no valid plain .pyc:
                       a copy or a layer rebuild changed mtimes; -O without
                       parity compiles the source there too: see part 2)
  (b) late, in place   give the loaded module's functions their plain code
                       (parity armed after the import: vLLM's plugin loader)
  (a) eager            recompile the named functions (parse + two compiles each)
Part 2, whole processes: the start-up of ``import vllm.v1.engine.core`` under
-O without the shim, and with it (parity), as installed (plain .pyc present)
and with every ``.pyc`` hidden (PYTHONPYCACHEPREFIX at an empty directory:
both compile every module), paired, one child per measurement; and the
resident memory after that import, without and with parity (under -OO:
docstrings kept).
Part 3, the hot path: operations an engine step runs (the free-block queue,
the block pool's allocate and free), with vLLM's -O code and with plain code (parity: the asserts
in them run), paired iterations in one process.
"""

from __future__ import annotations

import argparse
import ast
import importlib
import json
import linecache
import marshal
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import stats  # noqa: E402

# module -> the functions design (a) recompiles there (the sites; 0.29.0's names)
TARGETS = {
    "vllm.distributed.parallel_state": ["get_inner_dp_world_group"],
    "vllm.config.vllm": ["VllmConfig.__post_init__", "VllmConfig._set_cudagraph_sizes",
                         "VllmConfig._set_compile_ranges", "VllmConfig.validate_block_size"],
    "vllm.v1.kv_cache_interface": ["FullAttentionSpec.merge", "MLAAttentionSpec.merge",
                                   "RSWASpec.merge", "SlidingWindowMLASpec.merge",
                                   "SinkFullAttentionSpec.merge",
                                   "KVCacheSpec.is_uniform_with_collection"],
    "vllm.v1.core.kv_cache_utils": ["FreeKVCacheBlockQueue.append_n", "resolve_block_hashes"],
    "vllm.v1.core.single_type_kv_cache_manager": ["MambaManager._relocate_speculative_block"],
    "vllm.v1.core.block_pool": ["BlockPool._get_partial_block_hash"],
    "vllm.v1.core.kv_cache_manager": ["KVCacheManager.truncate_computed_blocks"],
    "vllm.v1.core.kv_cache_metrics": ["KVCacheMetricsCollector.__init__"],
    "vllm.v1.kv_cache_spec_registry": ["KVCacheSpecRegistry.register"],
}


class AssertToRaise(ast.NodeTransformer):
    """``assert test, msg`` -> ``if not test: raise AssertionError(msg)`` (design (a))."""

    def visit_Assert(self, node):
        exc = ast.Call(func=ast.Name(id="AssertionError", ctx=ast.Load()),
                       args=[node.msg] if node.msg is not None else [], keywords=[])
        check = ast.If(test=ast.UnaryOp(op=ast.Not(), operand=node.test),
                       body=[ast.Raise(exc=exc, cause=None)], orelse=[])
        return ast.fix_missing_locations(ast.copy_location(check, node))


def _resolve(module, dotted):
    owner = module
    *path, name = dotted.split(".")
    for part in path:
        owner = getattr(owner, part)
    value = vars(owner)[name]
    return getattr(value, "__func__", value)


def measure(modname, names, rounds):
    """Part 1 for one module."""
    from kimi_hotfix.runtime import bytecode, parity, recompile
    module = importlib.import_module(modname)
    path = module.__file__
    funcs = [_resolve(module, n) for n in names]
    opt = bytecode.pyc_path(path, sys.flags.optimize)
    if not os.path.exists(opt):
        raise SystemExit(f"{opt} missing: import the module once under -O first")
    plain = bytecode.pyc_path(path, 0)
    source = Path(path).read_bytes()

    def unmarshal(pyc):
        return marshal.loads(Path(pyc).read_bytes()[16:])

    def eager():
        linecache.clearcache()
        recompile.forget()
        for func in funcs:
            recompile.recompile(func, AssertToRaise().visit, optimize=0)
        recompile.forget()

    def late():
        report = parity.Report()
        done = len(parity._swaps)
        parity.swap([module], report)
        while len(parity._swaps) > done:  # back to -O's code for the next round
            func, old = parity._swaps.pop()
            func.__code__ = old
        if report.refused:
            raise SystemExit(f"{modname}: {report.refused}")

    variants = {
        "baseline": lambda: unmarshal(opt),
        "A/A": lambda: unmarshal(opt),
        "(b) source, optimize=0": lambda: compile(source, path, "exec", dont_inherit=True,
                                                  optimize=0),
        "(b) late, in place": late,
        "(a) eager": eager,
    }
    if os.path.exists(plain):
        variants["(b) plain .pyc"] = lambda: unmarshal(plain)
    samples = {name: [] for name in variants}
    for _ in range(rounds):
        order = list(variants)
        random.shuffle(order)
        for name in order:
            t0 = time.perf_counter()
            variants[name]()
            samples[name].append((time.perf_counter() - t0) * 1e3)
    base = samples["baseline"]
    return {"lines": source.count(b"\n"), "functions": len(funcs),
            "baseline_ms": stats.estimate(base),
            **{name: stats.paired_estimate(base, values) for name, values in samples.items()
               if name != "baseline"}}


STARTUP = r"""
import gc, os, sys, time
t0 = time.perf_counter()
import vllm.v1.engine.core  # noqa: F401 (what an EngineCore process imports)
seconds = time.perf_counter() - t0
gc.collect()
with open("/proc/self/statm") as f:  # resident now (the peak is torch's import, not this)
    resident_kib = int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") // 1024
print("KIMI_BENCH", seconds, resident_kib, flush=True)
"""


def _child(flags, shim, prefix=None):
    env = {k: v for k, v in os.environ.items() if not k.startswith("KIMI_HOTFIX")}
    env.update(VLLM_TARGET_DEVICE="cpu", VLLM_LOGGING_LEVEL="ERROR", PYTHONDONTWRITEBYTECODE="1",
               PYTHONPATH=str(Path(__file__).resolve().parents[1]) if shim else "")
    env.pop("PYTHONPYCACHEPREFIX", None)
    if prefix:
        env["PYTHONPYCACHEPREFIX"] = prefix
    proc = subprocess.run([sys.executable, *flags, "-c", STARTUP], env=env, capture_output=True,
                          text=True, timeout=900)
    line = next((x for x in proc.stdout.splitlines() if x.startswith("KIMI_BENCH")), None)
    if line is None:
        raise SystemExit(f"the start-up child failed:\n{proc.stderr[-2000:]}")
    _, seconds, rss = line.split()
    return float(seconds), int(rss) / 1024


def processes(rounds):
    """Part 2: paired children, start-up seconds and -OO memory."""
    out = {}
    empty = tempfile.mkdtemp(prefix="kimi-bench-nopyc-")
    pairs = {
        "-O, installed bytecode": (["-O"], None),
        "-O, no bytecode (every module compiled)": (["-O"], empty),
        "-OO, installed bytecode": (["-OO"], None),
    }
    for label, (flags, prefix) in pairs.items():
        base, with_parity, base_rss, parity_rss = [], [], [], []
        for _ in range(rounds):
            runs = [("base", False), ("parity", True)]
            random.shuffle(runs)
            for name, shim in runs:
                seconds, rss = _child(flags, shim, prefix)
                (base if name == "base" else with_parity).append(seconds)
                (base_rss if name == "base" else parity_rss).append(rss)
        out[label] = {"base_s": stats.estimate(base), "parity_s": stats.estimate(with_parity),
                      "diff_s": stats.paired_estimate(base, with_parity),
                      "base_mib": stats.estimate(base_rss), "diff_mib": stats.paired_estimate(
                          base_rss, parity_rss)}
    return out


def hot_path(iterations):
    """Part 3: vLLM's step operations with -O's code and with plain code, paired."""
    import torch
    from vllm.v1.core.block_pool import BlockPool
    from vllm.v1.core.kv_cache_utils import FreeKVCacheBlockQueue, KVCacheBlock

    from kimi_hotfix.tools import parity_probe
    modules = ("vllm.v1.core.kv_cache_utils", "vllm.v1.core.block_pool")
    del torch

    def queue_ops():
        queue = FreeKVCacheBlockQueue([KVCacheBlock(block_id=i) for i in range(64)])
        for _ in range(50):
            taken = queue.popleft_n(16)
            queue.append_n(taken)

    def pool_ops():
        pool = BlockPool(num_gpu_blocks=256, enable_caching=False, hash_block_size=16)
        for _ in range(50):
            blocks = pool.get_new_blocks(16)
            pool.free_blocks(blocks)

    out = {}
    for label, op in (("free-block queue: popleft_n + append_n (x50)", queue_ops),
                      ("block pool: get_new_blocks + free_blocks (x50)", pool_ops)):
        base, plain = [], []
        for _ in range(iterations):
            for name in random.sample(["O", "plain"], 2):
                with parity_probe.compiled_at(modules, 0 if name == "plain" else sys.flags.optimize):
                    t0 = time.perf_counter()
                    op()
                    (plain if name == "plain" else base).append((time.perf_counter() - t0) * 1e6)
        out[label] = {"base_us": stats.estimate(base), "diff_us": stats.paired_estimate(base, plain)}
    return out


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--process-rounds", type=int, default=5)
    parser.add_argument("--iterations", type=int, default=200)
    parser.add_argument("--json", help="also write the figures here")
    args = parser.parse_args(argv)
    if sys.flags.optimize != 1:
        raise SystemExit("run under -O: the comparison is about optimized interpreters")
    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
    import vllm

    print(f"vLLM {vllm.__version__}, python {sys.version.split()[0]} -O, {stats.machine()}")
    print(f"part 1: import cost per module, {args.rounds} paired rounds, ms (difference to "
          "unmarshalling the .opt-1.pyc, median +/- s.e.)")
    figures = {"modules": {}, "processes": {}, "hot_path": {}}
    for modname, names in TARGETS.items():
        row = measure(modname, names, args.rounds)
        figures["modules"][modname] = {k: (v.median, v.se) if hasattr(v, "median") else v
                                       for k, v in row.items()}
        print(f"\n  {modname} ({row['lines']} lines, (a): {row['functions']} functions; "
              f".opt-1.pyc unmarshal {row['baseline_ms'].median:.2f} ms)")
        for name, est in row.items():
            if name in ("lines", "functions", "baseline_ms"):
                continue
            print(f"    {name:26s} {est.fmt(' ms')}")
    print(f"\npart 2: whole processes, import vllm.v1.engine.core, {args.process_rounds} "
          "paired children each")
    for label, row in processes(args.process_rounds).items():
        figures["processes"][label] = {k: (v.median, v.se) for k, v in row.items()}
        ratio = row["parity_s"].median / row["base_s"].median
        print(f"  {label}: without the shim {row['base_s'].median:.2f} s, with parity "
              f"{row['parity_s'].median:.2f} s (ratio {ratio:.2f}; paired difference "
              f"{row['diff_s'].fmt(' s')}); resident {row['base_mib'].median:.0f} MiB, "
              f"parity {row['diff_mib'].fmt(' MiB')}")
    print(f"\npart 3: the hot path, {args.iterations} paired iterations, us per operation batch")
    for label, row in hot_path(args.iterations).items():
        figures["hot_path"][label] = {k: (v.median, v.se) for k, v in row.items()}
        ratio = (row["base_us"].median + row["diff_us"].median) / row["base_us"].median
        print(f"  {label}: -O {row['base_us'].median:.1f} us, plain code (parity) "
              f"{row['diff_us'].fmt(' us')} (ratio {ratio:.3f})")
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())

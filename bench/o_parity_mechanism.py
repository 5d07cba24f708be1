#!/usr/bin/env python3
"""Two ways to give named vLLM code its plain-Python checks back under -O, side by side.

    V=~/.cache/kimi-hotfix/venvs/vllm-0.33.0/bin/python
    KIMI_HOTFIX=0 PYTHONPATH=. $V -O bench/o_parity_mechanism.py [--rounds 15]

(a) per function, from vLLM's own source (kimi_hotfix.hardening, what
    kv_spec_merge, inner_dp_group and config_checks do): recompile the named
    functions with each ``assert`` as an explicit raise, checked byte for byte
    against the running code. Eager (at import, as kv_spec_merge) or on the
    first call (inner_dp_group, config_checks: only the process that calls the
    function pays).
(b) per module, through the import system: a meta-path loader compiles the
    named modules' source with ``optimize=0`` instead of loading the
    ``.opt-1.pyc`` that ``-O`` uses (or loads a plain ``.pyc`` when the image
    has one: pip compiles plain bytecode at install).

Part 1, cost: per target module, in one process, every round measures each
variant once, in a shuffled order (bench/stats.py: paired differences to the
``-O`` import's own work, median and bootstrap standard error, an A/A control):
  baseline    unmarshal the module's .opt-1.pyc (what -O does on import)
  A/A         the same again
  (b) source  compile the source with optimize=0 (no plain .pyc, or stale)
  (b) pyc     unmarshal the plain .pyc (when present)
  (a) eager   recompile the named functions (source read through linecache and
              parsed: the caches are cleared before each round, as in a fresh
              process)
  (a) lazy    what (a) on first call costs at import: the structural assert
              check and the wrapper (the recompile moves to the first call)
Module execution is the same for every variant and is not timed.

Part 2, correctness (child interpreters, -O, on the real vLLM): the CPU-offload
barrier's getter in a one-process gloo world, with (b) armed before vLLM is
imported, (b) armed after parallel_state was imported (what the pip plugin
sees: vLLM loads plugins late), (b) made to apply by reloading the module, and
(a) applied after import.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import linecache
import marshal
import os
import random
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import stats  # noqa: E402

TARGETS = {
    "vllm.distributed.parallel_state": ["get_inner_dp_world_group"],
    "vllm.config.vllm": ["VllmConfig.__post_init__", "VllmConfig._set_cudagraph_sizes",
                         "VllmConfig._set_compile_ranges", "VllmConfig.validate_block_size"],
    "vllm.v1.kv_cache_interface": ["FullAttentionSpec.merge", "MLAAttentionSpec.merge",
                                   "RSWASpec.merge", "SlidingWindowMLASpec.merge",
                                   "SinkFullAttentionSpec.merge"],
}


def _pyc(source_path, optimization):
    return importlib.util.cache_from_source(source_path, optimization=optimization)


def _resolve(module, dotted):
    owner = module
    *path, name = dotted.split(".")
    for part in path:
        owner = getattr(owner, part)
    value = vars(owner)[name]
    return getattr(value, "__func__", value)


def measure(modname, names, rounds):
    """Paired rounds for one target module (see the module docstring)."""
    from kimi_hotfix import hardening, recompile

    module = importlib.import_module(modname)
    path = module.__file__
    funcs = [_resolve(module, n) for n in names]
    opt1, plain = _pyc(path, "1" if sys.flags.optimize == 1 else "2"), _pyc(path, "")
    if not os.path.exists(opt1):
        raise SystemExit(f"{opt1} missing: import the module once under -O first")
    source = Path(path).read_bytes()

    def unmarshal(pyc):
        return marshal.loads(Path(pyc).read_bytes()[16:])

    def eager():
        linecache.clearcache()
        recompile.forget()
        for func in funcs:
            recompile.recompile(func, hardening.AssertToRaise().visit, optimize=0)
        recompile.forget()

    def lazy():
        linecache.clearcache()
        lazy_ = hardening.OnFirstCall("bench", funcs)
        for func in funcs:
            hardening.asserts(func)
            lazy_.wrapper(func)

    variants = {
        "baseline": lambda: unmarshal(opt1),
        "A/A": lambda: unmarshal(opt1),
        "(b) source, optimize=0": lambda: compile(source, path, "exec", dont_inherit=True,
                                                  optimize=0),
        "(a) eager": eager,
        "(a) lazy, at import": lazy,
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
    return {
        "lines": source.count(b"\n"),
        "baseline_ms": stats.estimate(base),
        **{name: stats.paired_estimate(base, values) for name, values in samples.items()
           if name != "baseline"},
    }


def cost(rounds):
    return {modname: measure(modname, names, rounds) for modname, names in TARGETS.items()}


CHILD = r"""
import importlib, importlib.abc, importlib.machinery, importlib.util, json, socket, sys
import torch.distributed as dist
MODE = sys.argv[1]
NAMES = ("vllm.distributed.parallel_state",)

class PlainLoader(importlib.machinery.SourceFileLoader):
    def get_code(self, fullname):  # the source, compiled as plain Python would
        path = self.get_filename(fullname)
        return compile(self.get_data(path), path, "exec", dont_inherit=True, optimize=0)

class PlainFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path=None, target=None):
        if fullname not in NAMES:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is not None:
            spec.loader = PlainLoader(fullname, spec.origin)
        return spec

out = {"mode": MODE, "optimize": sys.flags.optimize}
if MODE == "b-early":
    sys.meta_path.insert(0, PlainFinder())
from vllm.distributed import parallel_state
from vllm.v1.kv_offload.cpu import spec
with socket.socket() as s:
    s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]
dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", world_size=1, rank=0)
parallel_state._WORLD = parallel_state.init_world_group([0], 0, "gloo")
if MODE == "b-late":
    sys.meta_path.insert(0, PlainFinder())
if MODE == "b-reload":
    sys.meta_path.insert(0, PlainFinder())
    try:
        importlib.reload(parallel_state)
        out["reload"] = "ok"
    except Exception as e:
        out["reload"] = " ".join(f"{type(e).__name__}: {e}".split())[:160]
if MODE == "a-late":
    from kimi_hotfix import core, wrapping
    from kimi_hotfix.patches.inner_dp_group import PATCH
    PATCH.apply(parallel_state, wrapping.recorder(PATCH.name, [], core.load_wrapt))
try:
    spec._all_workers_barrier(); out["barrier"] = "ok"
except Exception as e:
    out["barrier"] = f"{type(e).__name__}: {e}"
out["world_group_after"] = "set" if parallel_state._WORLD is not None else "None"
print("KIMI_JSON:" + json.dumps(out))
"""


def correctness():
    rows = []
    env = dict(os.environ, VLLM_TARGET_DEVICE="cpu", VLLM_LOGGING_LEVEL="ERROR", KIMI_HOTFIX="0")
    for mode in ("none", "b-early", "b-late", "b-reload", "a-late"):
        proc = subprocess.run([sys.executable, "-O", "-c", CHILD, mode], capture_output=True,
                              text=True, env=env, timeout=600)
        lines = [line for line in proc.stdout.splitlines() if line.startswith("KIMI_JSON:")]
        rows.append(json.loads(lines[-1][10:]) if lines else {"mode": mode,
                                                               "error": proc.stderr[-500:]})
    return rows


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--skip-correctness", action="store_true")
    args = parser.parse_args(argv)
    if not sys.flags.optimize:
        raise SystemExit("run under -O: the comparison is about optimized interpreters")
    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
    import vllm

    print(f"vLLM {vllm.__version__}, python {sys.version.split()[0]} -O, {stats.machine()}")
    print(f"part 1: cost per target module, {args.rounds} paired rounds, ms "
          "(difference to unmarshalling the .opt-1.pyc, median +/- s.e.)")
    for modname, row in cost(args.rounds).items():
        print(f"\n  {modname} ({row['lines']} lines; .opt-1.pyc unmarshal "
              f"{row['baseline_ms'].median:.2f} ms)")
        for name, est in row.items():
            if name in ("lines", "baseline_ms"):
                continue
            print(f"    {name:26s} {est.fmt(' ms')}")
    if args.skip_correctness:
        return 0
    print("\npart 2: the CPU-offload barrier under -O, one-process gloo world (child per row)")
    for row in correctness():
        reload = f"reload: {row['reload']}; " if "reload" in row else ""
        print(f"  {row['mode']:9s} {reload}barrier: {row.get('barrier', row.get('error'))}; "
              f"world group afterwards: {row.get('world_group_after')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

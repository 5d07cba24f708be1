#!/usr/bin/env python3
"""Time to arm and apply every patch when vLLM loads, as a share of vLLM's import.

    ~/.cache/kimi-hotfix/venvs/vllm-0.29.0/bin/python bench/apply_cost.py [--rounds 5] [-O]

Each round runs two fresh processes of the given (vLLM venv) interpreter, in a
shuffled order, that import the three modules the patches target
(vllm.v1.kv_cache_interface, vllm.v1.worker.gpu.cudagraph_utils,
vllm.models.kimi_k3.nvidia.kda_metadata) and time that import in-process:

  no shim   no PYTHONPATH
  shim      PYTHONPATH=<repo>; the process also times, with perf_counter, the
            bootstrap's arming (sitecustomize.fire(): kimi_hotfix.core, the
            patch modules, the environment, wrapt, the hook registrations) and
            each patch's hook (decide from the loaded code, then wrap)

It prints the medians: the shim's own time, its share of the vLLM import measured
in the same process, and the side-by-side import times of both variants (process
to process noise on a vLLM import is far larger than the shim's cost, so the
in-process figure is the precise one; the difference of medians only bounds it).
The arming time is gross: it includes stdlib modules the shim happens to import
first and vLLM would import anyway; one extra ``-X importtime`` run attributes
the self time of the shim's own modules and wrapt.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TARGETS = (
    "vllm.v1.kv_cache_interface",
    "vllm.v1.worker.gpu.cudagraph_utils",
    "vllm.models.kimi_k3.nvidia.kda_metadata",
)

CHILD = """
import json, sys, time
timings = {"arm": 0.0, "hooks": {}}
bootstrap = sys.modules.get("kimi_hotfix_sitecustomize")
if bootstrap is not None:
    fire = bootstrap.fire

    def timed_fire():  # the ArmingLoader looks fire up in the module at call time
        before = set(sys.modules)
        t0 = time.perf_counter()
        fire()
        timings["arm"] += time.perf_counter() - t0
        timings["arm_imported"] = sorted(set(sys.modules) - before)
        core = sys.modules["kimi_hotfix.core"]
        settle = core._settle

        def timed_settle(name, module):  # the hooks look _settle up at call time
            t0 = time.perf_counter()
            try:
                return settle(name, module)
            finally:
                timings["hooks"][name] = timings["hooks"].get(name, 0.0) + time.perf_counter() - t0

        core._settle = timed_settle

    bootstrap.fire = timed_fire
t0 = time.perf_counter()
%(imports)s
total = time.perf_counter() - t0
states = sys.modules["kimi_hotfix.core"].states() if "kimi_hotfix.core" in sys.modules else None
print("KIMI_JSON:" + json.dumps({"import": total, "arm": timings["arm"], "hooks": timings["hooks"],
                                 "states": states, "arm_imported": timings.get("arm_imported", []),
                                 "modules": sorted(sys.modules)}))
"""


def run(python, flags, shim, importtime=False):
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "PYTHONOPTIMIZE") and not k.startswith("KIMI_HOTFIX")}
    env.update(VLLM_TARGET_DEVICE="cpu", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
               VLLM_NO_USAGE_STATS="1", VLLM_LOGGING_LEVEL="ERROR",
               VLLM_CACHE_ROOT=os.path.join(tempfile.gettempdir(), "kimi-hotfix-vllm-cache"))
    if shim:
        env["PYTHONPATH"] = str(REPO)
    code = CHILD % {"imports": "\n".join(f"import {t}" for t in TARGETS)}
    xflags = ["-X", "importtime"] if importtime else []
    proc = subprocess.run([python, *flags, *xflags, "-c", code], env=env, capture_output=True,
                          text=True, cwd=tempfile.gettempdir())
    if proc.returncode != 0:
        raise SystemExit(f"child failed:\n{proc.stderr[-4000:]}")
    line = [l for l in proc.stdout.splitlines() if l.startswith("KIMI_JSON:")][-1]
    out = json.loads(line[len("KIMI_JSON:"):])
    if importtime:  # self time of the shim's own modules (kimi_hotfix*, wrapt*), ms
        own = 0
        for l in proc.stderr.splitlines():
            m = re.match(r"import time:\s+(\d+) \|\s+\d+ \|\s*(\S+)$", l)
            if m and m.group(2).split(".")[0] in ("kimi_hotfix", "wrapt", "sitecustomize"):
                own += int(m.group(1))
        out["own_module_self_ms"] = own / 1e3
    return out


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--python", default=sys.executable, help="a vLLM venv's python")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("-O", dest="optimize", action="count", default=0,
                        help="run the children with -O (twice: -OO)")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    flags = ["-" + "O" * args.optimize] if args.optimize else []
    rng = random.Random(args.seed)
    samples = {"no shim": [], "shim": []}
    for _ in range(args.rounds):
        order = list(samples)
        rng.shuffle(order)
        for name in order:
            samples[name].append(run(args.python, flags, name == "shim"))
    attribution = run(args.python, flags, True, importtime=True)
    shim = samples["shim"]
    states = shim[-1]["states"]
    arm = [s["arm"] * 1e3 for s in shim]
    hooks = {name: [s["hooks"].get(name, 0.0) * 1e3 for s in shim] for name in states}
    own = [s["arm"] * 1e3 + sum(s["hooks"].values()) * 1e3 for s in shim]
    imp_shim = [s["import"] * 1e3 for s in shim]
    imp_bare = [s["import"] * 1e3 for s in samples["no shim"]]
    share = [o / i for o, i in zip(own, imp_shim)]
    med = statistics.median
    label = " ".join(flags) or "no -O"
    print(f"vLLM target imports, {args.python} ({label}), {args.rounds} interleaved rounds (medians)")
    print(f"  shim: arm (core, patches, env, wrapt, hooks registered) {med(arm):8.1f} ms")
    print(f"        of which importing the shim's own modules and wrapt  "
          f"{attribution['own_module_self_ms']:6.1f} ms (-X importtime self, one run); the rest:")
    others = [m for m in attribution["arm_imported"]
              if m.split(".")[0] not in ("kimi_hotfix", "wrapt")]
    loaded_anyway = set(samples["no shim"][-1]["modules"])
    extra = [m for m in others if m not in loaded_anyway]
    print(f"        modules loaded first by the arming: {len(others) - len(extra)} of {len(others)} "
          f"are imported by vLLM without the shim too")
    if extra:
        print(f"        (only the shim imports: {', '.join(extra)})")
    for name, values in hooks.items():
        print(f"  shim: hook {name:<20} (decide + wrap)    {med(values):8.1f} ms  -> {states[name]}")
    print(f"  shim: total own time                            {med(own):8.1f} ms")
    print(f"  vLLM import of the three modules, same process  {med(imp_shim):8.1f} ms")
    print(f"  share of the vLLM import (gross)                {med(share) * 100:8.2f} %")
    net = attribution["own_module_self_ms"] + med([sum(s["hooks"].values()) * 1e3 for s in shim])
    print(f"  share, net of stdlib that vLLM loads anyway     {net / med(imp_shim) * 100:8.2f} %"
          f"  ({net:.1f} ms: own modules + hooks)")
    print(f"  side by side: import without the shim {med(imp_bare):.0f} ms, with {med(imp_shim):.0f} ms "
          f"(ratio {med(imp_shim) / med(imp_bare):.3f}; spread without: "
          f"{min(imp_bare):.0f}-{max(imp_bare):.0f} ms, with: {min(imp_shim):.0f}-{max(imp_shim):.0f} ms)")


if __name__ == "__main__":
    main()

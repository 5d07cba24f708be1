#!/usr/bin/env python3
"""What the shim adds to a vLLM import, all of it, as a share of that import.

    ~/.cache/kimi-hotfix/uv-venvs/vllm-0.29.0-py3.11/bin/python bench/apply_cost.py [--rounds 5] [-O]

The import measured is that of the three modules the patches target
(vllm.v1.kv_cache_interface, vllm.v1.worker.gpu.cudagraph_utils,
vllm.models.kimi_k3.nvidia.kda_metadata) in a fresh process of the given (vLLM
venv) interpreter, with the shim on PYTHONPATH. What the shim adds there:

1. Its own steps, timed in-process with perf_counter: the bootstrap's arming
   (sitecustomize.fire(): kimi_hotfix.runtime.core, the patch modules, the environment,
   wrapt, the hook registrations) and each patch's hook (decide from the loaded
   code, then wrap). The arming imports about 150 stdlib modules before vLLM
   does; vLLM imports them anyway, so that time moves rather than adds. The
   "net" process of each round therefore imports those modules first (only the
   ones a process without the shim imports too, checked against a calibration
   process), and its arming and hooks are the added cost. The "gross" process
   (no pre-import) shows the arming as a user sees it in a profile.

2. The import-system cost of the shim's finders, which the steps above leave
   out: the bootstrap's ``VllmImportTrigger`` (first on sys.meta_path from
   start-up; its find_spec returns None for every name but "vllm"; it leaves
   sys.meta_path once it has fired, so a vLLM import calls it about once, but
   its per-call cost is still what every import pays in a process that never
   imports vLLM) and wrapt's
   post-import hook finder (``wrapt.importer.ImportHookFinder``, put in front of
   sys.meta_path by ``wrapt.register_post_import_hook`` during the arming). The
   import system asks every finder on sys.meta_path, in order, for every module
   it has not loaded yet, and importlib.util.find_spec probes do the same, so
   each finder is called thousands of times during a vLLM import.
   - Counts: one instrumented process (not used for any timing of the import)
     counts, during the import of the three target modules, every lookup through
     sys.meta_path (importlib's ``_find_spec``, from import statements and from
     importlib.util.find_spec), every call of each shim finder's find_spec, and
     the calls that find something (the trigger for "vllm", wrapt's finder for
     the three targets), whose gross time it records.
   - Cost per call: in that same process, once the import is done (the real
     finder objects, in their real state afterwards: the trigger armed, wrapt's
     hooks all fired), the script replays every lookup the import made, by
     calling importlib's own ``_find_spec(name, parent.__path__)``, i.e. the
     exact loop the import system runs per module (it takes the import lock
     around each finder, looks up find_spec, calls it), with sys.meta_path set
     to: the bare list (the process's finders without the shim's), a copy of it
     (A/A control), the bare list plus the trigger, plus wrapt's finder, plus
     both (as installed). Each lookup calls every variant once, in a shuffled
     order; the per-call cost is the median of the per-lookup differences to
     the bare list. This times the finders where they cost (inside the import
     loop, with the lock and attribute lookups the loop adds per finder), on
     the names vLLM really imports, without timing anything else twice: a
     finder that returns None adds the same work to a lookup whatever happens
     after it. The calls that find something are few (4) and are added with
     their gross time, which includes the path search the import would do
     anyway (an upper bound). Not timed: the loader proxies that wrap the 4
     found modules' exec_module (a few attribute sets each).
   - Finder total = calls x cost per call, for each finder, + the found calls.

3. The total (own steps, net, + finders) as a share of the vLLM import, per
   round in the net process (its import time less the shim's own time; it
   excludes the pre-imported stdlib, which makes the share slightly larger, not
   smaller), with its error bar (bench/stats.py: median, bootstrap standard
   error; the finders' error added in quadrature). Verdict: PASS only when the
   upper bound (median + 2 s.e.) is at most 1 % of the import.

4. A sanity bound from whole processes: per round, the wall time and the
   in-process import time of a process without the shim, another one without
   it (the A/A control), and one with it, in a shuffled order; the paired
   differences, their error bars and spreads. One vLLM import varies by
   seconds from process to process on this machine, so these cannot resolve
   1 %; the script prints how many rounds they would need.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import stats

REPO = Path(__file__).resolve().parents[1]
LIMIT = 0.01  # of the vLLM import
TARGETS = (
    "vllm.v1.kv_cache_interface",
    "vllm.v1.worker.gpu.cudagraph_utils",
    "vllm.models.kimi_k3.nvidia.kda_metadata",
)
OWN = ("kimi_hotfix", "wrapt", "sitecustomize", "kimi_hotfix_sitecustomize")

CHILD = """
import json, sys, time
timings = {"arm": 0.0, "hooks": {}, "arm_imported": [], "hook_imported": []}
bootstrap = sys.modules.get("kimi_hotfix_sitecustomize")
if bootstrap is not None:
    fire = bootstrap.fire

    def timed_fire():  # the ArmingLoader looks fire up in the module at call time
        before = set(sys.modules)
        t0 = time.perf_counter()
        fire()
        timings["arm"] += time.perf_counter() - t0
        timings["arm_imported"] = sorted(set(sys.modules) - before)
        core = sys.modules["kimi_hotfix.runtime.core"]
        settle = core.settle

        def timed_settle(name, module):  # the hooks look settle up at call time
            before = set(sys.modules)
            t0 = time.perf_counter()
            try:
                return settle(name, module)
            finally:
                timings["hooks"][name] = timings["hooks"].get(name, 0.0) + time.perf_counter() - t0
                timings["hook_imported"] += sorted(set(sys.modules) - before)

        core.settle = timed_settle

    bootstrap.fire = timed_fire
for name in %(preimport)r:  # the "net" process: stdlib modules that vLLM imports anyway
    __import__(name)
if bootstrap is not None and bootstrap.ARMED:
    raise SystemExit("the pre-import armed the shim")
t0 = time.perf_counter()
%(imports)s
total = time.perf_counter() - t0
core = sys.modules.get("kimi_hotfix.runtime.core")
states = {n: str(s) for n, s in core.states().items()} if core is not None else None
print("KIMI_JSON:" + json.dumps(dict(timings, **{"import": total, "states": states,
                                                  "modules": sorted(sys.modules)})))
"""

# The finder counts and the per-call costs (item 2 of the docstring). Runs with
# the shim on PYTHONPATH; writes its samples to the file named by argv[1].
FINDER_CHILD = """
import gc, json, random, sys, time
import importlib.util
import _frozen_importlib as _bootstrap

OUT, REPS, SEED = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
window = [False]
counts = {"imports": 0, "probes": 0, "trigger": 0, "wrapt": 0}
found = {"trigger": [], "wrapt": []}  # (name, gross seconds) of calls that found a spec
lookups = []
instrumented = {}


def is_wrapt(finder):  # wrapt's or a vendored copy's (kimi_hotfix._vendor.wrapt)
    return "wrapt" in type(finder).__module__.split(".") and \
        type(finder).__name__.endswith("ImportHookFinder")


def instrument(cls, key):
    original = cls.find_spec

    def find_spec(self, fullname, path=None, target=None):
        if not window[0]:
            return original(self, fullname, path, target)
        counts[key] += 1
        t0 = time.perf_counter()
        spec = original(self, fullname, path, target)
        if spec is not None:
            found[key].append((fullname, time.perf_counter() - t0))
        return spec

    instrumented[cls] = original
    cls.find_spec = find_spec


def counter(original, key):
    def _find_spec(name, path, target=None):
        if window[0]:
            counts[key] += 1
            lookups.append(name)
            for finder in sys.meta_path:  # wrapt's finder appears during the arming
                if is_wrapt(finder) and type(finder) not in instrumented:
                    instrument(type(finder), "wrapt")
        return original(name, path, target)
    return _find_spec


trigger = next(f for f in sys.meta_path if type(f).__name__ == "VllmImportTrigger")
instrument(type(trigger), "trigger")
find_spec_original = _bootstrap._find_spec
_bootstrap._find_spec = counter(find_spec_original, "imports")  # import statements
importlib.util._find_spec = counter(find_spec_original, "probes")  # importlib.util.find_spec
modules_before = len(sys.modules)
window[0] = True
%(imports)s
window[0] = False
_bootstrap._find_spec = importlib.util._find_spec = find_spec_original
for cls, original in instrumented.items():
    cls.find_spec = original
loaded = len(sys.modules) - modules_before

shim = [f for f in sys.meta_path if f is trigger or is_wrapt(f)]
wrapt_finder = next(f for f in shim if f is not trigger)
bare = [f for f in sys.meta_path if f not in shim]
variants = {"bare": bare, "bare A/A": list(bare), "trigger": [trigger] + bare,
            "wrapt": [wrapt_finder] + bare, "both": [wrapt_finder, trigger] + bare}

replay, skipped = [], 0
for name in lookups:
    parent = name.rpartition(".")[0]
    if not parent:
        replay.append((name, None))
    elif getattr(sys.modules.get(parent), "__path__", None) is not None:
        replay.append((name, sys.modules[parent].__path__))
    else:
        skipped += 1


def run(reps, samples):
    saved = sys.meta_path
    clock = time.perf_counter_ns
    find = find_spec_original
    rng = random.Random(SEED)
    order = list(variants)
    gc.disable()
    try:
        for _ in range(reps):
            for name, path in replay:
                rng.shuffle(order)
                for key in order:
                    sys.meta_path = variants[key]
                    t0 = clock()
                    find(name, path)
                    t1 = clock()
                    if samples is not None:
                        samples[key].append(t1 - t0)
                sys.meta_path = saved
    finally:
        sys.meta_path = saved
        gc.enable()


run(1, None)  # warm-up: first lookups may import a parent, fill path caches
samples = {key: [] for key in variants}
run(REPS, samples)
with open(OUT, "w") as fh:
    json.dump({"counts": counts, "found": found, "loaded": loaded, "replayed": len(replay),
               "skipped": skipped, "reps": REPS, "samples": samples,
               "meta_path": [getattr(f, "__qualname__", type(f).__qualname__) for f in sys.meta_path],
               "bare": len(bare), "stay": {"trigger": trigger in sys.meta_path,
                                           "wrapt": wrapt_finder in sys.meta_path},
               "wrapt_finder": type(wrapt_finder).__module__ + "." + type(wrapt_finder).__qualname__},
              fh)
"""


def child_env(shim):
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "PYTHONOPTIMIZE") and not k.startswith("KIMI_HOTFIX")}
    env.update(VLLM_TARGET_DEVICE="cpu", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
               VLLM_NO_USAGE_STATS="1", VLLM_LOGGING_LEVEL="ERROR",
               VLLM_CACHE_ROOT=os.path.join(tempfile.gettempdir(), "kimi-hotfix-vllm-cache"))
    if shim:
        env["PYTHONPATH"] = str(REPO)
    return env


def imports_code():
    return "\n".join(f"import {t}" for t in TARGETS)


def run(python, flags, shim, preimport=()):
    """One process; its in-process figures and its wall time (s)."""
    code = CHILD % {"imports": imports_code(), "preimport": list(preimport)}
    t0 = __import__("time").perf_counter()
    proc = subprocess.run([python, *flags, "-c", code], env=child_env(shim), capture_output=True,
                          text=True, cwd=tempfile.gettempdir())
    wall = __import__("time").perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"child failed:\n{proc.stderr[-4000:]}")
    line = [text for text in proc.stdout.splitlines() if text.startswith("KIMI_JSON:")][-1]
    out = json.loads(line[len("KIMI_JSON:"):])
    out["wall"] = wall
    return out


def finder_costs(python, flags, reps, seed):
    with tempfile.TemporaryDirectory(prefix="kimi-hotfix-finders-") as tmp:
        out = os.path.join(tmp, "finders.json")
        code = FINDER_CHILD % {"imports": imports_code()}
        proc = subprocess.run([python, *flags, "-c", code, out, str(reps), str(seed)],
                              env=child_env(True), capture_output=True, text=True,
                              cwd=tempfile.gettempdir())
        if proc.returncode != 0:
            raise SystemExit(f"finder child failed:\n{proc.stderr[-4000:]}")
        with open(out) as fh:
            return json.load(fh)


def own_name(module):
    return module.split(".")[0] in OWN


def stdlib(module):
    return module.split(".")[0] in sys.stdlib_module_names


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--python", default=sys.executable, help="a vLLM venv's python")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--replays", type=int, default=10,
                        help="times the finder timing replays every lookup of the import")
    parser.add_argument("-O", dest="optimize", action="count", default=0,
                        help="run the children with -O (twice: -OO)")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    flags = ["-" + "O" * args.optimize] if args.optimize else []
    med = statistics.median

    # -- the finders: counts and per-call costs, one instrumented process -----
    fc = finder_costs(args.python, flags, args.replays, args.seed)
    s = fc["samples"]
    per_call = {key: stats.paired_estimate(s["bare"], s[key]).scaled(1e-3)  # us
                for key in ("bare A/A", "trigger", "wrapt", "both")}
    counts, found = fc["counts"], fc["found"]
    found_ms = {key: sum(t for _, t in found[key]) * 1e3 for key in found}
    # ms: calls x us per call / 1000, plus the found calls' gross time
    trig_ms = per_call["trigger"].scaled(counts["trigger"] / 1e3)
    wrapt_ms = per_call["wrapt"].scaled(counts["wrapt"] / 1e3)
    finders_ms = trig_ms.plus(wrapt_ms)
    finders_ms = stats.Estimate(finders_ms.median + sum(found_ms.values()), finders_ms.se,
                                finders_ms.n)
    control_ms = per_call["bare A/A"].scaled(max(counts["trigger"], counts["wrapt"]) / 1e3)

    # -- calibration: which modules a process without the shim loads ---------
    bare_modules = set(run(args.python, flags, False)["modules"])
    calib = run(args.python, flags, True)
    first = set(calib["arm_imported"] + calib["hook_imported"])
    moved = sorted(m for m in first if not own_name(m) and stdlib(m) and m in bare_modules)
    extra = sorted(m for m in first if not own_name(m) and m not in moved)

    # -- rounds -----------------------------------------------------------------
    rng = random.Random(args.seed)
    kinds = {"no shim": (False, ()), "no shim (A/A)": (False, ()), "shim": (True, ()),
             "shim, net": (True, moved)}
    samples = {name: [] for name in kinds}
    for _ in range(args.rounds):
        order = list(kinds)
        rng.shuffle(order)
        for name in order:
            shim, pre = kinds[name]
            samples[name].append(run(args.python, flags, shim, pre))

    gross, net = samples["shim"], samples["shim, net"]
    states = gross[-1]["states"]

    def own_ms(s):
        return (s["arm"] + sum(s["hooks"].values())) * 1e3

    label = " ".join(flags) or "no -O"
    print(f"vLLM import of the three target modules, {args.python} ({label}), "
          f"{args.rounds} interleaved rounds")
    print(f"machine at the start: {stats.machine()}; absolute times vary with the load, "
          "the paired and in-process figures are what counts")
    print()
    print("1. Finder calls during the import (one instrumented process):")
    print(f"   lookups through sys.meta_path: {counts['imports'] + counts['probes']} "
          f"({counts['imports']} by import statements, {counts['probes']} by "
          f"importlib.util.find_spec); modules loaded: {fc['loaded']}")
    for key, title in (("trigger", "VllmImportTrigger.find_spec"),
                       ("wrapt", f"{fc['wrapt_finder']}.find_spec")):
        hits = ", ".join(f"{n} {t * 1e3:.2f} ms" for n, t in found[key])
        print(f"   {title}: {counts[key]} calls; found {len(found[key])}: {hits or '-'}")
    print(f"   sys.meta_path afterwards: {', '.join(fc['meta_path'])}")
    print()
    n_pairs = len(s["bare"])
    print(f"2. Cost per call: importlib's _find_spec on the {fc['replayed']} real lookups "
          f"({fc['skipped']} skipped: parent not loaded), {fc['reps']} replays, "
          f"{n_pairs} paired lookups per variant")
    print(f"   bare sys.meta_path ({fc['bare']} finders): "
          f"{med(s['bare']) / 1e3:.2f} us per lookup (median)")
    for key, title in (("bare A/A", "bare, a copy (A/A control)"), ("trigger", "+ VllmImportTrigger"),
                       ("wrapt", "+ wrapt's finder"), ("both", "+ both (as installed)")):
        print(f"   {title:<30} {per_call[key].fmt(' us', 3)}")
    print(f"   check: trigger + wrapt = {per_call['trigger'].median + per_call['wrapt'].median:+.3f} "
          f"us against both {per_call['both'].median:+.3f} us")
    print(f"   in this import: trigger {counts['trigger']} x {per_call['trigger'].median:.3f} us = "
          f"{trig_ms.median:.2f} ms, wrapt {counts['wrapt']} x {per_call['wrapt'].median:.3f} us = "
          f"{wrapt_ms.median:.2f} ms, found calls (gross) {sum(found_ms.values()):.2f} ms")
    stay = [key for key in ("trigger", "wrapt") if fc["stay"][key]]
    later = sum(per_call[key].median for key in stay)
    print(f"   finders in total: {finders_ms.fmt(' ms')}; per 1000 later imports: {later:.2f} ms "
          f"(on sys.meta_path after the import: {' and '.join(stay) or 'neither'})")
    print()

    arm_g = [x["arm"] * 1e3 for x in gross]
    arm_n = [x["arm"] * 1e3 for x in net]
    print(f"3. The shim's own steps (perf_counter in-process; median over {args.rounds} rounds, "
          "bootstrap s.e.):")
    print(f"   arming, gross (kimi_hotfix, patches, wrapt, hooks registered)   "
          f"{stats.estimate(arm_g).fmt(' ms', 1)}")
    print(f"   arming, net: {len(moved)} stdlib modules that vLLM loads anyway imported first "
          f"{stats.estimate(arm_n).fmt(' ms', 1)}")
    if extra:
        print(f"     (not pre-imported, so counted in the net figure: {', '.join(extra)})")
    for name in states:
        values = [x["hooks"].get(name, 0.0) * 1e3 for x in net]
        print(f"   hook {name:<20} (decide + wrap), net process          "
              f"{stats.estimate(values).fmt(' ms', 1)}  -> {states[name]}")
    own_net = [own_ms(x) for x in net]
    print(f"   own steps, net                                                  "
          f"{stats.estimate(own_net).fmt(' ms', 1)}")
    print(f"   own steps, gross                                                "
          f"{stats.estimate([own_ms(x) for x in gross]).fmt(' ms', 1)}")
    print()

    # share per round, in the net process: (own + finders) / (import - own - finders)
    shares = []
    for x in net:
        own = own_ms(x)
        shares.append((own + finders_ms.median) / (x["import"] * 1e3 - own - finders_ms.median))
    share = stats.estimate(shares)
    vllm_ms = med([x["import"] * 1e3 - own_ms(x) - finders_ms.median for x in net])
    finders_share_se = finders_ms.se / vllm_ms
    total = stats.Estimate(share.median, (share.se ** 2 + finders_share_se ** 2) ** 0.5, share.n)
    control = control_ms.scaled(1 / vllm_ms)
    print(f"4. Total: own steps (net) + finders = {med(own_net) + finders_ms.median:.1f} ms on a "
          f"vLLM import of {vllm_ms / 1e3:.2f} s (net process, less the shim's own time)")
    verdict, line = stats.verdict_line("the shim's share of the vLLM import", total.scaled(100),
                                       LIMIT * 100, control.scaled(100), " %", 4)
    print("   " + line)
    print(f"   (A/A control: the finder replay's bare list against a copy of it, "
          f"{per_call['bare A/A'].median:+.3f} us per call, times the calls: "
          f"{control_ms.median:+.2f} ms; the own steps are direct measurements of the shim's "
          "code, with no baseline to compare)")
    print()

    print("5. Sanity bound, whole processes (paired by round, shuffled order):")
    in_process_s = (med([own_ms(x) for x in gross]) + finders_ms.median) / 1e3
    base = samples["no shim"]
    for key, title in (("import", "in-process import"), ("wall", "process wall time")):
        b = [x[key] for x in base]
        for other, what in (("no shim (A/A)", "A/A, no shim again"), ("shim", "with the shim")):
            o = [x[key] for x in samples[other]]
            e = stats.paired_estimate(b, o)
            print(f"   {title}, {what:<18}: {e.fmt(' s', 2)}; spread "
                  f"{min(o):.2f} to {max(o):.2f} s against {min(b):.2f} to {max(b):.2f} s")
            if other == "no shim (A/A)" and not e.consistent_with_zero():
                print(f"     the A/A control is not zero within 2 s.e.: the machine's load moved "
                      f"by about {e.median:+.2f} s between processes of one round")
        e = stats.paired_estimate(b, [x[key] for x in samples["shim"]])
        limit_s = LIMIT * med(b)
        if not e.se == e.se:  # nan: a single round
            print("     one round: no error bar; run more rounds")
        elif 2 * e.se > limit_s:
            need = int(e.n * (2 * e.se / limit_s) ** 2) + 1
            print(f"     2 s.e. = {2 * e.se:.2f} s is {2 * e.se / limit_s:.0f} x the limit "
                  f"({limit_s:.2f} s = 1 %): whole processes cannot resolve 1 % here; that would "
                  f"take about {need} rounds at this spread")
        else:
            print(f"     2 s.e. = {2 * e.se:.2f} s, within the limit's size ({limit_s:.2f} s)")
        if key == "import" and e.se == e.se:
            inside = e.lower <= in_process_s <= e.upper
            print(f"     the in-process total above ({in_process_s * 1e3:.0f} ms, gross own steps + "
                  f"finders) is {'inside' if inside else 'OUTSIDE'} this difference's "
                  f"median +/- 2 s.e. ({e.lower:+.2f} to {e.upper:+.2f} s)")
    return 0 if verdict == "PASS" else 1


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""What the shim loads and what arming it costs, two trees side by side.

    python3 bench/loaded.py                       # 715439d against this checkout, 9 rounds, -O
    python3 bench/loaded.py --rounds 3 --before 715439d --after DIR --opt=-O,plain

Compares two trees of the shim in one run: "before", the tree at git revision
``--before`` (default 715439d; extracted by ``git archive`` into a temporary
directory, so nothing is left registered in the repository), and "after", the
directory ``--after`` (default: the checkout holding this script, as its working
tree is, uncommitted changes included), copied at the start (sitecustomize.py,
kimi_hotfix/, *.dist-info/; no bytecode) into the same temporary directory: the
run measures one after tree even while it is being edited, and both sides sit on
the same filesystem. A third side, "before-again", is the
before tree once more: the A/A control (what "no difference" measures here).
The bench's own process needs only the stdlib and bench/stats.py; it imports no
kimi_hotfix module.

Every measured process is a fresh child of the vLLM 0.29.0 CPU venv's python
(``--python``), run with ``-O`` (what the issue asks for; ``--opt=-O,plain``
also runs plain Python, each flag its own tables), ``PYTHONPATH=<tree>`` and a
clean environment: os.environ less PYTHONPATH, PYTHONOPTIMIZE, KIMI_HOTFIX_* and
PROMETHEUS_*; VLLM_TARGET_DEVICE=cpu, the Hugging Face offline flags, no usage
stats; the shim's own settings at their defaults. Each process has its own
TMPDIR (and working directory) under one temporary directory, removed at the
end, so pod directories and torch's caches do not litter. Two process kinds:

  no target      ``import vllm`` (0.29 imports torch, none of the patch targets)
  every target   an EngineCore's view: ``import vllm`` and the five target modules
                 (TARGETS below)

and two variants of each:

  net     the modules a process WITHOUT the shim loads anyway for the same
          imports are imported first (all of them but vllm*, in their load
          order; the set comes from one calibration child per kind and flag, run
          with no shim on PYTHONPATH), then
          ``sys.modules["kimi_hotfix_sitecustomize"].fire()`` is timed: arming's
          own cost, not counting modules that vLLM imports anyway. What arming
          imports beyond those (e.g. wrapt, where vLLM does not import it) IS
          counted, and listed.
  gross   fire() timed first thing in a fresh process, nothing pre-imported:
          arming as a profile shows it.

In both, the kind's imports come next, timed as ``import`` (in the net variant
most of their modules are loaded by then: its import time is vLLM's own
modules plus the patches' hooks, not a vLLM import as a user sees it; the gross
figure is that). fire() is the bootstrap's entry point (both trees have it and
its ``ARMED`` flag; the trigger's loader calls it just before vllm/__init__
runs); called directly, the trigger is retired and ``import vllm`` does not arm
again. Each child checks that its stderr has the shim's summary line
(``kimi-hotfix 0.1.0 (vllm``): a tree whose core cannot load logs "inactive"
instead, and the run stops there, with that child's stderr, exit status 2.

Lines: after the imports, every module in sys.modules named ``kimi_hotfix`` or
``kimi_hotfix.*`` with a ``__file__`` (less ``kimi_hotfix._vendor.*``, a copy
of wrapt) is counted, ``wc -l`` of its file, with its path relative to the tree
(a module from outside the tree stops the run). The bootstrap
(``kimi_hotfix_sitecustomize``, sitecustomize.py) is not counted: every Python
process loads it, vLLM or not (bench/startup.py measures it). Lines are
deterministic: taken from the first round, and the run stops if a later round
differs.

Rounds: ``--rounds`` (default 9); each runs {before, before-again, after} x
{no target, every target} x {net, gross} x flags once, in a shuffled order
(``--seed``), after each tree is compiled (``compileall -o 0 -o 1 -o 2``, as
scripts/bundle ships it; PYTHONDONTWRITEBYTECODE is dropped from the children's
environment) and one unmeasured warm-up process per tree and flag: neither side
pays for compiling (without bytecode every module loaded is compiled at every
start, which favours the side that loads fewer lines). Arming's figure is
paired by round, ``after / before`` (and ``before-again / before``, the A/A
control), its median and bootstrap standard error (bench/stats.py); the
interval printed is median +/- 2 s.e.

Verdicts (the issue's goals):
- the no-target process loads at most 2,000 lines of kimi_hotfix (after tree;
  deterministic: a count, no error bar);
- arming, net, after <= 0.5 x before: PASS only when the upper bound of the
  ratio (median + 2 s.e.) is <= 0.5, per kind; printed with bench/stats.py's
  verdict_line as ``after / before - 1`` against a limit of -0.50, beside the
  A/A control ``before-again / before - 1``.

Exit status: 0 when every verdict is PASS, 1 when one is not, 2 when a child
failed (its stderr tail is printed).

Not counted: the import system's cost of the shim's finders during the import
(bench/apply_cost.py measures it), the patches' hooks apart from the imports
they run in (they are inside ``import`` of the every-target kind), the
bootstrap's start-up (bench/startup.py), and anything after the imports
(first calls, exit).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import stats
from trees import compile_tree, describe, extract, snapshot

REPO = Path(__file__).resolve().parents[1]
DEFAULT_PYTHON = "~/.cache/kimi-hotfix/uv-venvs/vllm-0.29.0-py3.11/bin/python"
DEFAULT_BEFORE = "715439d"
# the patches' target modules (kimi_hotfix.runtime.registry may list them one day; the
# bench does not import kimi_hotfix, so they are written out here)
TARGETS = (
    "vllm.v1.kv_cache_interface",
    "vllm.v1.worker.gpu.cudagraph_utils",
    "vllm.models.kimi_k3.nvidia.kda_metadata",
    "vllm.distributed.parallel_state",
    "vllm.config.vllm",
)
KINDS = {"no target": ("vllm",), "every target": ("vllm",) + TARGETS}
SIDES = ("before", "before-again", "after")  # before-again: the A/A control
VARIANTS = ("net", "gross")
SUMMARY = "kimi-hotfix 0.1.0 (vllm"  # the shim's summary line, logged when it arms
LINES_LIMIT = 2000  # no-target process, after tree
ARM_RATIO_LIMIT = 0.5  # arming (net), after / before
BOOTSTRAP = "kimi_hotfix_sitecustomize"
DROPPED_ENV = ("PYTHONPATH", "PYTHONOPTIMIZE", "PYTHONDONTWRITEBYTECODE")  # the trees have bytecode
DROPPED_PREFIXES = ("KIMI_HOTFIX", "PROMETHEUS")
NOT_PREIMPORTED = ("__main__", "__mp_main__", "sitecustomize", "usercustomize", BOOTSTRAP)

# The measured child. argv[1]: a JSON file with "tree", "preimport" (names, in
# load order), "imports" and "calibrate". Prints one line, "KIMI_JSON:" + JSON.
CHILD = r'''
import json, os, sys, time
cfg = json.load(open(sys.argv[1]))


def out(**fields):
    sys.stdout.write("KIMI_JSON:" + json.dumps(fields) + "\n")
    sys.stdout.flush()


if cfg["calibrate"]:  # no shim: which modules do these imports load?
    if BOOTSTRAP in sys.modules:
        raise SystemExit("calibration child: the shim's bootstrap is loaded")
    for name in cfg["imports"]:
        __import__(name)
    out(modules=list(sys.modules))
    raise SystemExit(0)

boot = sys.modules.get(BOOTSTRAP)
if boot is None:
    raise SystemExit(f"{BOOTSTRAP} is not loaded: the tree's sitecustomize.py did not run")
if os.path.dirname(os.path.abspath(boot.__file__)) != cfg["tree"]:
    raise SystemExit(f"the bootstrap was loaded from {boot.__file__}, not from {cfg['tree']}")
if boot.ARMED:
    raise SystemExit("the shim was armed at start-up")
failed = []
for name in cfg["preimport"]:
    if name in sys.modules:
        continue
    try:
        __import__(name)
    except Exception as exc:
        failed.append(f"{name}: {type(exc).__name__}")
if boot.ARMED:
    raise SystemExit("the pre-import armed the shim")
loaded = set(sys.modules)
t0 = time.perf_counter()
boot.fire()
arm = time.perf_counter() - t0
if not boot.ARMED:
    raise SystemExit("fire() did not set ARMED")
arm_imported = [n for n in sys.modules if n not in loaded]
t0 = time.perf_counter()
for name in cfg["imports"]:
    __import__(name)
imported = time.perf_counter() - t0

tree = cfg["tree"]
modules, outside = {}, []
for name, module in list(sys.modules.items()):
    if name != "kimi_hotfix" and not name.startswith("kimi_hotfix."):
        continue
    if name == "kimi_hotfix._vendor" or name.startswith("kimi_hotfix._vendor."):
        continue
    path = getattr(module, "__file__", None)
    if not path:
        continue
    path = os.path.abspath(path)
    if not path.startswith(tree + os.sep):
        outside.append(f"{name}: {path}")
        continue
    with open(path, "rb") as fh:
        modules[os.path.relpath(path, tree)] = fh.read().count(b"\n")  # wc -l
if outside:
    raise SystemExit("kimi_hotfix modules from outside the tree: " + "; ".join(outside))
out(arm_s=arm, import_s=imported, lines=sum(modules.values()), modules=modules,
    arm_imported=arm_imported, preimport_failed=failed)
'''.replace("BOOTSTRAP", repr(BOOTSTRAP))


class ChildFailed(Exception):
    pass


def child_env(tree, tmpdir):
    env = {k: v for k, v in os.environ.items()
           if k not in DROPPED_ENV and not k.startswith(DROPPED_PREFIXES)}
    env.update(VLLM_TARGET_DEVICE="cpu", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
               VLLM_NO_USAGE_STATS="1", TMPDIR=str(tmpdir), TEMP=str(tmpdir), TMP=str(tmpdir))
    if tree is not None:
        env["PYTHONPATH"] = str(tree)
    return env


class Runner:
    """Runs children, each with its own TMPDIR under ``root``."""

    def __init__(self, python, root):
        self.python, self.root, self.count = python, Path(root), 0

    def run(self, label, flags, tree, imports, preimport=(), calibrate=False):
        self.count += 1
        tmpdir = self.root / f"proc-{self.count}"
        tmpdir.mkdir()
        cfg = tmpdir / "cfg.json"
        cfg.write_text(json.dumps({"tree": str(tree) if tree else None, "imports": list(imports),
                                   "preimport": list(preimport), "calibrate": calibrate}))
        cmd = [self.python, *flags, "-c", CHILD, str(cfg)]
        try:
            proc = subprocess.run(cmd, env=child_env(tree, tmpdir), cwd=tmpdir,
                                  capture_output=True, text=True, timeout=900)
        except subprocess.TimeoutExpired as exc:
            err = exc.stderr or b""  # bytes even with text=True, on some Pythons
            err = err.decode(errors="replace") if isinstance(err, bytes) else err
            raise ChildFailed(f"{label}: timed out after 900 s\n{err[-4000:]}") from None
        finally:
            shutil.rmtree(tmpdir, ignore_errors=True)
        lines = [t for t in proc.stdout.splitlines() if t.startswith("KIMI_JSON:")]
        problem = None
        if proc.returncode != 0:
            problem = f"exit status {proc.returncode}"
        elif not lines:
            problem = "no KIMI_JSON line on stdout"
        elif not calibrate and not any(SUMMARY in t for t in proc.stderr.splitlines()):
            problem = f"the shim did not arm: no line with {SUMMARY!r} on stderr"
        if problem:
            tail = "\n".join(proc.stderr.splitlines()[-40:])[-6000:]
            raise ChildFailed(f"{label} ({' '.join(flags) or 'plain'}, PYTHONPATH={tree}): "
                              f"{problem}\n--- stderr tail ---\n{tail}\n--- stdout tail ---\n"
                              f"{proc.stdout[-1500:]}")
        return json.loads(lines[-1][len("KIMI_JSON:"):])


def parse_opts(text):
    flags = []
    for item in text.split(","):
        item = item.strip()
        if item in ("", "plain", "none"):
            flags.append(())
        elif item.lstrip("-") in ("O", "OO"):
            flags.append(("-" + item.lstrip("-"),))
        else:
            raise SystemExit(f"bench/loaded.py: --opt: {item!r} is not one of -O, -OO, plain")
    return list(dict.fromkeys(flags))


def flag_name(flags):
    return " ".join(flags) or "plain"


def preimport_set(modules):
    """The calibration child's modules that the net child imports first: all but
    vLLM's own (in load order, so a module's dependencies come before it)."""
    return [m for m in modules if not m.startswith("vllm") and m not in NOT_PREIMPORTED
            and m != "kimi_hotfix" and not m.startswith("kimi_hotfix.")]


def fmt_lines(sample):
    return f"{sample['lines']:,} ({len(sample['modules'])})"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--python", default=DEFAULT_PYTHON,
                        help="the vLLM 0.29.0 CPU venv's python (default %(default)s)")
    parser.add_argument("--before", default=DEFAULT_BEFORE, metavar="REV",
                        help="git revision of the before tree (default %(default)s)")
    parser.add_argument("--after", default=str(REPO), metavar="DIR",
                        help="the after tree (default: this checkout, %(default)s)")
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--opt", default="-O", metavar="FLAGS",
                        help="comma-separated interpreter flags, each its own tables: -O, -OO, "
                             "plain (default -O; e.g. --opt=-O,plain)")
    args = parser.parse_args(argv)
    python = os.path.expanduser(args.python)
    if not os.access(python, os.X_OK):
        raise SystemExit(f"bench/loaded.py: no interpreter at {python} (scripts/build-venv 0.29.0)")
    if args.rounds < 1:
        raise SystemExit("bench/loaded.py: --rounds must be at least 1")
    opts = parse_opts(args.opt)
    after = Path(args.after).resolve()
    if not (after / "sitecustomize.py").is_file() or not (after / "kimi_hotfix").is_dir():
        raise SystemExit(f"bench/loaded.py: {after} has no sitecustomize.py and kimi_hotfix/")
    try:
        return measure(args, python, opts, after)
    except ChildFailed as exc:
        print(f"bench/loaded.py: a child failed: {exc}", file=sys.stderr)
        return 2


def measure(args, python, opts, after):
    med = statistics.median
    with tempfile.TemporaryDirectory(prefix="kimi-hotfix-loaded-") as tmp:
        before = Path(tmp) / "before"
        commit = extract(args.before, before)
        state = describe(after)
        after_copy = snapshot(after, Path(tmp) / "after")
        trees = {"before": before, "before-again": before, "after": after_copy}
        procs = Path(tmp) / "procs"
        procs.mkdir()
        runner = Runner(python, procs)
        print(f"bench/loaded.py: {python}, {args.rounds} interleaved rounds, "
              f"flags: {', '.join(flag_name(f) for f in opts)}")
        print(f"before: {args.before} = {commit[:12]} (git archive into a temporary directory); "
              f"after: {after} ({state}), copied at the start; "
              "before-again: the before tree (A/A control)")
        for side in ("before", "after"):
            if (trees[side] / "kimi_hotfix" / "_vendor").is_dir():
                print(f"note: the {side} tree has kimi_hotfix/_vendor/ (its own wrapt), "
                      "the other side may not")
        print(f"machine at the start: {stats.machine()}")
        if args.rounds < 2:
            print("one round: no error bars (nan), so no verdict on timing can PASS")
        print()

        # calibration (no shim) and warm-up (bytecode caches), not measured
        preimport = {}
        for flags in opts:
            for kind, imports in KINDS.items():
                log(f"calibration: {kind}, {flag_name(flags)}")
                modules = runner.run(f"calibration, {kind}", flags, None, imports,
                                     calibrate=True)["modules"]
                preimport[flags, kind] = preimport_set(modules)
            for side in ("before", "after"):
                log(f"warm-up: {side}, {flag_name(flags)}")
                compile_tree(python, trees[side])
                runner.run(f"warm-up, {side}", flags, trees[side], KINDS["every target"])

        jobs = [(side, kind, variant, flags) for side in SIDES for kind in KINDS
                for variant in VARIANTS for flags in opts]
        samples = {job: [] for job in jobs}
        rng = random.Random(args.seed)
        for r in range(args.rounds):
            order = list(jobs)
            rng.shuffle(order)
            t0 = time.perf_counter()
            for job in order:
                side, kind, variant, flags = job
                pre = preimport[flags, kind] if variant == "net" else ()
                s = runner.run(f"{side}, {kind}, {variant}", flags, trees[side], KINDS[kind], pre)
                first = samples[job][0] if samples[job] else None
                if first is not None and s["modules"] != first["modules"]:
                    a, b = first["modules"], s["modules"]
                    diff = [f"{p}: {a.get(p, '-')} -> {b.get(p, '-')}" for p in sorted(set(a) | set(b))
                            if a.get(p) != b.get(p)]
                    raise SystemExit(f"bench/loaded.py: {side}, {kind}, {variant}, "
                                     f"{flag_name(flags)}: round {r + 1} loaded other kimi_hotfix "
                                     f"modules (lines) than round 1: {'; '.join(diff)}")
                samples[job].append(s)
            log(f"round {r + 1}/{args.rounds}: {len(order)} processes, "
                f"{time.perf_counter() - t0:.0f} s")
        print(f"machine at the end: {stats.machine()}")
        print()

    verdicts = []
    for flags in opts:
        fname = flag_name(flags)
        for kind, imports in KINDS.items():
            what = "vllm" + (f" + the {len(imports) - 1} targets" if len(imports) > 1 else "")
            print(f"## {kind} (import {what}), python {fname}")
            print()
            print("| variant | lines (modules) before | after | arming median before (ms) | "
                  "after (ms) | after / before (median, +/- 2 s.e.) |")
            print("|---|---|---|---|---|---|")
            ratio = {}
            for variant in VARIANTS:
                get = {side: samples[side, kind, variant, flags] for side in SIDES}
                arm = {side: [x["arm_s"] * 1e3 for x in get[side]] for side in SIDES}
                for side, label in (("after", variant), ("before-again", f"{variant}, A/A: before again")):
                    est = stats.estimate([a / b for b, a in zip(arm["before"], arm[side])])
                    ratio[variant, side] = est
                    print(f"| {label} | {fmt_lines(get['before'][0])} | {fmt_lines(get[side][0])} | "
                          f"{med(arm['before']):.1f} | {med(arm[side]):.1f} | {est.median:.2f} "
                          f"[{est.lower:.2f}, {est.upper:.2f}] |")
            print()
            for variant in VARIANTS:
                imp = {side: med([x["import_s"] for x in samples[side, kind, variant, flags]])
                       for side in SIDES}
                print(f"import after arming, {variant} (s, median): before {imp['before']:.2f}, "
                      f"before-again {imp['before-again']:.2f}, after {imp['after']:.2f}")
            for side in ("before", "after"):
                net = samples[side, kind, "net", flags][0]
                extra = {}
                for m in net["arm_imported"]:
                    top = m.split(".")[0]
                    if top != "kimi_hotfix":
                        extra[top] = extra.get(top, 0) + 1
                print(f"{side}: arming (net) imported beyond the pre-import, so counted: "
                      + (", ".join(f"{top} ({n} modules)" for top, n in sorted(extra.items()))
                         or "nothing but kimi_hotfix"))
            failed = samples["after", kind, "net", flags][0]["preimport_failed"]
            print(f"pre-imported: {len(preimport[flags, kind])} modules a process without the "
                  f"shim loads for the same imports"
                  + (f" ({len(failed)} could not be imported by name, e.g. "
                     f"{'; '.join(failed[:3])})" if failed else ""))
            print()
            after_nt = samples["after", kind, "net", flags][0]
            if kind == "no target":
                ok = after_nt["lines"] <= LINES_LIMIT
                verdicts.append(ok)
                print(f"{'PASS' if ok else 'FAIL'}: no-target process, python {fname}: the after "
                      f"tree loads {after_nt['lines']:,} lines of kimi_hotfix in "
                      f"{len(after_nt['modules'])} modules, {'<=' if ok else '>'} "
                      f"{LINES_LIMIT:,} (before: {samples['before', kind, 'net', flags][0]['lines']:,}; "
                      "a count: deterministic, no error bar)")
            est = ratio["net", "after"]
            control = ratio["net", "before-again"]
            verdict, text = stats.verdict_line(
                f"arming (net), {kind}, python {fname}, after / before - 1", minus_one(est),
                ARM_RATIO_LIMIT - 1, minus_one(control))
            verdicts.append(verdict == "PASS")
            print(text)
            print()
        print("modules loaded (wc -l), no-target process, net:")
        for side in ("before", "after"):
            mods = samples[side, "no target", "net", flags][0]["modules"]
            print(f"  {side}: " + ", ".join(f"{p} {n}" for p, n in sorted(mods.items())))
        print()
    return 0 if all(verdicts) else 1


def minus_one(est):
    """A ratio's estimate as ``ratio - 1``: "no difference" is 0, as verdict_line expects."""
    return stats.Estimate(est.median - 1, est.se, est.n)


def log(text):
    print(f"[{time.strftime('%H:%M:%S')}] {text}", file=sys.stderr, flush=True)


if __name__ == "__main__":
    sys.exit(main())

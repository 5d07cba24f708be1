#!/usr/bin/env python3
"""Start-up cost of the shim in a process that never imports vLLM.

    python bench/startup.py                       # this interpreter, 300 rounds
    ~/.cache/kimi-hotfix/venvs/vllm-0.29.0/bin/python bench/startup.py --rounds 500

Runs ``python -c pass`` side by side, interleaved (every round runs each variant
once, in a shuffled order) and reports the median wall time of each variant and
the median of the per-round differences to the baseline:

  baseline               no PYTHONPATH
  shim, cached           PYTHONPATH=<copy of the shim, compileall'ed>
  baseline -O            the same two under -O (the nightly containers' mode;
  shim, cached, -O         needs the .opt-1.pyc files, compiled here too)
  shim, no cache         PYTHONPATH=<source-only copy>, PYTHONDONTWRITEBYTECODE=1:
                           sitecustomize.py is compiled at every start
  empty sc, no cache     PYTHONPATH=<dir with a one-line sitecustomize.py>, same
                           env: what ANY source-only sitecustomize costs here
                           (compiling a source file imports tokenize, re, ...)

The budget (issue 2): at most 1 ms added to ``python -c pass`` with bytecode
caches. Containers that cannot write caches pay the no-cache line: ship the
bundle (scripts/bundle), which carries precompiled, hash-checked .pyc files.
``-X importtime`` gives the in-process import time of sitecustomize alone, a
figure with much less noise than process wall time.
"""

from __future__ import annotations

import argparse
import compileall
import os
import random
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def prepare(tmp: Path, python: str):
    cached, source, empty = tmp / "cached", tmp / "source", tmp / "empty"
    for dest in (cached, source):
        dest.mkdir()
        shutil.copy2(REPO / "sitecustomize.py", dest)
        shutil.copytree(REPO / "kimi_hotfix", dest / "kimi_hotfix",
                        ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    # compile with the measured interpreter, for -O too (opt-1)
    subprocess.run([python, "-m", "compileall", "-q", "-o", "0", "-o", "1", str(cached)], check=True)
    empty.mkdir()
    (empty / "sitecustomize.py").write_text('"""An empty sitecustomize."""\n')
    return cached, source, empty


def variants(python, cached, source, empty):
    base = {k: v for k, v in os.environ.items()
            if k not in ("PYTHONPATH", "PYTHONOPTIMIZE", "PYTHONDONTWRITEBYTECODE")
            and not k.startswith("KIMI_HOTFIX")}
    nocache = dict(base, PYTHONDONTWRITEBYTECODE="1")
    return {
        "baseline": ([python, "-c", "pass"], base),
        "shim, cached": ([python, "-c", "pass"], dict(base, PYTHONPATH=str(cached))),
        "baseline -O": ([python, "-O", "-c", "pass"], base),
        "shim, cached, -O": ([python, "-O", "-c", "pass"], dict(base, PYTHONPATH=str(cached))),
        "baseline, no-write env": ([python, "-c", "pass"], nocache),
        "shim, no cache": ([python, "-c", "pass"], dict(nocache, PYTHONPATH=str(source))),
        "empty sc, no cache": ([python, "-c", "pass"], dict(nocache, PYTHONPATH=str(empty))),
    }


PAIRS = {  # variant -> the baseline it is compared with
    "shim, cached": "baseline",
    "shim, cached, -O": "baseline -O",
    "shim, no cache": "baseline, no-write env",
    "empty sc, no cache": "baseline, no-write env",
}


def run_once(cmd, env):
    t0 = time.perf_counter()
    subprocess.run(cmd, env=env, check=True, stdin=subprocess.DEVNULL)
    return (time.perf_counter() - t0) * 1e3


def importtime(python, env, flags=(), runs=50):
    """Median cumulative -X importtime of sitecustomize, in ms."""
    values = []
    for _ in range(runs):
        err = subprocess.run([python, *flags, "-X", "importtime", "-c", "pass"], env=env,
                             capture_output=True, text=True, check=True).stderr
        for line in err.splitlines():
            m = re.match(r"import time:\s+(\d+) \|\s+(\d+) \|\s+sitecustomize$", line)
            if m:
                values.append(int(m.group(2)) / 1e3)
    return statistics.median(values) if values else float("nan")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--python", default=sys.executable)
    parser.add_argument("--rounds", type=int, default=300)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    python = args.python
    version = subprocess.run([python, "-c", "import sys; print(sys.version.split()[0])"],
                             capture_output=True, text=True, check=True).stdout.strip()
    with tempfile.TemporaryDirectory(prefix="kimi-hotfix-startup-") as tmp:
        cached, source, empty = prepare(Path(tmp), python)
        table = variants(python, cached, source, empty)
        names = list(table)
        samples = {name: [] for name in names}
        rng = random.Random(args.seed)
        for name in names:  # warm the page cache once
            run_once(*table[name])
        for _ in range(args.rounds):
            order = names[:]
            rng.shuffle(order)
            for name in order:
                samples[name].append(run_once(*table[name]))
        imp = {
            "shim, cached": importtime(python, table["shim, cached"][1]),
            "shim, cached, -O": importtime(python, table["shim, cached, -O"][1], ["-O"]),
            "shim, no cache": importtime(python, table["shim, no cache"][1]),
            "empty sc, no cache": importtime(python, table["empty sc, no cache"][1]),
        }

    print(f"python -c pass, {python} (Python {version}), {args.rounds} interleaved rounds")
    print(f"{'variant':<24}{'median ms':>10}{'added ms':>10}{'ratio':>8}{'sitecustomize import ms':>25}")
    med = {name: statistics.median(values) for name, values in samples.items()}
    for name in names:
        base = PAIRS.get(name)
        if base is None:
            print(f"{name:<24}{med[name]:>10.2f}")
            continue
        diffs = [a - b for a, b in zip(samples[name], samples[base])]
        added = statistics.median(diffs)
        print(f"{name:<24}{med[name]:>10.2f}{added:>+10.2f}{med[name] / med[base]:>8.3f}"
              f"{imp[name]:>25.2f}")
    added = statistics.median([a - b for a, b in zip(samples["shim, cached"], samples["baseline"])])
    added_o = statistics.median([a - b for a, b in zip(samples["shim, cached, -O"], samples["baseline -O"])])
    worst = max(added, added_o)
    print(f"budget: at most 1 ms added with bytecode caches: {worst:+.2f} ms -> "
          f"{'within budget' if worst <= 1.0 else 'OVER BUDGET'}")
    print("added = median of per-round differences to the baseline; ratio = median / baseline median")


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""What the shim costs each process of a live vLLM server, two shim trees side by side.

    KIMI_HOTFIX_SERVE_PYTHON=... $KIMI_HOTFIX_SERVE_PYTHON bench/serve_cost.py [--rounds 2]
    $KIMI_HOTFIX_SERVE_PYTHON bench/serve_cost.py --rounds 4 --before 715439d --after DIR --seed 3

Real vLLM 0.29.0 CPU servers (the serving venv of tests/e2e; its python from
``tests/e2e/serving.serve_python()``: ``KIMI_HOTFIX_SERVE_PYTHON`` when set) on
a tiny random Llama with four full-attention layers (tests/e2e/tiny_models.py
``plain``), under ``python -O`` as the nightly containers run, one server at a
time, started and stopped by tests/e2e/serving.py's ``Server`` (as
bench/serve.py does). Two trees of the shim, each on the server's
``PYTHONPATH``:

  before   the tree at git revision ``--before`` (default 715439d), extracted
           by ``git archive`` into a temporary directory (bench/trees.py)
  after    ``--after`` (default: the checkout holding this script, as its
           working tree is, uncommitted changes included), copied at the start
           (sitecustomize.py, kimi_hotfix/, kimi_hotfix-*.dist-info/; no
           bytecode) into the same temporary directory: one after tree for the
           whole run, even while someone edits the checkout

Both trees are compiled first by the serving python (``compileall -o 0 -o 1
-o 2``), and the servers run without PYTHONDONTWRITEBYTECODE
(``serving.server_env``), so neither side pays for compiling the shim. Each
round starts both sides in a shuffled order (``--seed``).

For each server, once /health answers 200: one short greedy completion (8
tokens; what a client does first, so that first-call costs that happen in the
real flow happen), then one /metrics scrape. From it, per vLLM process (the
shim's ``pid`` and ``role`` labels; ``VllmWorker-N`` is shown as ``Worker``):

  arm, settle, first_call   ``kimi_hotfix_cost_seconds{phase}``: wall ms the
                            process spent in the shim, as the shim measures it
  start-up                  the process's own start-up, as
                            tests/e2e/test_served.py::test_each_process_reports_its_own_cost_against_its_start_up
                            computes it: the server's time to healthy (from
                            its launch to the first /health 200) less the
                            process's start after the server's root process
                            (/proc/PID/stat field 22, both read from the
                            server's process tree by ``Server.snapshot()``,
                            in clock ticks)
  share                     (arm + settle + first_call) / start-up, in %

Every process on /metrics must carry ``kimi_hotfix_info`` and be one of the
server's process tree; the run stops otherwise, and when a server does not
become healthy (with its log tail, exit status 1).

Printed: each round's figures as they come; per side, the median over rounds of
each column, per role; then, per role, the after/before ratio of the shim's
total (arm + settle + first_call) and of arm alone. With two rounds or more the
ratio is bench/stats.py's paired estimate: the median of the per-round ratios
(after_i / before_i, same round) with its bootstrap standard error (with few
rounds the error bar itself is rough, and says so); with one round, the ratio
of the two figures, without an error bar.

What it does not measure: the shim's cost as a difference of time to healthy
(bench/serve.py; it cannot resolve 1 % on a CPU server), anything the shim's
own spans do not cover (the bootstrap's sitecustomize import, the imports it
shifts rather than adds: docs/benchmarks.md), decode throughput, or the
processes of other deployments (plugin-only, the bundle, several API servers).
The spans are wall times in processes that share this machine's cores with the
rest of the server starting up: a short span can double under load, and the
first server of a run loads vLLM from a colder page cache than the others (the
shuffled order spreads that over the sides, it does not remove it). No verdict:
the figures are a measurement, docs/benchmarks.md gives the goal.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import stats
from trees import compile_tree, describe, extract, snapshot

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "e2e"))
sys.path.insert(0, str(REPO / "tests"))

import serving  # noqa: E402
import tiny_models  # noqa: E402

SIDES = ("before", "after")
PHASES = ("arm", "settle", "first_call")
ROLE_ORDER = ("APIServer", "EngineCore", "Worker")
TICKS = os.sysconf("SC_CLK_TCK")
LOG_TAIL = 60  # lines of a failed server's log shown


# -- one server ------------------------------------------------------------------


def role_of(label):
    """vLLM's role as the tables show it: ``VllmWorker-N`` is a ``Worker``."""
    return "Worker" if re.fullmatch(r"VllmWorker-\d+", label) else label


def fail(server, why):
    tail = "\n".join(server.log().splitlines()[-LOG_TAIL:])
    print(f"{server.name}: {why}; log {server.log_path}, its last {LOG_TAIL} lines:\n{tail}",
          file=sys.stderr, flush=True)
    raise SystemExit(1)


def measure(side, tree, model, workdir):
    """One server with ``tree`` on its PYTHONPATH: {role: {arm, settle,
    first_call (ms), total_ms, startup_s, share_pct, pid}} and its time to healthy."""
    import openai

    server = serving.Server(name=side, model=model, log_path=workdir / f"{side}-{time.time():.0f}.log",
                            env=serving.server_env(python_path=[tree], log_level="WARNING"),
                            flags=("-O",))
    server.start()
    try:
        try:
            up = server.wait_healthy()
        except TimeoutError as exc:
            up, why = False, str(exc).removeprefix(f"{side}: ")
        else:
            why = f"the API server exited ({server.proc.returncode}) before /health answered 200"
        if not up:
            fail(server, why)  # the finally below stops what is left of it
        healthy = server.healthy_after
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0,
                               timeout=600)
        client.completions.create(model="tiny", prompt=tiny_models.prompt_words(tiny_models.PROMPT_WORDS),
                                  max_tokens=8, temperature=0.0)
        status, text = server.get("/metrics")
        snap = server.snapshot()  # the server's processes as they are now, with their start times
    finally:
        stopped = server.stop()
    if stopped["left"]:
        raise SystemExit(f"{side}: processes left running: {stopped['left']}")
    if status != 200:
        fail(server, f"/metrics answered {status}")
    root = next(p for p in snap if p.pid == server.proc.pid)
    procs = {p.nspid: p for p in snap}  # the shim's pid label is the pid in its own namespace
    views: dict = {}
    for (metric, labels), value in serving.metrics_samples(text).items():
        labels = dict(labels)
        view = views.setdefault(int(labels["pid"]), {"role": None, "cost": {}})
        if metric == "kimi_hotfix_info" and value == 1.0:
            view["role"] = labels["role"]
        elif metric == "kimi_hotfix_cost_seconds":
            view["cost"][labels["phase"]] = value
    if not views:
        fail(server, "no kimi_hotfix series on /metrics: the shim did not arm")
    out = {}
    for pid, view in sorted(views.items()):
        if view["role"] is None or set(view["cost"]) != set(PHASES):
            fail(server, f"pid {pid} on /metrics: role {view['role']}, phases {sorted(view['cost'])}")
        proc = procs.get(pid)
        if proc is None:
            fail(server, f"pid {pid} on /metrics is not a process of this server "
                         f"({sorted(procs)})")
        startup = healthy - (proc.start - root.start) / TICKS
        cost = {phase: 1000.0 * view["cost"][phase] for phase in PHASES}
        total = sum(cost.values())
        role = role_of(view["role"])
        if role in out:  # a second process of one role (more workers): its own row
            role = f"{role} {pid}"
        out[role] = {**cost, "total_ms": total, "startup_s": startup,
                     "share_pct": 100.0 * total / (1000.0 * startup), "pid": pid}
    return {"healthy_s": healthy, "roles": out}


# -- the report ------------------------------------------------------------------


def ordered(roles):
    rank = {r: i for i, r in enumerate(ROLE_ORDER)}
    return sorted(roles, key=lambda r: (rank.get(r.split()[0], len(rank)), r))


COLUMNS = (("arm", "arm ms", "{:.1f}"), ("settle", "settle ms", "{:.1f}"),
           ("first_call", "first call ms", "{:.1f}"), ("total_ms", "total ms", "{:.1f}"),
           ("startup_s", "start-up s", "{:.1f}"), ("share_pct", "share %", "{:.3f}"))


def table(side, runs):
    """Medians over rounds, per role, of every column."""
    roles = ordered({r for run in runs for r in run["roles"]})
    print(f"| {side} | process | " + " | ".join(h for _, h, _ in COLUMNS) + " |")
    print("|---|---|" + "---|" * len(COLUMNS))
    for role in roles:
        cells = []
        for key, _, fmt in COLUMNS:
            values = [run["roles"][role][key] for run in runs if role in run["roles"]]
            cells.append(fmt.format(stats.median(values)))
        print(f"| {side} | {role} | " + " | ".join(cells) + " |")
    print(f"   time to healthy: median {stats.median([r['healthy_s'] for r in runs]):.1f} s "
          f"over {len(runs)} server(s)")


def ratio_line(label, before, after):
    """after/before: the paired estimate of the per-round ratios (>= 2 rounds),
    else the plain ratio."""
    pairs = [(b, a) for b, a in zip(before, after) if b is not None and a is not None]
    if not pairs or any(b <= 0 for b, _ in pairs):
        return f"{label}: n/a (a before figure is zero or missing)"
    if len(pairs) >= 2:
        est = stats.estimate([a / b for b, a in pairs])
        rough = ", few pairs: rough error bar" if est.n < 10 else ""
        mb, ma = stats.median([b for b, _ in pairs]), stats.median([a for _, a in pairs])
        return (f"{label}: {est.median:.3f} +/- {est.se:.3f} s.e. (n={est.n}{rough}; "
                f"{est.lower:.3f} to {est.upper:.3f} at 2 s.e.); medians: before {mb:.1f} ms, "
                f"after {ma:.1f} ms")
    (b, a), = pairs
    return f"{label}: {a / b:.3f} (before {b:.1f} ms, after {a:.1f} ms; one round: no error bar)"


def ratios(figures):
    roles = ordered({r for side in SIDES for run in figures[side] for r in run["roles"]})
    n = len(figures["before"])
    how = "paired per round: median of after_i / before_i" if n >= 2 else "plain ratios"
    print(f"after / before, per role ({how}):")
    for role in roles:
        for key, what in (("total_ms", "arm + settle + first_call"), ("arm", "arm")):
            before = [run["roles"].get(role, {}).get(key) for run in figures["before"]]
            after = [run["roles"].get(role, {}).get(key) for run in figures["after"]]
            print("  " + ratio_line(f"{role:10s} {what:25s}", before, after))
    if n < 2:
        print("  note: one round: plain ratios of single servers, no error bar; a CPU server's "
              "short spans vary by tens of percent from one start to the next (--rounds 2 or more)")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--before", default="715439d", help="git revision of the before tree")
    parser.add_argument("--after", type=Path, default=REPO, help="the after tree (copied at the start)")
    parser.add_argument("--json", type=Path, help="write the raw figures here")
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    print(f"bench/serve_cost.py: vLLM 0.29.0 CPU servers, python -O, {args.rounds} round(s), "
          f"seed {args.seed}; {stats.machine()}")
    print(f"serving python: {serving.serve_python()}")
    rng = random.Random(args.seed)
    figures = {side: [] for side in SIDES}
    with tempfile.TemporaryDirectory(prefix="kimi-hotfix-bench-serve-cost-") as tmp:
        workdir = Path(tmp)
        trees = {"after": snapshot(args.after.resolve(), workdir / "after"),
                 "before": workdir / "before"}
        commit = extract(args.before, trees["before"])
        print(f"before: {args.before} = {commit[:12]} (git archive); "
              f"after: {args.after.resolve()} ({describe(args.after.resolve())}), copied at the start")
        for side in SIDES:
            compile_tree(serving.serve_python(), trees[side], env=serving.server_env())
        model = workdir / "model"
        subprocess.run([serving.serve_python(), str(REPO / "tests/e2e/tiny_models.py"), "plain",
                        str(model)], check=True, capture_output=True, env=serving.server_env())
        for r in range(args.rounds):
            order = list(SIDES)
            rng.shuffle(order)
            for side in order:
                got = measure(side, trees[side], model, workdir)
                figures[side].append(got)
                rows = "; ".join(
                    f"{role} {f['arm']:.1f}+{f['settle']:.1f}+{f['first_call']:.1f} ms "
                    f"/ {f['startup_s']:.1f} s = {f['share_pct']:.3f} %"
                    for role, f in ((role, got["roles"][role]) for role in ordered(got["roles"])))
                print(f"  round {r + 1}: {side:6s} healthy after {got['healthy_s']:5.1f} s; "
                      f"arm+settle+first_call / start-up: {rows}", flush=True)
    if args.json:
        args.json.write_text(json.dumps(figures, indent=1))
    print()
    print(f"medians over {args.rounds} round(s), per process (share = (arm + settle + first_call) "
          f"/ start-up):")
    print()
    for side in SIDES:
        table(side, figures[side])
        print()
    ratios(figures)
    print(stats.machine())
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""What the shim costs a real vLLM server: time to healthy and decode throughput.

    KIMI_HOTFIX_SERVE_PYTHON=... $KIMI_HOTFIX_SERVE_PYTHON bench/serve.py [--rounds 3]

Real vLLM 0.29.0 CPU servers (the serving venv of tests/e2e; its python from
``tests/e2e/serving.serve_python()``) on a tiny random Llama with four
full-attention layers (tests/e2e/tiny_models.py ``plain``: it serves the same
with and without the shim, so both sides do the same work), under ``python -O``
as the nightly containers run, one server at a time. Each round starts, in a
shuffled order:

  base        no PYTHONPATH (vLLM as released)
  base (A/A)  the same again: the A/A control, what "no difference" measures here
  shim        PYTHONPATH=<this checkout>: every vLLM process arms the shim

(the variants are told apart by the shim's series on /metrics, checked each
time). For each server it measures:

  time to healthy     wall seconds from the process start to the first /health 200
  CPU to healthy      CPU seconds (user + system) of the server's processes by then
  decode throughput   one greedy completion of ``--tokens`` tokens (``ignore_eos``),
                      after a warm-up request, timed at the client: tokens / second
  decode CPU          CPU seconds the server's processes spent on that completion,
                      per token

Wall figures are what the limits are about; on a shared machine they carry the
load of everything else, which CPU figures mostly do not (no waiting for a core).
Per round the figures are paired (bench/stats.py): relative differences
``100 * (shim / base - 1)`` % (a throughput loss: ``100 * (1 - shim / base)``),
each with its A/A control. Limits: time to healthy +1 %, throughput -1 % (and
the same 1 % for the two CPU figures).

Verdict: PASS when the upper bound (median + 2 s.e.) is inside the limit; FAIL
only when the lower bound (median - 2 s.e.) is beyond it, i.e. the cost is
shown; otherwise INCONCLUSIVE: this many rounds on this machine cannot resolve
1 %, and the script says how many rounds the observed spread would need. (The
shared rule in bench/stats.py also calls a median beyond the limit FAIL; with
a server's start-up varying by several percent from one start to the next,
that would report noise as a cost.)
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
import time
from pathlib import Path

import stats

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "e2e"))
sys.path.insert(0, str(REPO / "tests"))

import serving  # noqa: E402
import tiny_models  # noqa: E402

LIMIT = 1.0  # percent, every figure
VARIANTS = ("base", "base (A/A)", "shim")
TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pids) -> float:
    """user + system CPU seconds of the live processes ``pids``."""
    total = 0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])  # utime, stime
    return total / TICKS


def measure(name, model, workdir, tokens):
    import openai

    path = [REPO] if name == "shim" else []
    server = serving.Server(name=name, model=model, log_path=workdir / f"{name}-{time.time():.0f}.log",
                            env=serving.server_env(python_path=path, log_level="WARNING"),
                            flags=("-O",))
    server.start()
    try:
        if not server.wait_healthy():
            raise SystemExit(f"{name}: the server did not start; log: {server.log_path}")
        pids = [p.pid for p in server.snapshot()]
        healthy, healthy_cpu = server.healthy_after, cpu_seconds(pids)
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0,
                               timeout=600)
        prompt = tiny_models.prompt_words(tiny_models.PROMPT_WORDS)
        client.completions.create(model="tiny", prompt=prompt, max_tokens=8, temperature=0.0)
        cpu0, t0 = cpu_seconds(pids), time.perf_counter()
        out = client.completions.create(model="tiny", prompt=prompt, max_tokens=tokens,
                                        temperature=0.0, extra_body={"ignore_eos": True})
        seconds, cpu = time.perf_counter() - t0, cpu_seconds(pids) - cpu0
        if out.usage.completion_tokens != tokens:
            raise SystemExit(f"{name}: {out.usage.completion_tokens} tokens, asked {tokens}")
        _, metrics = server.get("/metrics")  # the shim's series: is the variant what it says?
        armed = "kimi_hotfix_info{" in metrics
    finally:
        stopped = server.stop()
    if stopped["left"]:
        raise SystemExit(f"{name}: processes left running: {stopped['left']}")
    if (name == "shim") != armed:
        raise SystemExit(f"{name}: kimi_hotfix series on /metrics: {armed}; the variant is not what it says")
    return {"healthy_s": healthy, "healthy_cpu_s": healthy_cpu, "tokens_per_s": tokens / seconds,
            "cpu_ms_per_token": 1000.0 * cpu / tokens}


def rounds_needed(est, limit):
    """Rounds the observed spread would need for the upper bound to fit a zero
    median inside ``limit`` (the error bar shrinks as 1/sqrt(n))."""
    if est.se != est.se or est.se == 0:
        return None
    return max(est.n, int(est.n * (2 * est.se / limit) ** 2) + 1)


def report(label, unit, base, aa, variant, limit, invert=False):
    def rel(b, v):
        return 100.0 * ((1.0 - v / b) if invert else (v / b - 1.0))

    est = stats.estimate([rel(b, v) for b, v in zip(base, variant)])
    control = stats.estimate([rel(b, v) for b, v in zip(base, aa)])
    verdict, text = stats.verdict_line(label, est, limit, control, unit="%")
    if verdict == "FAIL" and est.lower <= limit:  # the cost is not shown: noise
        verdict = "INCONCLUSIVE"
        text = ("INCONCLUSIVE" + text[len("FAIL"):] + f"; the lower bound {est.lower:+.2f}% is "
                "inside the limit: the difference is within this machine's noise, not shown")
    print(text)
    print(f"   medians: base {stats.median(base):.3f} {unit}, A/A {stats.median(aa):.3f} {unit}, "
          f"shim {stats.median(variant):.3f} {unit}")
    if verdict == "INCONCLUSIVE":
        need = rounds_needed(est, limit)
        print(f"   this machine cannot resolve {limit:.0f} % with {est.n} rounds"
              + (f"; the observed spread would need about {need} rounds" if need else ""))
    return verdict


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=200)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--json", type=Path, help="write the raw figures here")
    args = parser.parse_args(argv)
    print(f"bench/serve.py: vLLM 0.29.0 CPU servers, python -O, {args.rounds} rounds, "
          f"{args.tokens}-token decode; {stats.machine()}")
    print(f"serving python: {serving.serve_python()}")
    rng = random.Random(args.seed)
    figures = {v: [] for v in VARIANTS}
    with tempfile.TemporaryDirectory(prefix="kimi-hotfix-bench-serve-") as tmp:
        workdir = Path(tmp)
        model = workdir / "model"
        serving.subprocess.run([serving.serve_python(), str(REPO / "tests/e2e/tiny_models.py"),
                                "plain", str(model)], check=True, capture_output=True,
                               env=serving.server_env())
        for r in range(args.rounds):
            order = list(VARIANTS)
            rng.shuffle(order)
            for name in order:
                figures[name].append(measure(name, model, workdir, args.tokens))
                got = figures[name][-1]
                print(f"  round {r + 1}: {name:11s} healthy after {got['healthy_s']:6.2f} s "
                      f"({got['healthy_cpu_s']:6.2f} s CPU), {got['tokens_per_s']:6.2f} tokens/s "
                      f"({got['cpu_ms_per_token']:6.2f} ms CPU/token)", flush=True)
    if args.json:
        args.json.write_text(json.dumps(figures, indent=1))

    def col(name, key):
        return [f[key] for f in figures[name]]

    def compare(label, key, unit, invert=False):
        return report(label, unit, col("base", key), col("base (A/A)", key), col("shim", key),
                      LIMIT, invert)

    print()
    verdicts = [
        compare("time to healthy, shim vs none", "healthy_s", "s"),
        compare("decode throughput loss, shim vs none", "tokens_per_s", "tokens/s", invert=True),
        compare("CPU to healthy, shim vs none", "healthy_cpu_s", "s"),
        compare("decode CPU per token, shim vs none", "cpu_ms_per_token", "ms"),
    ]
    overall = "FAIL" if "FAIL" in verdicts else "PASS" if set(verdicts) == {"PASS"} else "INCONCLUSIVE"
    print(f"overall: {overall}")
    return 1 if overall == "FAIL" else 0


if __name__ == "__main__":
    sys.exit(main())

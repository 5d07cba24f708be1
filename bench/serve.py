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

and for each server measures the time from the process start to the first
``/health`` 200, then a fixed workload: one greedy completion of ``--tokens``
tokens (``ignore_eos``) after one warm-up request, timed at the client
(tokens / second). Per round the figures are paired (bench/stats.py): start-up
``100 * (shim / base - 1)`` % (limit +1 %), throughput loss
``100 * (1 - shim / base)`` % (limit 1 %), each with its A/A control. The
verdict is PASS only when the upper bound (median + 2 s.e.) is inside the limit;
with a few rounds on a shared 2-core machine it is usually INCONCLUSIVE: a
server's start-up varies by several percent from one start to the next, and the
script prints how many rounds the observed spread would need, rather than
claiming what it did not measure.
"""

from __future__ import annotations

import argparse
import json
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

START_LIMIT = 1.0  # percent slower to healthy
TPUT_LIMIT = 1.0  # percent fewer tokens per second
VARIANTS = ("base", "base (A/A)", "shim")


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
        healthy = server.healthy_after
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0,
                               timeout=600)
        prompt = tiny_models.prompt_words(20)
        client.completions.create(model="tiny", prompt=prompt, max_tokens=8, temperature=0.0)
        t0 = time.perf_counter()
        out = client.completions.create(model="tiny", prompt=prompt, max_tokens=tokens,
                                        temperature=0.0, extra_body={"ignore_eos": True})
        seconds = time.perf_counter() - t0
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
    return {"healthy_s": healthy, "tokens_per_s": tokens / seconds}


def rounds_needed(est, limit, n):
    """Rounds the observed spread would need for the upper bound to fit (None: never)."""
    room = limit - est.median
    if room <= 0 or est.se != est.se:
        return None
    return max(n, int(n * (2 * est.se / room) ** 2) + 1)


def report(label, unit, base, aa, variant, limit, invert=False):
    def rel(b, v):
        return 100.0 * ((1.0 - v / b) if invert else (v / b - 1.0))

    est = stats.estimate([rel(b, v) for b, v in zip(base, variant)])
    control = stats.estimate([rel(b, v) for b, v in zip(base, aa)])
    verdict, text = stats.verdict_line(label, est, limit, control, unit="%")
    print(text)
    print(f"   medians: base {stats.median(base):.3f} {unit}, A/A {stats.median(aa):.3f} {unit}, "
          f"shim {stats.median(variant):.3f} {unit}")
    if verdict == "INCONCLUSIVE":
        need = rounds_needed(est, limit, est.n)
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
                print(f"  round {r + 1}: {name:11s} healthy after {got['healthy_s']:6.2f} s, "
                      f"{got['tokens_per_s']:7.2f} tokens/s", flush=True)
    if args.json:
        args.json.write_text(json.dumps(figures, indent=1))

    def col(name, key):
        return [f[key] for f in figures[name]]

    print()
    verdicts = [
        report("time to healthy, shim vs none", "s", col("base", "healthy_s"),
               col("base (A/A)", "healthy_s"), col("shim", "healthy_s"), START_LIMIT),
        report("decode throughput loss, shim vs none", "tokens/s", col("base", "tokens_per_s"),
               col("base (A/A)", "tokens_per_s"), col("shim", "tokens_per_s"), TPUT_LIMIT,
               invert=True),
    ]
    overall = "FAIL" if "FAIL" in verdicts else "PASS" if set(verdicts) == {"PASS"} else "INCONCLUSIVE"
    print(f"overall: {overall}")
    return 1 if "FAIL" in verdicts else 0


if __name__ == "__main__":
    sys.exit(main())

"""One verdict rule for every bench script, and the statistics behind it.

Every comparison is paired: each round (or iteration) measures the variant and
its baseline side by side, in a shuffled order, and the figure is the per-pair
difference ``d_i = variant_i - baseline_i``, so drift and load spikes that hit
both members of a pair cancel. Of those differences:

- the estimate is their median (timings are skewed, with rare large outliers;
  the median ignores them, the mean does not);
- its error bar is the standard error of that median, estimated by bootstrap:
  resample the n differences with replacement (seeded, ``RESAMPLES`` times),
  take the median of each resample, and use the standard deviation of those
  medians. This assumes nothing about the shape of the distribution. The
  textbook alternative, 1.2533 * sd / sqrt(n), holds only for normal data: one
  5 ms scheduling spike among 300 us calls inflates the sd, and so that
  formula, far more than it changes the median. With few pairs (under about
  10) a bootstrap error bar is itself rough: the scripts say so next to it;
- the upper bound is ``median + 2 * standard error``.

The verdict: PASS only when the upper bound is inside the limit. Otherwise
FAIL when the median itself is over the limit, and INCONCLUSIVE when the median
is inside but the error bar crosses it (the measurement cannot show the limit
holds: more pairs, or a quieter machine, are needed). Every verdict line
carries its A/A control beside it: the same variant against itself, measured
the same way, whose difference should be zero within its own error bar; when
it is not, the line says so, because the setup then has a bias of about that
size (order, caches, placement) that the figure may carry too.

Stdlib only (the start-up bench runs it with any interpreter); numpy, when it
is importable, only makes the bootstrap of large samples faster.
"""

from __future__ import annotations

import math
import random
import statistics
from dataclasses import dataclass

RESAMPLES = 1000
SEED = 12345


def paired(base, variant):
    """Per-pair differences ``variant[i] - base[i]`` (same round / iteration)."""
    if len(base) != len(variant):
        raise ValueError(f"unpaired samples: {len(base)} vs {len(variant)}")
    return [v - b for b, v in zip(base, variant)]


def median(values):
    return statistics.median(values)


def se_median(values, resamples=RESAMPLES, seed=SEED):
    """Bootstrap standard error of the median of ``values`` (seeded)."""
    n = len(values)
    if n < 2:
        return float("nan")
    try:
        import numpy as np
    except ImportError:
        np = None
    if np is not None and n > 2000:
        data = np.asarray(values, dtype=float)
        rng = np.random.default_rng(seed)
        meds = []
        chunk = max(1, 4_000_000 // n)
        left = resamples
        while left > 0:
            k = min(chunk, left)
            meds.append(np.median(data[rng.integers(0, n, size=(k, n))], axis=1))
            left -= k
        return float(np.std(np.concatenate(meds), ddof=1))
    rng = random.Random(seed)
    data = list(values)
    meds = [statistics.median(rng.choices(data, k=n)) for _ in range(resamples)]
    return statistics.stdev(meds)


@dataclass
class Estimate:
    """Median of paired differences (or of direct measurements) with its error bar."""

    median: float
    se: float
    n: int

    @property
    def upper(self):
        return self.median + 2 * self.se

    @property
    def lower(self):
        return self.median - 2 * self.se

    def scaled(self, factor):
        return Estimate(self.median * factor, self.se * abs(factor), self.n)

    def plus(self, other):
        """Sum of two independent estimates (errors added in quadrature)."""
        return Estimate(self.median + other.median, math.hypot(self.se, other.se),
                        min(self.n, other.n))

    def consistent_with_zero(self):
        return abs(self.median) <= 2 * self.se

    def fmt(self, unit="", digits=2):
        rough = ", few pairs: rough error bar" if self.n < 10 else ""
        return (f"{self.median:+.{digits}f}{unit} +/- {self.se:.{digits}f}{unit} s.e. "
                f"(n={self.n}{rough})")


def estimate(values, resamples=RESAMPLES, seed=SEED):
    """Estimate of the median of ``values`` (paired differences, usually)."""
    values = list(values)
    return Estimate(median(values), se_median(values, resamples, seed), len(values))


def paired_estimate(base, variant, **kwargs):
    return estimate(paired(base, variant), **kwargs)


def decide(est, limit):
    if est.upper <= limit:
        return "PASS"
    return "FAIL" if est.median > limit else "INCONCLUSIVE"


def verdict_line(label, est, limit, control, unit="", digits=2):
    """``(verdict, text)``: the verdict on ``est`` against ``limit`` (the rule
    in the module docstring), with the A/A ``control`` printed beside it."""
    verdict = decide(est, limit)
    d = digits
    text = (f"{verdict}: {label}: {est.median:+.{d}f}{unit}, upper bound "
            f"{est.upper:+.{d}f}{unit} (median + 2 x {est.se:.{d}f}{unit} s.e., n={est.n}) "
            f"{'<=' if verdict == 'PASS' else '>'} limit {limit:.{d}f}{unit}; "
            f"A/A control {control.median:+.{d}f}{unit} +/- {control.se:.{d}f}{unit} s.e. "
            f"(upper {control.upper:+.{d}f}{unit})")
    if verdict == "INCONCLUSIVE":
        text += "; the median is inside the limit but its error bar is not: not shown"
    if not control.consistent_with_zero():
        text += (f"; WARNING: the A/A control is not zero within 2 s.e.: the setup has a "
                 f"bias of about {control.median:+.{d}f}{unit}")
    if est.n < 10:
        text += f"; only {est.n} pairs: the error bar itself is rough"
    return verdict, text


def machine() -> str:
    """The machine as measured now: cores and load averages (a loaded machine
    inflates absolute times; paired differences are what counts)."""
    import os

    try:
        load = "load average {:.2f} {:.2f} {:.2f}".format(*os.getloadavg())
    except OSError:
        load = "load average unknown"
    return f"{os.cpu_count()} cores, {load} (1, 5, 15 min)"

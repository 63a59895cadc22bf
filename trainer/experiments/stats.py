"""Intervals for experiment reports: Student-t over seeds, Welch's t for a difference between two arms, Wilson
over one run's eval episodes.

Every function takes plain numbers and returns plain floats, so a report can be rebuilt from committed
metrics files; ``tests/trainer/test_experiments.py`` checks them against ``scipy.stats`` itself.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from scipy import stats


@dataclass(frozen=True)
class Interval:
    mean: float
    low: float
    high: float
    n: int

    @property
    def half_width(self) -> float:
        return (self.high - self.low) / 2

    def __str__(self) -> str:
        return self.format(3)

    def format(self, digits: int) -> str:
        if self.n < 2 or not math.isfinite(self.half_width):
            return f"{self.mean:.{digits}f} (n={self.n})"
        return f"{self.mean:.{digits}f} ± {self.half_width:.{digits}f}"


def t_interval(values: Sequence[float], confidence: float = 0.95) -> Interval:
    """Mean of ``values`` (one per seed) with its two-sided Student-t interval; a single value has none
    (low = high = nan)."""
    n = len(values)
    if n == 0:
        return Interval(math.nan, math.nan, math.nan, 0)
    mean = sum(values) / n
    if n < 2:
        return Interval(mean, math.nan, math.nan, n)
    sd = math.sqrt(_sample_variance(values))
    half = float(stats.t.ppf(0.5 + confidence / 2, n - 1)) * sd / math.sqrt(n)
    return Interval(mean, mean - half, mean + half, n)


def welch_interval(a: Sequence[float], b: Sequence[float], confidence: float = 0.95) -> Interval:
    """mean(a) − mean(b) with Welch's t-interval (unpaired, unequal variances: two arms' seeds); under two
    values on either side there is none (low = high = nan)."""
    n = min(len(a), len(b))
    if n == 0:
        return Interval(math.nan, math.nan, math.nan, 0)
    diff = sum(a) / len(a) - sum(b) / len(b)
    if n < 2:
        return Interval(diff, math.nan, math.nan, n)
    var_a, var_b = (_sample_variance(v) / len(v) for v in (a, b))
    se = math.sqrt(var_a + var_b)
    if se == 0:
        return Interval(diff, diff, diff, n)
    df = se**4 / (var_a**2 / (len(a) - 1) + var_b**2 / (len(b) - 1))
    half = float(stats.t.ppf(0.5 + confidence / 2, df)) * se
    return Interval(diff, diff - half, diff + half, n)


def _sample_variance(values: Sequence[float]) -> float:
    mean = sum(values) / len(values)
    return sum((v - mean) ** 2 for v in values) / (len(values) - 1)


def wilson_interval(successes: float, n: int, confidence: float = 0.95) -> Interval:
    """The Wilson score interval of a success rate from ``n`` Bernoulli trials (one run's eval episodes)."""
    if n <= 0:
        return Interval(math.nan, math.nan, math.nan, 0)
    z = float(stats.norm.ppf(0.5 + confidence / 2))
    p = successes / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return Interval(p, max(0.0, centre - half), min(1.0, centre + half), n)


def area_under_curve(steps: Sequence[float], values: Sequence[float]) -> float:
    """Trapezoid area under a curve divided by its step range: the mean value over the run (a single point:
    that value)."""
    if not steps:
        return math.nan
    if len(steps) == 1 or steps[-1] == steps[0]:
        return float(values[0])
    area = sum(
        (s1 - s0) * (v0 + v1) / 2
        for s0, s1, v0, v1 in zip(steps, steps[1:], values, values[1:], strict=False)
    )
    return area / (steps[-1] - steps[0])


def steps_to_reach(steps: Sequence[float], values: Sequence[float], threshold: float) -> float | None:
    """The first step whose value is at least ``threshold`` (None: never reached)."""
    for s, v in zip(steps, values, strict=True):
        if v >= threshold:
            return s
    return None


def mcnemar_exact(only_a: int, only_b: int) -> float:
    """Two-sided exact McNemar p-value of paired binary outcomes from their discordant pairs: ``only_a``
    pairs where only the first succeeded, ``only_b`` where only the second did (no discordant pair: 1)."""
    n = only_a + only_b
    if n == 0:
        return 1.0
    return float(stats.binomtest(min(only_a, only_b), n, 0.5).pvalue)

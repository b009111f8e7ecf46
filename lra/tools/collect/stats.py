"""95% intervals over seeds and the two comparisons the tables mark (docs/results.md, "How to read the numbers").

* :func:`t_interval`: the t-based 95% interval of a mean over ``n`` seeds,
  ``mean ± t(0.975, n-1) * std / sqrt(n)``; none (NaN) with fewer than two seeds.
* :func:`welch_interval`: the Welch 95% interval of the difference of two means (unequal variances,
  Welch-Satterthwaite degrees of freedom); none with fewer than two seeds on either side.
* :func:`mean_of_means_half_width`: the 95% interval of an average of independent per-task means (the
  LRA chart's accuracy over tasks), Welch-Satterthwaite degrees of freedom as in :func:`welch_interval`.
* :func:`clip`: an interval cut to the range a quantity allows.
* :func:`verdict`: whether an interval covers a value (``CANNOT_SEPARATE``), misses it (``SEPARATED``),
  or there is no interval (``NOT_TESTABLE``).

The paper's number is one published value without its own spread, so the comparison with the paper
is "does our interval cover it"; the comparison with the Standard row is Welch's on the two means.
"""

from __future__ import annotations

import math

from scipy import stats as _st

LEVEL = 0.95
# Fewest seeds behind an interval or a test: with two, t(0.975, 1) = 12.7 makes the interval about nine
# standard deviations wide (accuracy [-22, 58] from two quick runs); the tables print mean ± std instead.
MIN_SEEDS = 3
CANNOT_SEPARATE = "cannot_separate"  # the interval covers the other value: the seeds cannot tell them apart
SEPARATED = "separated"  # the interval excludes it (at 95%)
NOT_TESTABLE = "not_testable"  # too few seeds on one side: no interval, no claim
NOT_COMPARABLE = "not_comparable"  # a timing against one taken on another device: no comparison


def _finite(*xs) -> bool:
    return all(x is not None and math.isfinite(x) for x in xs)


def t_quantile(df: float) -> float:
    """The two-sided 95% quantile of Student's t with ``df`` degrees of freedom (4.302653 for df = 2)."""
    return float(_st.t.ppf(0.5 + LEVEL / 2, df))


def t_interval(mean: float, std: float, n: int) -> tuple[float, float]:
    """(low, high) of the 95% t-interval of ``mean`` over ``n`` seeds with sample std ``std`` (ddof 1);
    (nan, nan) when n < 2 or a value is missing: one seed has no interval."""
    if n < 2 or not _finite(mean, std):
        return math.nan, math.nan
    half = t_quantile(n - 1) * std / math.sqrt(n)
    return mean - half, mean + half


def half_width(std: float, n: int) -> float:
    """The 95% t-interval's half-width, nan when n < 2."""
    hi = t_interval(0.0, std, n)[1]
    return hi if math.isfinite(hi) else math.nan


def clip(low: float, high: float, lo: float = -math.inf, hi: float = math.inf) -> tuple[float, float]:
    """An interval cut to what the quantity allows (an accuracy in [0, 100], a time >= 0): the values outside
    cannot be, so the interval of what the seeds allow is its part inside; nan stays nan."""
    if not _finite(low, high):
        return math.nan, math.nan
    return min(max(low, lo), hi), max(min(high, hi), lo)


def welch_interval(
    m1: float, s1: float, n1: int, m2: float, s2: float, n2: int, min_n: int = 2
) -> tuple[float, float, float]:
    """(difference m1 - m2, low, high): Welch's 95% interval of the difference of two means.

    Degrees of freedom by Welch-Satterthwaite. With fewer than ``min_n`` (at least two) seeds on a side, the
    bounds are nan. Where both sides have zero spread the interval shrinks to the difference itself."""
    if not _finite(m1, m2):
        return math.nan, math.nan, math.nan
    diff = m1 - m2
    if n1 < max(2, min_n) or n2 < max(2, min_n) or not _finite(s1, s2):
        return diff, math.nan, math.nan
    v1, v2 = s1 * s1 / n1, s2 * s2 / n2
    se = math.sqrt(v1 + v2)
    if se == 0:
        return diff, diff, diff
    half = t_quantile(satterthwaite_df((v1, v2), (n1, n2))) * se
    return diff, diff - half, diff + half


def satterthwaite_df(v, n) -> float:
    """Welch-Satterthwaite degrees of freedom of a sum of independent means, from each mean's squared
    standard error ``v[i] = std[i]**2 / n[i]`` and its number of seeds ``n[i]`` (all >= 2, some v > 0)."""
    return sum(v) ** 2 / sum(vi * vi / (ni - 1) for vi, ni in zip(v, n))


def mean_of_means_half_width(std, n) -> float:
    """Half-width of the 95% t-interval of the mean of independent means (one per task, each over its
    seeds; Welch-Satterthwaite degrees of freedom); nan when a mean has fewer than two seeds."""
    if len(std) == 0 or any(k < 2 for k in n) or not all(math.isfinite(x) for x in std):
        return math.nan
    v = [x * x / k for x, k in zip(std, n)]
    if sum(v) == 0:
        return 0.0
    return t_quantile(satterthwaite_df(v, n)) * math.sqrt(sum(v)) / len(std)


def verdict(low: float, high: float, value: float) -> str:
    """``CANNOT_SEPARATE`` when [low, high] covers ``value``, ``SEPARATED`` when not, ``NOT_TESTABLE`` without
    an interval (or without a value)."""
    if not _finite(low, high, value):
        return NOT_TESTABLE
    return CANNOT_SEPARATE if low <= value <= high else SEPARATED

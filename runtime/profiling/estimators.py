"""The estimators behind a reward profile: pass@k, majority@k, summary statistics, percentiles.

Pure functions over plain numbers, so each is tested against hand-computed cases.
"""

from __future__ import annotations

import functools
import itertools
import math
import statistics
import zlib
from collections import Counter
from collections.abc import Hashable, Sequence
from typing import TypeVar

import msgspec

T = TypeVar("T", bound=Hashable)


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k (Chen et al. 2021): the chance that k of n samples, c of them correct, hold one correct.

    Computed as 1 - prod_{i=n-c+1}^{n} (1 - k/i), which equals 1 - C(n-c, k)/C(n, k) without the
    huge binomials; it is exactly 1 when n - c < k (every k-subset holds a correct sample).
    """
    if n < 1 or not 0 <= c <= n:
        raise ValueError(f"pass@k needs n >= 1 and 0 <= c <= n, got n={n}, c={c}")
    if not 1 <= k <= n:
        raise ValueError(f"pass@k needs 1 <= k <= n, got k={k}, n={n}")
    if n - c < k:
        return 1.0
    return 1.0 - math.prod(1.0 - k / i for i in range(n - c + 1, n + 1))


def ks(n: int) -> list[int]:
    """The k values a profile reports for n samples per task: every power of two up to n, and n itself."""
    out = []
    k = 1
    while k <= n:
        out.append(k)
        k *= 2
    if n >= 1 and out[-1] != n:
        out.append(n)
    return out


def majority_vote(answers: Sequence[T | None]) -> T | None:
    """The most frequent answer (None abstains); a tie goes to the answer given first."""
    counts = Counter(a for a in answers if a is not None)
    if not counts:
        return None
    top = max(counts.values())
    return next(a for a in answers if a is not None and counts[a] == top)


def majority_at_k(votes: Sequence[tuple[Hashable | None, bool]], k: int) -> float:
    """How often a majority vote over k of the n (answer, passed) votes, drawn at random, is right.

    The expectation over every k-subset, as pass@k is: a tie between answers is split evenly, a
    rollout with no extracted answer abstains (k abstentions are wrong), and an answer counts as
    right in the share of its rollouts that passed. So majority@1 equals the pass rate, and
    majority@n is the vote over all n. Exact unless the answers are so many and so scattered that
    the splits exceed EXACT_SPLITS; then it is a reproducible sampling estimate.
    """
    if not 1 <= k <= len(votes):
        raise ValueError(f"majority@k needs 1 <= k <= {len(votes)} votes, got k={k}")
    groups: dict[Hashable, list[int]] = {}
    for answer, passed in votes:
        if answer is not None:
            g = groups.setdefault(answer, [0, 0])
            g[0] += 1
            g[1] += passed
    shape = tuple(sorted((m, c) for m, c in groups.values()))
    return _majority(shape, len(votes) - sum(m for m, _ in shape), k)


EXACT_SPLITS = 2_000
"""Past this many ways to split k draws over a task's answers, majority@k is estimated by sampling."""
SAMPLED_DRAWS = 5_000
"""Draws of the sampling estimate: its standard error is at most 0.5 / sqrt(SAMPLED_DRAWS) = 0.007 per task."""


@functools.lru_cache(maxsize=65536)
def _majority(groups: tuple[tuple[int, int], ...], abstain: int, k: int) -> float:
    """Expectation over k-subsets for answer groups (size, passed) and abstentions: exact (multivariate
    hypergeometric) while the splits are few, else a sampling estimate seeded by the inputs (reproducible)."""
    sizes = [abstain] + [m for m, _ in groups]
    right = [0.0] + [c / m for m, c in groups]
    if _splits(sizes, k) <= EXACT_SPLITS:
        return _exact(sizes, right, k)
    return _sampled(sizes, right, k)


def _splits(sizes: list[int], k: int) -> int:
    """How many ways k draws split over groups of these sizes (0 <= x_i <= size_i, sum k), counted up to
    EXACT_SPLITS + 1 by a bounded-composition recurrence: O(groups x k), so no walk starts that cannot end."""
    ways = [1] + [0] * k  # ways[r]: splits of r draws over the groups seen so far
    for m in sizes:
        prefix = list(itertools.accumulate(ways, initial=0))
        ways = [min(prefix[r + 1] - prefix[max(0, r - m)], EXACT_SPLITS + 1) for r in range(k + 1)]
    return ways[k]


def _vote(draws: Sequence[int], right: Sequence[float]) -> float:
    """Score of one split: the share of the tied top answers that are right (index 0 abstains)."""
    top = max(draws[1:], default=0)
    if not top:
        return 0.0
    tied = [j for j in range(1, len(draws)) if draws[j] == top]
    return sum(right[j] for j in tied) / len(tied)


def _log_comb(n: int, k: int) -> float:
    return math.lgamma(n + 1) - math.lgamma(k + 1) - math.lgamma(n - k + 1)


def _exact(sizes: list[int], right: list[float], k: int) -> float:
    """Every split, weighted by its hypergeometric probability prod C(size_i, x_i) / C(n, k): with exact
    integers up to n = 1,000 samples, else in log space (at thousands of repeats the binomials have
    thousands of digits). Each group's binomials are computed once, not once per split."""
    n = sum(sizes)
    capacity = [*reversed([*itertools.accumulate(reversed(sizes))]), 0]  # draws groups i.. can absorb
    exact = n <= 1000  # then every binomial is under 2**1000
    binomial = math.comb if exact else _log_comb
    combs = [[binomial(m, x) for x in range(min(m, k) + 1)] for m in sizes]
    total = binomial(n, k)
    score = 0.0

    def walk(i: int, r: int, weight: float, draws: list[int]) -> None:
        nonlocal score
        if i == len(sizes):
            share = weight / total if exact else math.exp(weight - total)
            score += share * _vote(draws, right)
            return
        table = combs[i]
        for x in range(max(0, r - capacity[i + 1]), min(sizes[i], r) + 1):
            walk(i + 1, r - x, weight * table[x] if exact else weight + table[x], [*draws, x])

    walk(0, k, 1 if exact else 0.0, [])
    return min(score, 1.0)


def _sampled(sizes: list[int], right: list[float], k: int) -> float:
    """The mean score of SAMPLED_DRAWS k-subsets drawn at once (numpy's multivariate hypergeometric)."""
    import numpy as np  # only a run with many repeats of a task over scattered answers gets here

    rng = np.random.default_rng(zlib.crc32(repr((sizes, right, k)).encode()))
    draws = rng.multivariate_hypergeometric(sizes, k, size=SAMPLED_DRAWS)[:, 1:]  # abstentions never win
    top = draws.max(axis=1, keepdims=True)
    tied = (draws == top) & (top > 0)
    counts = tied.sum(axis=1)
    scores = (tied * np.asarray(right[1:])).sum(axis=1) / np.maximum(counts, 1)
    return float(scores.mean())


class Stats(msgspec.Struct, kw_only=True):
    """Summary of a set of values (rewards); the statistics are None when there are none."""

    count: int = 0
    mean: float | None = None
    std: float | None = None
    """Population standard deviation (in floats: statistics.pstdev's exact fractions took most of a
    large run's profile)."""
    min: float | None = None
    max: float | None = None
    median: float | None = None


def describe(values: Sequence[float]) -> Stats:
    if not values:
        return Stats()
    mean = statistics.fmean(values)
    return Stats(
        count=len(values),
        mean=mean,
        std=math.sqrt(math.fsum((v - mean) ** 2 for v in values) / len(values)),
        min=min(values),
        max=max(values),
        median=statistics.median(values),
    )


class Spread(msgspec.Struct, kw_only=True):
    """Distribution of a duration in seconds: mean, percentiles (linear interpolation) and max."""

    count: int = 0
    mean: float | None = None
    p50: float | None = None
    p90: float | None = None
    p99: float | None = None
    max: float | None = None


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0-100) by linear interpolation between closest ranks (numpy's default, and
    ``statistics.quantiles(method="inclusive")``): the one method every figure of gymbus uses."""
    if not values:
        raise ValueError("percentile of no values")
    return _ranked(sorted(values), q)


def _ranked(ordered: Sequence[float], q: float) -> float:
    pos = (len(ordered) - 1) * q / 100
    low = int(pos)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (pos - low)


def spread(values: Sequence[float]) -> Spread:
    if not values:
        return Spread()
    ordered = sorted(values)
    return Spread(
        count=len(values),
        mean=statistics.fmean(values),
        p50=_ranked(ordered, 50),
        p90=_ranked(ordered, 90),
        p99=_ranked(ordered, 99),
        max=ordered[-1],
    )

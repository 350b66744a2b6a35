"""Statistics of the studies (experiments/studies/*/PROTOCOL.md): an exact sign-flip test and a bootstrap interval
of a mean paired difference, Holm's adjustment for a family of tests, and an exact binomial sign test.

    d = endpoint_b - endpoint_a                 # f64[n]: one difference per seed, arms paired by seed
    p = sign_flip_p(d)                          # two-sided, exact over the 2^n sign patterns
    low, high = bootstrap_interval(d)           # 95% percentile interval of mean(d), seeds resampled
    p = sign_test_p(positive=19, total=24)      # two-sided exact binomial test of a share against 1/2
"""
from __future__ import annotations

import itertools
import math
from typing import Sequence

import numpy as np

BOOTSTRAP_RESAMPLES = 10_000
BOOTSTRAP_SEED = 0
TIE = 1e-12  # a sign pattern whose |mean| equals the observed one up to rounding counts as extreme


def sign_flip_p(differences: Sequence[float]) -> float:
    """Two-sided exact p of mean(d) = 0 under the null that each paired difference is symmetric about 0: the share
    of the 2^n sign patterns whose |mean| is at least the observed |mean| (the observed pattern included)."""
    d = np.asarray(differences, np.float64)
    if d.ndim != 1 or len(d) == 0 or len(d) > 20:
        raise ValueError(f"sign_flip_p takes 1 to 20 paired differences, got shape {d.shape}")
    signs = np.array(list(itertools.product((1.0, -1.0), repeat=len(d))))  # [2^n, n]
    means = np.abs(signs @ d) / len(d)
    return float(np.mean(means >= abs(d.mean()) - TIE))


def bootstrap_interval(differences: Sequence[float], level: float = 0.95, resamples: int = BOOTSTRAP_RESAMPLES,
                       seed: int = BOOTSTRAP_SEED) -> tuple[float, float]:
    """The percentile interval of mean(d) over `resamples` resamples of the seeds with replacement (a fixed RNG
    seed, so the interval is reproducible)."""
    d = np.asarray(differences, np.float64)
    rng = np.random.default_rng(seed)
    means = d[rng.integers(0, len(d), size=(resamples, len(d)))].mean(axis=1)
    tail = (1.0 - level) / 2.0 * 100.0
    low, high = np.percentile(means, [tail, 100.0 - tail])
    return float(low), float(high)


def holm(p_values: Sequence[float]) -> list[float]:
    """Holm's step-down adjusted p-values (family-wise error), in the input order."""
    p = np.asarray(p_values, np.float64)
    order = np.argsort(p, kind="stable")
    adjusted = np.empty_like(p)
    running = 0.0
    for rank, index in enumerate(order):
        running = max(running, min(1.0, (len(p) - rank) * p[index]))
        adjusted[index] = running
    return adjusted.tolist()


def sign_test_p(positive: int, total: int) -> float:
    """Two-sided exact binomial sign test: `positive` successes of `total` trials under p = 1/2 (twice the smaller
    tail, at most 1)."""
    if not 0 <= positive <= total or total < 1:
        raise ValueError(f"sign_test_p needs 0 <= positive <= total and total >= 1, got {positive} of {total}")
    tail = min(sum(math.comb(total, k) for k in range(positive + 1)),
               sum(math.comb(total, k) for k in range(positive, total + 1)))
    return min(1.0, 2.0 * tail / 2.0 ** total)

"""Statistics of the studies (experiments/studies/*/PROTOCOL.md): an exact sign-flip test and a bootstrap interval
of a mean paired difference, Holm's adjustment for a family of tests, an exact binomial sign test, and the run
bootstrap of Spearman's rho over a population of runs.

    d = endpoint_b - endpoint_a                 # f64[n]: one difference per seed, arms paired by seed
    p = sign_flip_p(d)                          # two-sided, exact over the 2^n sign patterns
    low, high = bootstrap_interval(d)           # 95% percentile interval of mean(d), seeds resampled
    p = sign_test_p(positive=19, total=24)      # two-sided exact binomial test of a share against 1/2
    samples = bootstrap_spearman(x, y)          # f64[resamples]: rho over resamples of the runs
    low, high = percentile_interval(samples); p = bootstrap_p(samples)
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
    return percentile_interval(d[resample_indices(len(d), resamples, seed)].mean(axis=1), level)


def resample_indices(n: int, resamples: int = BOOTSTRAP_RESAMPLES, seed: int = BOOTSTRAP_SEED) -> np.ndarray:
    """int[resamples, n]: `resamples` draws of n units with replacement (a fixed RNG seed, so reproducible)."""
    return np.random.default_rng(seed).integers(0, n, size=(resamples, n))


def percentile_interval(samples: Sequence[float], level: float = 0.95) -> tuple[float, float]:
    """The central `level` percentile interval of bootstrap `samples`, NaN samples left out."""
    tail = (1.0 - level) / 2.0 * 100.0
    low, high = np.nanpercentile(np.asarray(samples, np.float64), [tail, 100.0 - tail])
    return float(low), float(high)


def spearman_rows(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """f64[R]: Spearman's rho of each row pair of x, y f64[R, n] (ties share their mean rank; NaN where a row is
    constant)."""
    rx, ry = rank_rows(np.asarray(x, np.float64)), rank_rows(np.asarray(y, np.float64))
    rx, ry = rx - rx.mean(axis=1, keepdims=True), ry - ry.mean(axis=1, keepdims=True)
    denominator = np.sqrt((rx * rx).sum(axis=1) * (ry * ry).sum(axis=1))
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(denominator > 0, (rx * ry).sum(axis=1) / denominator, np.nan)


def rank_rows(a: np.ndarray) -> np.ndarray:
    """f64[R, n]: each row's ranks 0..n-1, ties sharing their mean rank."""
    below = (a[:, None, :] < a[:, :, None]).sum(axis=2)
    tied = (a[:, None, :] == a[:, :, None]).sum(axis=2)
    return below + (tied - 1) / 2.0


def bootstrap_spearman(x: Sequence[float], y: Sequence[float], resamples: int = BOOTSTRAP_RESAMPLES,
                       seed: int = BOOTSTRAP_SEED) -> np.ndarray:
    """f64[resamples]: Spearman's rho of x with y (one value each per run) over resamples of the runs. Calls with the
    same number of runs draw the same resamples, so differences of their samples are paired."""
    x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
    idx = resample_indices(len(x), resamples, seed)
    return spearman_rows(x[idx], y[idx])


def bootstrap_p(samples: Sequence[float]) -> float:
    """Two-sided bootstrap p of "the statistic is 0": twice the smaller share of the non-NaN `samples` on either side
    of 0 (0 itself counts on both), at most 1."""
    s = np.asarray(samples, np.float64)
    s = s[~np.isnan(s)]
    if len(s) == 0:
        raise ValueError("bootstrap_p: every bootstrap sample is NaN")
    return float(min(1.0, 2.0 * min(np.mean(s <= 0), np.mean(s >= 0))))


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

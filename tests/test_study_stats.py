"""The studies' paired statistics (experiments/studies/stats.py) against scipy and worked examples."""
from __future__ import annotations

import numpy as np
import pytest
from scipy import stats as scipy_stats

from experiments.studies import stats


def test_sign_flip_matches_scipys_exact_paired_permutation_test():
    rng = np.random.default_rng(3)
    for n in (4, 6, 8):
        a, b = rng.normal(size=n), rng.normal(0.4, 1.0, size=n)
        want = scipy_stats.permutation_test((b, a), lambda x, y: np.mean(x - y), permutation_type="samples",
                                            n_resamples=np.inf, alternative="two-sided").pvalue
        assert stats.sign_flip_p(b - a) == pytest.approx(want, rel=1e-12)


def test_sign_flip_worked_examples():
    assert stats.sign_flip_p([1.0, 1.0, 1.0]) == pytest.approx(2 / 8)  # only all-plus and all-minus are as extreme
    assert stats.sign_flip_p([0.1] * 8) == pytest.approx(2 / 256)
    assert stats.sign_flip_p([1.0, -1.0]) == 1.0
    with pytest.raises(ValueError, match="1 to 20 paired differences"):
        stats.sign_flip_p([])


def test_bootstrap_interval_is_reproducible_and_brackets_the_mean():
    d = [0.05, 0.10, -0.02, 0.08, 0.03, 0.12, 0.00, 0.06]
    low, high = stats.bootstrap_interval(d)
    assert (low, high) == stats.bootstrap_interval(d)  # a fixed seed
    assert low < np.mean(d) < high and min(d) < low and high < max(d)
    assert stats.bootstrap_interval([0.2] * 5) == pytest.approx((0.2, 0.2))  # no spread, no width
    # the percentile interval of a large normal sample's mean is about mean +- 1.96 sd / sqrt(n)
    big = np.random.default_rng(0).normal(1.0, 2.0, size=400)
    low, high = stats.bootstrap_interval(big)
    half = 1.96 * big.std() / np.sqrt(len(big))
    assert low == pytest.approx(big.mean() - half, abs=0.03) and high == pytest.approx(big.mean() + half, abs=0.03)


def test_holm_adjustment_worked_example():
    # sorted 0.01, 0.02, 0.04 -> 3 x 0.01, max(0.03, 2 x 0.02), max(0.04, 1 x 0.04); back in the input order
    assert stats.holm([0.04, 0.01, 0.02]) == pytest.approx([0.04, 0.03, 0.04])
    assert stats.holm([0.5, 0.9]) == pytest.approx([1.0, 1.0])


def test_sign_test_matches_scipys_binomial_test():
    for positive, total in ((0, 1), (3, 10), (19, 24), (12, 24), (24, 24), (5, 7)):
        want = scipy_stats.binomtest(positive, total, 0.5, alternative="two-sided").pvalue
        assert stats.sign_test_p(positive, total) == pytest.approx(want, rel=1e-12)
    assert stats.sign_test_p(8, 8) == pytest.approx(2 / 256)
    with pytest.raises(ValueError, match="0 <= positive <= total"):
        stats.sign_test_p(3, 2)

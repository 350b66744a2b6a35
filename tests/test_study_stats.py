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


def test_spearman_rows_match_scipy_row_by_row_ties_included():
    rng = np.random.default_rng(5)
    x = rng.integers(0, 4, size=(50, 12)).astype(float)  # many ties, as in a bootstrap resample
    y = rng.normal(size=(50, 12))
    want = [scipy_stats.spearmanr(a, b).statistic for a, b in zip(x, y)]
    np.testing.assert_allclose(stats.spearman_rows(x, y), want, rtol=1e-12)
    assert np.isnan(stats.spearman_rows(np.ones((1, 5)), y[:1, :5])[0])  # a constant row has no rank correlation


def test_bootstrap_spearman_resamples_runs_and_pairs_calls_of_the_same_size():
    rng = np.random.default_rng(6)
    x, y, z = rng.normal(size=(3, 30))
    a, b = stats.bootstrap_spearman(x, y, resamples=200), stats.bootstrap_spearman(x, z, resamples=200)
    idx = stats.resample_indices(30, 200)
    assert a[7] == pytest.approx(scipy_stats.spearmanr(x[idx[7]], y[idx[7]]).statistic, rel=1e-12)
    assert b[7] == pytest.approx(scipy_stats.spearmanr(x[idx[7]], z[idx[7]]).statistic, rel=1e-12)
    np.testing.assert_array_equal(stats.bootstrap_spearman(x, y, resamples=200), a)  # reproducible


def test_bootstrap_p_and_interval_worked_examples():
    samples = np.array([-1.0, 0.0, 1.0, 2.0, 3.0, np.nan])  # 2 of 5 at or below 0, 4 of 5 at or above
    assert stats.bootstrap_p(samples) == pytest.approx(2 * 2 / 5)
    assert stats.bootstrap_p([1.0, 2.0]) == 0.0
    assert stats.percentile_interval(np.arange(101.0), level=0.9) == pytest.approx((5.0, 95.0))
    with pytest.raises(ValueError, match="every bootstrap sample is NaN"):
        stats.bootstrap_p([np.nan])

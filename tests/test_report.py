"""experiments/report.py over a sweep: members grouped by one key, the seed bands and the markdown summary
(checked against numpy on synthetic metrics)."""
from __future__ import annotations

import os

import numpy as np

from experiments import report


def rows(first: float, last: float) -> list[dict]:
    return [{"step": 0, "val-env/bandit/success": first},
            {"step": 1, "bandit/success": 0.5, "rollout/filter_kept_ratio": 0.875},
            {"step": 2, "bandit/success": 0.6, "val-env/bandit/success": last}]


def test_groups_pool_the_seeds_and_the_summary_gives_their_mean_and_std(tmp_path):
    members = {"filter.value=0.9,train.seed=0": rows(0.2, 0.7), "filter.value=0.9,train.seed=1": rows(0.3, 0.5),
               "filter.value=1.0,train.seed=0": rows(0.25, 0.4), "filter.value=1.0,train.seed=1": rows(0.25, 0.6)}
    groups = report.group_members(members, "filter.value")
    assert list(groups) == ["filter.value=0.9", "filter.value=1.0"] and all(len(g) == 2 for g in groups.values())
    table = report.summary_table(groups).splitlines()
    assert table[2] == (f"| filter.value=0.9 | 2 | 0.250 ± {np.std([0.2, 0.3]):.3f} | 0.600 ± {np.std([0.7, 0.5]):.3f} "
                        "| 0.200 -> 0.700, 0.300 -> 0.500 |")
    assert table[3].startswith("| filter.value=1.0 | 2 | 0.250 ± 0.000 | 0.500 ± 0.100 |")
    out = report.plot_groups(groups, str(tmp_path / "groups.png"))
    assert os.path.getsize(out) > 10_000


def test_spearman_matches_scipy_with_ties():
    from scipy import stats  # a peer (jax depends on scipy)

    rng = np.random.default_rng(0)
    x, y = rng.integers(0, 5, 40).astype(float), rng.normal(size=40)
    assert abs(report.spearman(x, y) - stats.spearmanr(x, y).statistic) < 1e-12
    assert report.spearman([1, 2, 3], [3, 2, 1]) == -1.0 and np.isnan(report.spearman([1, 1, 1], [1, 2, 3]))


def test_spearman_table_pairs_validation_success_with_the_same_rows_diagnostics():
    runs = [[{"step": s, "val-env/bandit/success": 0.1 * s, "bandit/success": 0.5,
              "collapse_first_turn_sample/mi_estimate": float(s), "actor/entropy": -float(s)} for s in range(4)]]
    table = report.spearman_table(runs).splitlines()
    assert "| first-turn MI estimate | +1.00 | 4 |" in table and "| policy entropy | -1.00 | 4 |" in table
    assert not any(line.startswith("| H(Z|X)") for line in table)  # no such rows

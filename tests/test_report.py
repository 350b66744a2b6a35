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


def analysed(step: int, task: list[float], rv: list[float], success: float) -> dict:
    row = {"step": step, "val-env/bandit/success": success, "bandit/success": success}
    for b, (t, r) in enumerate(zip(task, rv), start=1):
        row.update({f"grad_norm/bucket_{b}/task": t, f"grad_norm/bucket_{b}/entropy": 0.01,
                    f"grad_norm/bucket_{b}/kl": 0.0, f"grad_norm/bucket_{b}/reward_std_mean": r,
                    f"grad_norm/bucket_{b}/sample_count": 8.0})
    return row


def test_gradient_buckets_average_over_steps_skipping_empty_buckets(tmp_path):
    runs = [[analysed(5, [0.0, 1.0], [0.0, 0.4], 0.3), analysed(10, [np.nan, 3.0], [np.nan, 0.2], 0.5)],
            [analysed(5, [0.5, 2.0], [0.1, 0.3], 0.4)]]
    assert report.bucket_names(runs) == ["bucket_1", "bucket_2"]
    np.testing.assert_allclose(report.bucket_means(runs, "task"), [0.25, 2.0])
    np.testing.assert_allclose(report.bucket_means(runs, "reward_std_mean"), [0.05, 0.3])
    table = report.gradient_table({"g": runs}).splitlines()
    assert table[0] == "| group | bucket | reward_std_mean | task | entropy | kl | sample_count |"
    assert table[2] == "| g | bucket_1 | 0.05 | 0.25 | 0.01 | 0 | 8 |"
    assert os.path.getsize(report.plot_gradients({"g": runs}, str(tmp_path / "g.png"))) > 10_000
    with np.testing.assert_raises(ValueError):
        report.plot_gradients({"g": [rows(0.1, 0.2)]}, str(tmp_path / "none.png"))


def test_regime_points_pair_validation_success_with_the_same_rows_diagnostics(tmp_path):
    h, mi = report.REGIME_X, report.REGIME_Y
    runs = [[{"step": 0, "val-env/bandit/success": 0.2, "bandit/success": 0.1, h: 3.0, mi: 0.5},
             {"step": 1, "bandit/success": 0.3, h: 2.0, mi: 1.0},  # not validated
             {"step": 2, "val-env/bandit/success": 0.6, h: 2.5, mi: np.nan}],  # no MI this step
            [{"step": 0, "val-env/bandit/success": 0.9, "bandit/success": 0.8, h: 1.0, mi: 2.0}]]
    np.testing.assert_array_equal(report.validated_points(runs, (h, mi)), [[0.2, 3.0, 0.5], [0.9, 1.0, 2.0]])
    assert os.path.getsize(report.plot_regimes(runs, str(tmp_path / "regimes.png"))) > 10_000


def test_heatmap_grid_is_the_mean_over_each_groups_runs_per_step(tmp_path):
    groups = {"filter.value=0.5": [rows(0.2, 0.7), rows(0.4, 0.5)], "filter.value=1.0": [rows(0.1, 0.3)[:2]]}
    steps, grid = report.heatmap_grid(groups, "val-env/bandit/success")
    assert steps == [0, 2]
    np.testing.assert_allclose(grid, [[0.3, 0.6], [0.1, np.nan]])
    assert os.path.getsize(report.plot_heatmap(groups, "{env}/success", str(tmp_path / "heat.png"))) > 10_000


def test_groups_by_two_keys_pool_only_the_remaining_axis():
    members = {f"filter.value={f},algo.entropy_coeff={e},train.seed={s}": rows(0.1 * s, 0.5)
               for f in (0.5, 1.0) for e in (0.001, 0.05) for s in (0, 1)}
    groups = report.group_members(members, "filter.value,algo.entropy_coeff")
    assert list(groups) == ["filter.value=0.5,algo.entropy_coeff=0.001", "filter.value=0.5,algo.entropy_coeff=0.05",
                            "filter.value=1.0,algo.entropy_coeff=0.001", "filter.value=1.0,algo.entropy_coeff=0.05"]
    assert all(len(runs) == 2 for runs in groups.values())


def test_several_sweep_folders_pool_their_members(tmp_path, capsys):
    """Two sweep folders (written as ragen_jax.train.sweep writes them) pooled by `report.py A B --group-by sweep`:
    one group per folder, the Spearman table over every member's validated rows, one figure where --out says."""
    import json

    from ragen_jax.train.metrics_log import MetricsWriter

    def sweep(name, members):
        folder = tmp_path / name
        for member, member_rows in members.items():
            with MetricsWriter(str(folder / member), tensorboard=False) as writer:
                for row in member_rows:
                    writer.write(row["step"], {k: v for k, v in row.items() if k != "step"})
        (folder / "sweep.json").write_text(json.dumps({"names": list(members)}))
        return str(folder)

    diag = "collapse_first_turn_sample/mi_zscore"
    with_diag = lambda a, b, z: [{**r, diag: z} if "val-env/bandit/success" in r else r for r in rows(a, b)]  # noqa
    a = sweep("kl", {"train.seed=0": with_diag(0.1, 0.6, 1.0), "train.seed=1": with_diag(0.2, 0.8, 3.0)})
    b = sweep("nokl", {"filter.value=1.0,train.seed=0": with_diag(0.3, 0.4, 2.0)})
    members = report.pooled_members([a, b])
    assert list(members) == ["kl/train.seed=0", "kl/train.seed=1", "nokl/filter.value=1.0,train.seed=0"]
    groups = report.group_members(members, "sweep,filter.value")
    assert {k: len(v) for k, v in groups.items()} == {"sweep=kl,filter.value=fixed": 2,
                                                      "sweep=nokl,filter.value=1.0": 1}
    report.main(["report", a, b, "--group-by", "sweep", "--out", str(tmp_path / "pooled.png")])
    out = capsys.readouterr().out
    success = [0.1, 0.6, 0.2, 0.8, 0.3, 0.4]  # (validation success, z-score) of the six validated rows
    expected = report.spearman(success, [1.0, 1.0, 3.0, 3.0, 2.0, 2.0])
    assert f"| first-turn MI z-score | {expected:+.2f} | 6 |" in out
    assert os.path.getsize(tmp_path / "pooled.png") > 10_000

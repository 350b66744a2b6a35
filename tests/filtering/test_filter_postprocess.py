"""Compaction, filter metrics (RAGEN names), loss scaling and soft reweighting (docs/filtering.md)."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ragen_jax.filtering import (
    apply_filter,
    compact,
    expand_group_mask,
    filter_loss_scaling,
    filter_metrics,
    permute_rows,
    soft_advantage_weights,
)


def test_compact_moves_whole_kept_groups_to_the_front_in_order():
    group_mask = jnp.array([False, True, False, True, True])
    perm, kept_rows = jax.jit(compact, static_argnums=1)(group_mask, 3)
    rows = np.arange(15)
    kept = [3, 4, 5, 9, 10, 11, 12, 13, 14]
    dropped = [0, 1, 2, 6, 7, 8]
    np.testing.assert_array_equal(np.asarray(perm), kept + dropped)
    assert int(kept_rows) == 9
    batch = {"tokens": jnp.asarray(rows[:, None] * 10 + np.arange(2)), "reward": jnp.asarray(rows, jnp.float32)}
    moved = permute_rows(batch, perm)
    np.testing.assert_array_equal(moved["reward"][:9], kept)
    np.testing.assert_array_equal(moved["tokens"][:, 0], np.asarray(kept + dropped) * 10)
    np.testing.assert_array_equal(expand_group_mask(group_mask, 3)[np.asarray(perm)][:9], True)


def test_compact_empty_and_full():
    perm, kept_rows = compact(jnp.zeros(4, bool), 2)
    np.testing.assert_array_equal(perm, np.arange(8))
    assert int(kept_rows) == 0
    perm, kept_rows = compact(jnp.ones(4, bool), 2)
    np.testing.assert_array_equal(perm, np.arange(8))
    assert int(kept_rows) == 8


def test_filter_metrics_names_and_values():
    values = np.array([[1.0, 0.0, 0.0, 1.0], [2.0, 2.0, 2.0, 2.0], [10.5, -1.0, 10.7, -1.0]], np.float32)
    scores = values.std(1, ddof=1)
    mask = np.array([True, False, True])
    got = filter_metrics(jnp.asarray(values), jnp.asarray(scores), jnp.asarray(mask), "reward_variance")
    stats = {"std": scores, "max": values.max(1), "mean": values.mean(1), "sum": values.sum(1)}
    expected = {}
    for name, per_group in stats.items():
        for prefix, suffix in (("rollout/in_group_", ""), ("rollout/in_group_reward_", "")):
            if name == "sum" and prefix == "rollout/in_group_":
                continue
            expected[f"{prefix}{name}"] = per_group.mean()
            expected[f"{prefix.replace('in_group', 'chosen_in_group')}{name}"] = per_group[mask].mean()
    expected.update({"rollout/filter_kept_count": 2.0, "rollout/filter_kept_ratio": 2 / 3,
                     "rollout/filter_zero_count": 1.0, "rollout/empty_after_filter": 0.0})
    assert set(got) == set(expected)
    for key, value in expected.items():
        assert float(got[key]) == pytest.approx(float(value), rel=1e-5), key
    entropy = filter_metrics(jnp.asarray(values), jnp.asarray(scores), jnp.zeros(3, bool), "entropy")
    assert "rollout/in_group_entropy_std" in entropy and "rollout/in_group_entropy_sum" not in entropy
    assert float(entropy["rollout/chosen_in_group_entropy_mean"]) == 0.0
    assert float(entropy["rollout/empty_after_filter"]) == 1.0
    assert "rollout/in_group_length_mean" in filter_metrics(jnp.asarray(values), jnp.asarray(scores),
                                                            jnp.asarray(mask), "length")


def test_apply_filter_composes_scores_selection_and_compaction():
    values = jnp.asarray(np.array([[0, 0, 0, 0], [1, 0, 0, 1], [1, 1, 1, 1], [5, 0, 5, 0]], np.float32))
    result = jax.jit(apply_filter, static_argnums=(1, 2, 4, 5, 6))(values, "reward_variance", "top_p", 1.0,
                                                                  "largest", False, "linear")
    np.testing.assert_array_equal(result.group_mask, [False, True, False, True])  # zero-std groups dropped
    assert int(result.kept_rows) == 8 and float(result.kept_ratio) == 0.5
    np.testing.assert_array_equal(result.perm[:8], [4, 5, 6, 7, 12, 13, 14, 15])
    assert float(result.metrics["rollout/filter_zero_count"]) == 2.0


def test_filter_loss_scaling_modes():
    adv = jnp.array([[1.0, -2.0], [0.5, 4.0]])
    np.testing.assert_allclose(filter_loss_scaling(adv, 0.25, "none"), adv)
    np.testing.assert_allclose(filter_loss_scaling(adv, 0.25, "linear"), adv * 0.25)
    np.testing.assert_allclose(filter_loss_scaling(adv, 0.25, "sqrt"), adv * 0.5)
    with pytest.raises(ValueError, match="filter.loss_scaling"):
        filter_loss_scaling(adv, 0.25, "square")


def test_soft_advantage_weights_spec_example():
    weights, metrics = soft_advantage_weights(jnp.array([2.0, 1.0, 0.0, 7.0]), jnp.array([True, True, True, False]))
    np.testing.assert_allclose(weights, [0.9999995, 0.49999975, 0.0, 0.0], rtol=1e-6)
    assert float(metrics["train/soft_reweight_max"]) == pytest.approx(0.9999995)
    assert float(metrics["train/soft_reweight_min"]) == 0.0
    assert float(metrics["train/soft_reweight_mean"]) == pytest.approx((0.9999995 + 0.49999975) / 3)

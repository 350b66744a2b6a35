"""Reward normalisation and last-token placement (docs/rewards_and_objectives.md) against a numpy reference."""
import numpy as np
import pytest

from ragen_jax.algos import rewards


def reference(x: np.ndarray, method: str) -> np.ndarray:
    out = np.empty_like(x)
    for g, row in enumerate(x):
        if method == "identity":
            out[g] = row
        elif method == "mean":
            out[g] = row - row.mean()
        else:
            std = row.std(ddof=1)
            z = (row - row.mean()) / (std + 1e-6) if std > 1e-6 else np.zeros_like(row)
            out[g] = np.clip(z, -1.0, 3.0) if method == "asym_clip" else z
    return out


@pytest.mark.parametrize("method", ["identity", "mean", "mean_std", "asym_clip"])
def test_normalisation_matches_reference(method):
    x = np.random.default_rng(0).normal(size=(5, 16)).astype(np.float32) * 3
    x[2] = 0.7  # a constant group: zeros for mean_std / asym_clip
    x[3, :15] = 0.0
    x[3, 15] = 10.0  # z = 15 / 4 = 3.75: clipped at 3 by asym_clip
    np.testing.assert_allclose(rewards.normalize_group_rewards(x, method), reference(x, method), atol=1e-5)
    if method == "asym_clip":
        assert np.isclose(np.asarray(rewards.normalize_group_rewards(x, method))[3, 15], 3.0)


def test_single_rollout_groups_and_bad_method():
    x = np.array([[1.5], [-2.0]], np.float32)
    np.testing.assert_array_equal(rewards.normalize_group_rewards(x, "mean_std"), x)
    with pytest.raises(ValueError, match="reward_normalization = 'zscore'"):
        rewards.normalize_group_rewards(x, "zscore")


def test_reward_sits_on_the_last_masked_token():
    mask = np.array([[0, 1, 1, 0, 1, 0], [1, 1, 0, 0, 0, 0], [0, 0, 0, 0, 0, 0]], np.float32)
    out = np.asarray(rewards.last_token_rewards(np.array([2.0, -1.0, 5.0], np.float32), mask))
    expected = np.zeros_like(mask)
    expected[0, 4], expected[1, 1] = 2.0, -1.0
    np.testing.assert_array_equal(out, expected)

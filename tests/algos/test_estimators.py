"""The advantage-estimator registry (`algo.adv_estimator`): validation allows exactly the registered names, with a
one-line error for any other, and each entry equals the `advantages` function it wraps on a worked example."""
import jax.numpy as jnp
import numpy as np
import pytest

from configs import base
from ragen_jax import config as cfg
from ragen_jax import filtering
from ragen_jax.algos import advantages, estimators, presets

HYPER = estimators.AdvantageHyper(jnp.float32(1.0), jnp.float32(1.0), jnp.float32(0.95))


def _options(**switches):
    flags = dict(bi_level_gae=False, grpo_length_weight=False, norm_adv_by_std=True, soft_advantage_reweight=False)
    return estimators.AdvantageOptions(**{**flags, **switches})


def _inputs(token_rewards, values, loss_mask, group_size, group_mask):
    """AdvantageInputs of group-contiguous rows, the dropped groups' rows zero in `mask`."""
    token_rewards, values, loss_mask = (jnp.asarray(x, jnp.float32) for x in (token_rewards, values, loss_mask))
    group_mask = jnp.asarray(group_mask, bool)
    row_mask = jnp.repeat(group_mask, group_size)
    return estimators.AdvantageInputs(
        token_rewards=token_rewards, values=values, loss_mask=loss_mask, mask=loss_mask * row_mask[:, None],
        group_ids=jnp.repeat(jnp.arange(group_mask.shape[0], dtype=jnp.int32), group_size), row_mask=row_mask,
        group_mask=group_mask)


def _error(overrides):
    """The ConfigError `validate` raises for the base config with `overrides` ({"section.key": value})."""
    config = base.get_config()
    for name, value in overrides.items():
        section, field = name.split(".")
        config[section][field] = value
    with pytest.raises(cfg.ConfigError) as error:
        cfg.validate(config, num_devices=8)
    return error.value


def test_validation_allows_exactly_the_registered_names():
    assert list(estimators.ADV_ESTIMATORS) == ["gae", "grpo"] and estimators.ADV_ESTIMATORS is cfg.ADV_ESTIMATORS
    for name in estimators.ADV_ESTIMATORS:
        config = base.get_config()
        config.algo.adv_estimator = name
        assert cfg.validate(config, num_devices=8) is config
        assert presets.uses_critic(config) is estimators.ADV_ESTIMATORS[name].uses_critic
    error = _error({"algo.adv_estimator": "rloo"})
    assert str(error) == "config.algo.adv_estimator = 'rloo' is invalid: allowed values are 'gae', 'grpo'"
    assert error.allowed == "allowed values are " + ", ".join(repr(name) for name in estimators.ADV_ESTIMATORS)
    inputs = _inputs(np.zeros((2, 3)), np.zeros((2, 3)), np.ones((2, 3)), 2, [True])
    with pytest.raises(cfg.ConfigError, match="config.algo.adv_estimator = 'rloo'"):
        estimators.estimate("rloo", inputs, HYPER, _options())


def test_registered_metadata_is_validated_and_a_new_estimator_needs_only_its_registration():
    assert [(e.uses_critic, e.min_group_size) for e in estimators.ADV_ESTIMATORS.values()] == [(True, 1), (False, 2)]
    error = _error({"algo.adv_estimator": "grpo", "rollout.group_size": 1, "filter.metric": "reward",
                    "algo.ppo_mini_batch_size": 8})
    assert (error.key, error.allowed) == ("rollout.group_size", "the grpo advantage estimator needs a group_size >= 2")

    @estimators.register_adv_estimator("zero", uses_critic=False, min_group_size=32)
    def zero(inputs, hyper, options):
        return jnp.zeros_like(inputs.mask), jnp.zeros_like(inputs.mask), {}

    try:
        config = base.get_config()
        config.algo.adv_estimator = "zero"
        assert presets.uses_critic(config) is False
        error = _error({"algo.adv_estimator": "zero"})  # the base group_size is 16
        assert error.allowed == "the zero advantage estimator needs a group_size >= 32"
        inputs = _inputs(np.ones((2, 3)), np.zeros((2, 3)), np.ones((2, 3)), 2, [True])
        np.testing.assert_array_equal(estimators.estimate("zero", inputs, HYPER, _options())[0], np.zeros((2, 3)))
    finally:
        estimators.ADV_ESTIMATORS.unregister("zero")
    assert "zero" not in cfg.ADV_ESTIMATORS


def test_gae_entry_is_gae_on_the_kept_rows():
    # docs/rewards_and_objectives.md#gae's worked example in row 0; row 1 (a dropped group) gets nothing.
    rewards = [[0, 0, 0, 0, 0, 1.0], [0, 0, 0, 0, 0, 2.0]]
    values = [[0.1, 0.2, 0.3, 0.4, 0.5, 0.6]] * 2
    loss_mask = [[0, 1, 1, 0, 1, 1.0]] * 2
    inputs = _inputs(rewards, values, loss_mask, 1, [True, False])
    adv, returns, metrics = estimators.estimate("gae", inputs, HYPER, _options())
    ref_adv, ref_returns = advantages.gae(inputs.token_rewards, inputs.values, inputs.mask, 1.0, 1.0)
    np.testing.assert_array_equal(adv, ref_adv)
    np.testing.assert_array_equal(returns, ref_returns)
    np.testing.assert_allclose(adv[0, [1, 2, 4, 5]], [1.0954, 0.5477, -0.5477, -1.0954], atol=1e-4)
    np.testing.assert_array_equal(adv[1], np.zeros(6))
    assert metrics == {}


def test_gae_entry_with_bi_level_gae_is_bi_level_gae():
    # docs/rewards_and_objectives.md#bi-level-gae's worked example: returns 1.95 then 1.0.
    rewards = [[0, 0, 0, 0, 1, 0, 0, 0, 0, 1.0]]
    values = np.arange(1, 11, dtype=np.float32)[None] / 10
    inputs = _inputs(rewards, values, np.ones((1, 10)), 1, [True])
    adv, returns, metrics = estimators.estimate("gae", inputs, HYPER, _options(bi_level_gae=True))
    ref_adv, ref_returns = advantages.bi_level_gae(inputs.token_rewards, inputs.values, inputs.mask, 1.0, 1.0, 0.95)
    np.testing.assert_array_equal(adv, ref_adv)
    np.testing.assert_array_equal(returns, ref_returns)
    np.testing.assert_allclose(returns[0], [1.95] * 5 + [1.0] * 5, atol=1e-5)
    assert metrics == {}


# Three groups of four rows, T = 3: group 0 is docs/rewards_and_objectives.md#grpo-and-drgrpo's worked example, group 2
# is dropped by the filter. Each score sits on its row's last trained token; rows train 1 to 3 tokens.
SCORES = np.array([10.5, -1.0, 10.7, -1.0, 1.0, 0.0, 0.0, 0.0, 5.0, 5.0, 0.0, 0.0], np.float32)
LENGTHS = np.array([3, 1, 2, 3, 1, 2, 3, 3, 2, 1, 1, 3])
LOSS_MASK = (np.arange(3)[None] >= 3 - LENGTHS[:, None]).astype(np.float32)
GROUP_MASK = [True, True, False]


def _grpo_inputs():
    rewards = np.zeros((12, 3), np.float32)
    rewards[:, -1] = SCORES
    return _inputs(rewards, np.zeros((12, 3)), LOSS_MASK, 4, GROUP_MASK)


def test_grpo_entry_is_grpo_broadcast_over_the_kept_rows():
    inputs = _grpo_inputs()
    adv, returns, metrics = estimators.estimate("grpo", inputs, HYPER, _options())
    per_row = advantages.grpo(SCORES, inputs.group_ids, 3)
    np.testing.assert_array_equal(adv, per_row[:, None] * inputs.mask)
    np.testing.assert_array_equal(returns, adv)
    np.testing.assert_allclose(adv[:4, -1], [0.851, -0.866, 0.881, -0.866], atol=1e-3)
    np.testing.assert_array_equal(adv[8:], np.zeros((4, 3)))
    assert metrics == {}


def test_grpo_entry_with_length_weight_drgrpo_and_soft_reweighting():
    inputs = _grpo_inputs()
    options = _options(grpo_length_weight=True, norm_adv_by_std=False, soft_advantage_reweight=True)
    adv, returns, metrics = estimators.estimate("grpo", inputs, HYPER, options)
    per_row = advantages.grpo(SCORES, inputs.group_ids, 3, norm_by_std=False, lengths=LENGTHS.astype(np.float32),
                              row_mask=inputs.row_mask)
    std = filtering.group_stats(SCORES.reshape(3, 4))["std"]
    weights, ref_metrics = filtering.soft_advantage_weights(std, inputs.group_mask)
    np.testing.assert_array_equal(adv, (per_row * weights[inputs.group_ids])[:, None] * inputs.mask)
    np.testing.assert_array_equal(returns, adv)
    assert metrics.keys() == ref_metrics.keys() == {f"train/soft_reweight_{s}" for s in ("min", "max", "mean")}
    np.testing.assert_allclose(weights, [1.0, 0.5 / 6.6972, 0.0], atol=1e-4)  # std / max kept std

"""Presets (docs/rewards_and_objectives.md#presets, docs/filtering.md) applied to the locked base config, checked key by
key and validated."""
import pytest

from configs.base import get_config
from ragen_jax.algos.presets import ALGORITHM_PRESETS, kl_overrides, preset_config
from ragen_jax.config import ALGORITHMS, apply_overrides, validate

# docs/rewards_and_objectives.md#presets: adv_estimator, norm by std, loss_agg_mode (clip 0.2 / 0.28 and KL off for all)
TABLE = {
    "ppo": ("gae", None, "token-mean"),
    "dapo": ("gae", None, "token-mean"),
    "grpo": ("grpo", True, "seq-mean-token-mean"),
    "drgrpo": ("grpo", False, "seq-mean-token-sum"),
}


@pytest.mark.parametrize("name", ALGORITHMS)
def test_algorithm_presets_follow_spec_b8(name):
    config = validate(preset_config(get_config(), name, filter="paper"), num_devices=1)
    estimator, norm, agg = TABLE[name]
    assert (config.algo.name, config.algo.adv_estimator, config.algo.loss_agg_mode) == (name, estimator, agg)
    if norm is not None:
        assert config.algo.norm_adv_by_std is norm
    assert (config.algo.clip_ratio_low, config.algo.clip_ratio_high) == (0.2, 0.28)
    assert not config.algo.use_kl_loss and not config.algo.use_kl_in_reward
    assert config.algo.entropy_coeff == 0.001
    assert (config.filter.strategy, config.filter.top_p_mode, config.filter.value) == ("top_p", "softmax", 0.9)
    assert config.filter.include_zero and config.filter.metric == "reward_variance"


def test_presets_leave_the_input_untouched_and_cover_all_algorithms():
    base = get_config()
    preset_config(base, "grpo", filter="linear", kl="loss")
    assert base.algo.name == "ppo" and base.filter.value == 1.0
    assert set(ALGORITHM_PRESETS) == set(ALGORITHMS)


def test_kl_placements():
    loss = preset_config(get_config(), "ppo", kl="loss", kl_coef=0.01, kl_estimator="low-var-kl")
    assert loss.algo.use_kl_loss and loss.algo.kl_loss_coef == 0.01 and loss.algo.kl_loss_type == "low-var-kl"
    assert not loss.algo.use_kl_in_reward and loss.algo.kl_coef == 0.0
    reward = validate(preset_config(get_config(), "ppo", kl="reward", kl_coef=0.05), num_devices=1)
    assert reward.algo.use_kl_in_reward and reward.algo.kl_coef == 0.05 and reward.algo.kl_penalty == "kl"
    assert not reward.algo.use_kl_loss and reward.algo.kl_loss_coef == 0.0
    with pytest.raises(ValueError, match="both"):
        kl_overrides("both")


def test_unknown_names_fail_loudly():
    with pytest.raises(KeyError, match="algo.clip_ratio"):
        apply_overrides(get_config(), {"algo.clip_ratio": 0.3})
    with pytest.raises(ValueError, match="reinforce"):
        preset_config(get_config(), "reinforce")
    with pytest.raises(ValueError, match="strict"):
        preset_config(get_config(), "ppo", filter="strict")

"""The locked config schema, its RAGEN-2 defaults, and every validation error."""
import os

import jax
import ml_collections
import pytest

from configs import base
from ragen_jax import config as cfg

BASE_FILE = os.path.join(os.path.dirname(__file__), os.pardir, "configs", "base.py")
SCHEMA_FILE = os.path.join(os.path.dirname(__file__), os.pardir, "ragen_jax", "defaults.py")


@pytest.fixture
def config():
    return base.get_config()


def test_eight_fake_devices_are_visible():
    assert jax.device_count() == 8
    assert all(d.platform == "cpu" for d in jax.devices())


def test_defaults_are_ragen2(config):
    assert (config.rollout.num_groups, config.rollout.group_size) == (8, 16)
    assert (config.rollout.max_turn, config.rollout.max_actions_per_turn) == (5, 2)
    assert config.rollout.format_penalty == pytest.approx(-0.1)
    assert (config.algo.name, config.algo.adv_estimator, config.algo.gamma, config.algo.lam) == ("ppo", "gae", 1.0, 1.0)
    assert (config.algo.clip_ratio_low, config.algo.clip_ratio_high, config.algo.clip_ratio_c) == (0.2, 0.28, 3.0)
    assert config.algo.entropy_coeff == pytest.approx(0.001)
    assert not config.algo.use_kl_loss and config.algo.kl_loss_coef == 0.0
    assert (config.optim.actor_lr, config.optim.critic_lr) == (1e-6, 1e-5)
    f = config.filter
    assert (f.strategy, f.value, f.include_zero, f.top_p_mode, f.eps) == ("top_p", 1.0, True, "linear", 0.01)
    assert (config.diagnostics.collapse_every, config.diagnostics.num_samples) == (1, 64)
    assert set(config.keys()) == {
        "model", "tokenizer", "env", "rollout", "algo", "filter", "diagnostics", "optim", "train", "checkpoint",
        "logging", "mesh",
    }
    assert cfg.validate(config, num_devices=8) is config


def test_every_key_has_a_comment():
    """Each `c.key = value` line of the schema carries a one-line `#` comment."""
    with open(SCHEMA_FILE) as f:
        assignments = [line for line in f if line.strip().startswith("c.") and "=" in line]
    assert len(assignments) > 80
    missing = [line.strip() for line in assignments if "  # " not in line]
    assert not missing, missing


def test_config_is_locked(config):
    with pytest.raises(AttributeError):
        config.filtr = ml_collections.ConfigDict()
    with pytest.raises(AttributeError):
        config.filter.vaule = 0.9


def _set(config, key, value):
    section, name = key.split(".")
    config[section][name] = value


@pytest.mark.parametrize(
    "key,value",
    [
        ("algo.name", "reinforce"),
        ("algo.adv_estimator", "rloo"),
        ("filter.strategy", "top_q"),
        ("filter.metric", "reward_std_dev"),
        ("filter.top_p_mode", "cubic"),
        ("filter.type", "biggest"),
        ("filter.loss_scaling", "log"),
        ("algo.kl_loss_type", "k4"),
        ("algo.kl_penalty", "forward"),
        ("algo.loss_agg_mode", "token-sum"),
        ("tokenizer.chat_format", "alpaca"),
        ("model.compute_dtype", "float16"),
        ("model.arch", "mamba"),
    ],
)
def test_unknown_names(config, key, value):
    _set(config, key, value)
    with pytest.raises(cfg.ConfigError, match=f"config.{key}") as err:
        cfg.validate(config, num_devices=8)
    assert repr(value) in str(err.value) and "allowed values" in str(err.value)


@pytest.mark.parametrize(
    "strategy,value,ok",
    [
        ("top_p", 0.0, False), ("top_p", 1.01, False), ("top_p", 1.0, True), ("top_p", 0.9, True),
        ("top_k", 0.0, False), ("top_k", 1.5, False), ("top_k", 0.25, True),
        ("top_k_abs", 0.5, False), ("top_k_abs", 3.0, True), ("top_k_abs", 12.0, True),
        ("min_p", 0.0, False), ("min_p", 2.0, False), ("min_p", 0.5, True),
    ],
)
def test_filter_value_range_per_strategy(config, strategy, value, ok):
    config.filter.strategy, config.filter.value = strategy, value
    if ok:
        cfg.validate(config, num_devices=8)
    else:
        with pytest.raises(cfg.ConfigError, match="config.filter.value") as err:
            cfg.validate(config, num_devices=8)
        assert strategy in str(err.value)


@pytest.mark.parametrize(
    "key", ["algo.entropy_coeff", "algo.kl_loss_coef", "algo.kl_coef", "optim.actor_lr", "optim.critic_lr", "train.sft_lr"]
)
def test_negative_coefficients_and_learning_rates(config, key):
    _set(config, key, -1e-3)
    with pytest.raises(cfg.ConfigError, match=f"config.{key} = -0.001"):
        cfg.validate(config, num_devices=8)


@pytest.mark.parametrize("metric", ["reward_variance", "entropy_variance"])
def test_group_size_one_with_variance_metric(config, metric):
    config.rollout.group_size, config.filter.metric = 1, metric
    config.algo.ppo_mini_batch_size = 8
    with pytest.raises(cfg.ConfigError, match="config.rollout.group_size = 1") as err:
        cfg.validate(config, num_devices=8)
    assert metric in str(err.value)
    config.filter.metric = "reward"
    cfg.validate(config, num_devices=8)


def test_group_size_one_with_grpo(config):
    config.rollout.group_size, config.filter.metric, config.algo.ppo_mini_batch_size = 1, "reward", 8
    config.algo.adv_estimator = "grpo"
    with pytest.raises(cfg.ConfigError, match="config.rollout.group_size = 1.*grpo"):
        cfg.validate(config, num_devices=8)


def test_batch_not_divisible_by_batch_axes(config):
    config.rollout.num_groups, config.rollout.group_size, config.algo.ppo_mini_batch_size = 3, 2, 2
    with pytest.raises(cfg.ConfigError, match=r"config.rollout.num_groups = 3.*data \* fsdp axes \(8\)"):
        cfg.validate(config, num_devices=8)
    cfg.validate(config, num_devices=2)  # 6 rows over a data axis of 2 is fine
    config.mesh.data, config.mesh.fsdp = 1, 2  # fsdp splits the batch too: 6 rows over 1 * 2
    cfg.validate(config, num_devices=8)
    config.mesh.data, config.mesh.fsdp = 2, 2
    with pytest.raises(cfg.ConfigError, match=r"data \* fsdp axes \(4\)"):
        cfg.validate(config, num_devices=8)


def test_mesh_may_use_a_subset_of_the_devices_but_not_more(config):
    config.mesh.data = 4
    cfg.validate(config, num_devices=8)  # the mesh spans the first 4 devices
    config.mesh.data, config.mesh.fsdp = 4, 4
    with pytest.raises(cfg.ConfigError, match="config.mesh.data = 4.*at most the 8 devices"):
        cfg.validate(config, num_devices=8)
    config.mesh.data, config.mesh.fsdp = 0, 1
    with pytest.raises(cfg.ConfigError, match="config.mesh.data = 0"):
        cfg.validate(config, num_devices=8)


@pytest.mark.parametrize("key", ["rollout.max_turn", "rollout.max_actions_per_turn"])
def test_turn_and_action_limits(config, key):
    _set(config, key, 0)
    with pytest.raises(cfg.ConfigError, match=f"config.{key} = 0 is invalid: must be >= 1"):
        cfg.validate(config, num_devices=8)


@pytest.mark.parametrize("key", ["checkpoint.save_freq", "checkpoint.max_to_keep", "logging.every",
                                 "diagnostics.grad_analysis_num_buckets"])
def test_frequencies_and_counts_below_one_are_refused(config, key):
    _set(config, key, 0)
    with pytest.raises(cfg.ConfigError, match=f"config.{key} = 0 is invalid: must be >= 1"):
        cfg.validate(config, num_devices=8)


@pytest.mark.parametrize("key", ["train.total_steps", "train.test_freq", "train.sft_steps",
                                 "diagnostics.collapse_every", "diagnostics.grad_analysis_every",
                                 "diagnostics.grad_analysis_num_groups", "diagnostics.grad_analysis_group_size"])
def test_negative_schedules_are_refused_zero_means_off(config, key):
    _set(config, key, 0)
    cfg.validate(config, num_devices=8)
    _set(config, key, -1)
    with pytest.raises(cfg.ConfigError, match=f"config.{key} = -1 is invalid: must be >= 0"):
        cfg.validate(config, num_devices=8)


@pytest.mark.parametrize("key", ["optim.actor_lr", "algo.entropy_coeff", "rollout.temperature"])
def test_infinite_coefficients_are_refused(config, key):
    _set(config, key, float("inf"))
    with pytest.raises(cfg.ConfigError, match=f"config.{key} = inf is invalid: must be finite"):
        cfg.validate(config, num_devices=8)


def test_gradient_analysis_groups_need_two_rollouts(config):
    config.diagnostics.grad_analysis_group_size = 1
    with pytest.raises(cfg.ConfigError, match="grad_analysis_group_size = 1 .*at least 2 rollouts"):
        cfg.validate(config, num_devices=8)


def test_command_line_overrides():
    config = cfg.load(["prog", f"--config={BASE_FILE}", "--config.filter.value=0.9", "--config.algo.name=grpo"])
    assert config.filter.value == 0.9 and config.algo.name == "grpo"


def test_command_line_typo_fails_because_the_config_is_locked():
    with pytest.raises(Exception, match="filtr"):
        cfg.load(["prog", f"--config={BASE_FILE}", "--config.filtr.value=0.9"])


def test_command_line_override_is_validated():
    with pytest.raises(cfg.ConfigError, match="config.filter.strategy = 'top_q'"):
        cfg.load(["prog", f"--config={BASE_FILE}", "--config.filter.strategy=top_q"])


@pytest.mark.parametrize("micro,ok", [(0, True), (8, True), (32, True), (5, False), (-1, False)])
def test_micro_batch_must_divide_the_minibatch(config, micro, ok):
    config.algo.ppo_micro_batch_size = micro
    if ok:
        cfg.validate(config, num_devices=8)
    else:
        with pytest.raises(cfg.ConfigError, match=f"config.algo.ppo_micro_batch_size = {micro}"):
            cfg.validate(config, num_devices=8)

"""The filter-metric, filter-strategy and loss-aggregation registries: validation allows exactly the registered
names, and a metric registered outside config.py (here, temporarily) is validated, scored and named by its quantity."""
import subprocess
import sys

import jax.numpy as jnp
import numpy as np
import pytest

from configs import base
from ragen_jax import config as cfg
from ragen_jax import filtering
from ragen_jax.algos import losses


def _allowed(key, value, **overrides):
    config = base.get_config()
    for name, v in {key: value, **overrides}.items():
        section, field = name.split(".")
        config[section][field] = v
    with pytest.raises(cfg.ConfigError) as error:
        cfg.validate(config, num_devices=8)
    return error.value


@pytest.mark.parametrize("key, registry", [
    ("filter.metric", filtering.FILTER_METRICS),
    ("filter.strategy", filtering.FILTER_STRATEGIES),
    ("algo.loss_agg_mode", losses.LOSS_AGG_MODES),
])
def test_validation_allows_exactly_the_registered_names(key, registry):
    assert registry is {"filter.metric": cfg.FILTER_METRICS, "filter.strategy": cfg.FILTER_STRATEGIES,
                        "algo.loss_agg_mode": cfg.LOSS_AGG_MODES}[key]
    error = _allowed(key, "no_such_choice")
    assert error.key == key
    assert error.allowed == "allowed values are " + ", ".join(repr(name) for name in registry)
    assert len(registry) >= 4


def test_a_registered_metric_is_selectable_and_validated_then_removed():
    @filtering.register_filter_metric("reward_range", quantity="reward", min_group_size=2)
    def reward_range(values):
        return values.max(1) - values.min(1)

    try:
        config = base.get_config()
        config.filter.metric = "reward_range"
        assert cfg.validate(config, num_devices=8) is config
        error = _allowed("filter.metric", "reward_range", **{"rollout.group_size": 1})
        assert (error.key, error.allowed) == ("rollout.group_size", "filter.metric='reward_range' needs a group_size >= 2")

        values = jnp.asarray(np.array([[1.0, 0.0, 3.0], [2.0, 2.0, 2.0], [0.0, 5.0, 1.0]], np.float32))
        np.testing.assert_allclose(filtering.group_scores(values, "reward_range"), [3.0, 0.0, 5.0])
        kept = filtering.apply_filter(values, "reward_range", "top_k_abs", 1.0)
        np.testing.assert_array_equal(kept.group_mask, [False, False, True])
        assert "rollout/in_group_reward_sum" in kept.metrics  # named by its quantity
        with pytest.raises(ValueError, match="already registered"):
            filtering.register_filter_metric("reward_range", quantity="reward")(reward_range)
    finally:
        filtering.FILTER_METRICS.unregister("reward_range")
    assert "reward_range" not in cfg.FILTER_METRICS
    assert _allowed("filter.metric", "reward_range").key == "filter.metric"
    with pytest.raises(ValueError, match="quantity"):
        filtering.register_filter_metric("reward_range", quantity="tokens")


def test_importing_the_config_stays_light():
    code = "import sys, ragen_jax.config; assert 'jax' not in sys.modules, 'config imported jax'"
    subprocess.run([sys.executable, "-c", code], check=True)

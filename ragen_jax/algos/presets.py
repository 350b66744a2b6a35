"""Algorithm, filter and KL presets as overrides of the `ragen_jax/defaults.py` schema
(docs/rewards_and_objectives.md#presets).

A preset is a flat dict `{"algo.x": value, "filter.y": value}`; `config.apply_overrides` sets those keys on a
copy of a (locked) config, so a key that does not exist fails loudly. `preset_config` combines an
algorithm preset with a filter preset and a KL placement.

The algorithm presets are RAGEN's main-table scripts (run_main_table_diff_algo.sh): every algorithm keeps
the base clip-higher (0.2 / 0.28), entropy 0.001 and KL loss off (its coefficient 0.001 is set but
unused). PPO and DAPO differ in no effective setting there (docs/differences.md#ppo-and-dapo); both are kept for naming
parity.
"""
from __future__ import annotations

from typing import Any

import ml_collections

from ragen_jax.config import ADV_ESTIMATORS, KL_ESTIMATORS, apply_overrides, check_choice

_COMMON = {
    "algo.clip_ratio_low": 0.2,
    "algo.clip_ratio_high": 0.28,
    "algo.entropy_coeff": 0.001,
    "algo.use_kl_loss": False,
    "algo.kl_loss_coef": 0.001,
    "algo.use_kl_in_reward": False,
}

ALGORITHM_PRESETS: dict[str, dict[str, Any]] = {
    "ppo": {**_COMMON, "algo.name": "ppo", "algo.adv_estimator": "gae", "algo.loss_agg_mode": "token-mean"},
    "dapo": {**_COMMON, "algo.name": "dapo", "algo.adv_estimator": "gae", "algo.loss_agg_mode": "token-mean"},
    "grpo": {
        **_COMMON, "algo.name": "grpo", "algo.adv_estimator": "grpo", "algo.norm_adv_by_std": True,
        "algo.loss_agg_mode": "seq-mean-token-mean",
    },
    "drgrpo": {
        **_COMMON, "algo.name": "drgrpo", "algo.adv_estimator": "grpo", "algo.norm_adv_by_std": False,
        "algo.loss_agg_mode": "seq-mean-token-sum",
    },
}

_PAPER_FILTER = {
    "filter.strategy": "top_p",
    "filter.top_p_mode": "softmax",
    "filter.type": "largest",
    "filter.metric": "reward_variance",
    "filter.include_zero": True,
    "filter.loss_scaling": "none",
}

FILTER_PRESETS: dict[str, dict[str, Any]] = {
    # Main table (docs/filtering.md#settings-used-in-the-paper): softmax top-p 0.9 with zero-variance groups allowed,
    # vs. 1.0 ("nofilter").
    "paper": {**_PAPER_FILTER, "filter.value": 0.9},
    "none": {**_PAPER_FILTER, "filter.value": 1.0},
    # The repository's recommendation (guide_rollout_filtering.md) and the gradient-analysis runs.
    "linear": {**_PAPER_FILTER, "filter.top_p_mode": "linear", "filter.include_zero": False, "filter.value": 0.9,
               "filter.eps": 0.01},
}

KL_PLACEMENTS = ("off", "loss", "reward")


def kl_overrides(placement: str, coef: float = 0.001, estimator: str = "kl") -> dict[str, Any]:
    """KL against the reference policy as a loss term, as a reward penalty, or off
    (docs/rewards_and_objectives.md#kl-estimators-and-placements).

    Args:
      placement: "off", "loss" (`use_kl_loss`, `kl_loss_coef`, `kl_loss_type`) or "reward"
        (`use_kl_in_reward`, `kl_coef`, `kl_penalty`).
      coef: the coefficient; estimator: a `KL_ESTIMATORS` name (default "kl" = k1, what RAGEN's sweeps run).
    """
    if placement not in KL_PLACEMENTS:
        raise ValueError(f"kl placement {placement!r} is invalid: allowed values are {KL_PLACEMENTS}")
    # the estimator sets kl_loss_type and kl_penalty: this is the error `validate` would raise, naming the first
    check_choice("algo.kl_loss_type", estimator, KL_ESTIMATORS)
    loss, reward = placement == "loss", placement == "reward"
    return {
        "algo.use_kl_loss": loss,
        "algo.kl_loss_coef": coef if loss else 0.0,
        "algo.kl_loss_type": estimator,
        "algo.use_kl_in_reward": reward,
        "algo.kl_coef": coef if reward else 0.0,
        "algo.kl_penalty": estimator,
    }


def preset_config(
    config: ml_collections.ConfigDict,
    algorithm: str,
    filter: str | None = None,
    kl: str | None = None,
    kl_coef: float = 0.001,
    kl_estimator: str = "kl",
) -> ml_collections.ConfigDict:
    """`config` with an algorithm preset, optionally a filter preset and a KL placement.

    Args:
      config: a config from `configs.base.get_config()` (or a task config).
      algorithm: one of ALGORITHMS ("ppo", "dapo", "grpo", "drgrpo").
      filter: None (keep the config's filter), or a FILTER_PRESETS name ("paper", "none", "linear").
      kl: None (the preset's: off), or a KL_PLACEMENTS name, with `kl_coef` and `kl_estimator`.
    """
    check_choice("algo.name", algorithm, ALGORITHM_PRESETS)
    overrides = dict(ALGORITHM_PRESETS[algorithm])
    if filter is not None:
        if filter not in FILTER_PRESETS:
            raise ValueError(f"filter preset {filter!r} is invalid: allowed values are {tuple(FILTER_PRESETS)}")
        overrides.update(FILTER_PRESETS[filter])
    if kl is not None:
        overrides.update(kl_overrides(kl, kl_coef, kl_estimator))
    return apply_overrides(config, overrides)


def uses_critic(config) -> bool:
    """Whether the training step trains a critic: the advantage estimator reads values (its registered
    `uses_critic`: GAE's)."""
    return ADV_ESTIMATORS[config.algo.adv_estimator].uses_critic


def uses_reference(config) -> bool:
    """Whether the training step keeps a reference policy: a KL loss or a KL reward penalty."""
    return bool(config.algo.use_kl_loss or config.algo.use_kl_in_reward)

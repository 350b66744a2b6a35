"""The step's traced values: one table, `TRACED`, maps each config key whose value the compiled step takes as an
array to its place in `Hyper`. `Hyper.from_config` builds from that table, so a new value of such a key never
recompiles; `SWEEPABLE`, the keys a vectorised sweep may vary, derives from it (a static key would give every member
the same program and so the same results).

    hyper = Hyper.from_config(config, env_params)   # f32 / bool scalars, the env's params pytree
"""
from __future__ import annotations

from typing import Any

import flax.struct
import jax
import jax.numpy as jnp

from ragen_jax.algos.estimators import AdvantageHyper
from ragen_jax.algos.update_inputs import ActorHyper, CriticHyper

# config key -> its place in Hyper ("group.field" inside a NamedTuple group, else a field of Hyper itself)
TRACED = {
    "optim.actor_lr": "actor.lr",
    "algo.clip_ratio_low": "actor.clip_ratio_low",
    "algo.clip_ratio_high": "actor.clip_ratio_high",
    "algo.clip_ratio_c": "actor.clip_ratio_c",
    "algo.entropy_coeff": "actor.entropy_coeff",
    "algo.kl_loss_coef": "actor.kl_loss_coef",
    "rollout.temperature": "actor.temperature",
    "optim.critic_lr": "critic.lr",
    "algo.value_clip": "critic.value_clip",
    "algo.gamma": "advantage.gamma",
    "algo.lam": "advantage.lam",
    "algo.high_level_gamma": "advantage.high_level_gamma",
    "rollout.top_p": "top_p",
    "filter.value": "filter_value",
    "filter.eps": "filter_eps",
    "filter.include_zero": "filter_include_zero",
    "algo.kl_coef": "kl_coef",
    "algo.zero_task_advantage": "zero_task_advantage",
}
GROUPS = {"actor": ActorHyper, "critic": CriticHyper, "advantage": AdvantageHyper}
TRACED_ENV = ("env.success_rate",)  # traced inside the env's params (`train.build.build_env`)
# read on the host per member (docs/filtering.md#early-stops), not by the compiled step
HOST_RULES = ("filter.empty_stop_steps", "filter.rv_collapse_window", "filter.rv_collapse_ratio",
              "filter.val_success_floor", "filter.val_success_patience")
SWEEPABLE = (*TRACED, *TRACED_ENV, "train.seed", *HOST_RULES)


@flax.struct.dataclass
class Hyper:
    """Traced hyperparameters of a step (f32 scalars; bool[] where the config key is a bool), plus the env's params
    pytree. Which config key fills which field: `TRACED`."""

    actor: ActorHyper
    critic: CriticHyper
    advantage: AdvantageHyper
    top_p: jax.Array
    filter_value: jax.Array
    filter_eps: jax.Array
    filter_include_zero: jax.Array  # bool[]: zero-score groups stay candidates of the filter
    kl_coef: jax.Array  # beta of the KL reward penalty (algo.use_kl_in_reward)
    zero_task_advantage: jax.Array  # bool[]: every advantage 0, the regulariser-only ablation
    env: Any

    @classmethod
    def from_config(cls, config, env_params) -> "Hyper":
        groups: dict[str, dict[str, jax.Array]] = {name: {} for name in GROUPS}
        fields: dict[str, jax.Array] = {}
        for key, place in TRACED.items():
            section, name = key.split(".")
            value = config[section][name]
            leaf = jnp.bool_(value) if isinstance(value, bool) else jnp.float32(value)
            group, _, field = place.rpartition(".")
            (groups[group] if group else fields)[field] = leaf
        return cls(**{name: GROUPS[name](**values) for name, values in groups.items()}, **fields, env=env_params)

"""The advantage estimators, a registry of `algo.adv_estimator` choices
(docs/rewards_and_objectives.md#advantage-estimators).

The registry (`ADV_ESTIMATORS`) is declared in `ragen_jax.config`, so validation reads its names; the entries live
here, each wrapping the pure functions of `algos/advantages.py`. A new estimator is ONE function in this file,
`fn(inputs: AdvantageInputs, hyper: AdvantageHyper, options: AdvantageOptions) -> (advantages f32[B, T],
returns f32[B, T], metrics: dict of f32 scalars)`, under `@register_adv_estimator(name, uses_critic=...,
min_group_size=...)`. Nothing else changes: config validation, whether a critic is trained (`presets.uses_critic`)
and the training step (`estimate`) read the registry. What every estimator's output goes through afterwards (filter
loss scaling, `algo.zero_task_advantage`, the advantage metrics) stays in the step.

The choice is static (looked up in Python when the step is traced); the arrays and the hyper values may be traced.
"""
from __future__ import annotations

import dataclasses
from typing import Callable, NamedTuple

import jax

from ragen_jax import filtering
from ragen_jax.algos import advantages
from ragen_jax.config import ADV_ESTIMATORS


class AdvantageInputs(NamedTuple):
    """What an estimator may read, for B = N * G rows of N groups (rows group-contiguous) and T token positions.

    token_rewards: f32[B, T], the episode score on each row's last trained token (minus beta * KL with the KL
      reward penalty). values: f32[B, T], the critic's values (zeros unless the estimator `uses_critic`).
    loss_mask: f32[B, T] 0/1, the trained tokens of every row; mask: f32[B, T], `loss_mask` on the filter's kept
      rows only (zero on dropped rows). group_ids: i32[B] in [0, N). row_mask: bool[B] kept rows; group_mask:
      bool[N] kept groups (its static length is N).
    """

    token_rewards: jax.Array
    values: jax.Array
    loss_mask: jax.Array
    mask: jax.Array
    group_ids: jax.Array
    row_mask: jax.Array
    group_mask: jax.Array


class AdvantageHyper(NamedTuple):
    """The estimators' traced hyper values, f32 scalars: `algo.gamma`, `algo.lam`, `algo.high_level_gamma`."""

    gamma: jax.Array
    lam: jax.Array
    high_level_gamma: jax.Array


@dataclasses.dataclass(frozen=True)
class AdvantageOptions:
    """The estimators' static switches, the `algo.*` keys of the same name (a new value recompiles)."""

    bi_level_gae: bool
    grpo_length_weight: bool
    norm_adv_by_std: bool
    soft_advantage_reweight: bool

    @classmethod
    def from_config(cls, config) -> "AdvantageOptions":
        a = config.algo
        return cls(bi_level_gae=a.bi_level_gae, grpo_length_weight=a.grpo_length_weight,
                   norm_adv_by_std=a.norm_adv_by_std, soft_advantage_reweight=a.soft_advantage_reweight)


def register_adv_estimator(name: str, uses_critic: bool, min_group_size: int = 1) -> Callable[[Callable], Callable]:
    """Decorator registering `fn(inputs, hyper, options) -> (advantages, returns, metrics)` as `algo.adv_estimator`
    `name`.

    uses_critic: the estimator reads `inputs.values`, so the step trains a critic and computes them.
    min_group_size: the smallest rollout.group_size it means something for (2 for group-relative estimators).
    """
    return ADV_ESTIMATORS.register(name, uses_critic=uses_critic, min_group_size=min_group_size)


@register_adv_estimator("gae", uses_critic=True)
def _gae(inputs: AdvantageInputs, hyper: AdvantageHyper, options: AdvantageOptions):
    """`advantages.gae` (or, with `bi_level_gae`, `advantages.bi_level_gae`) of the critic's values over the kept
    rows' trained tokens, whitened; returns A + V before whitening; no metrics."""
    if options.bi_level_gae:
        adv, returns = advantages.bi_level_gae(inputs.token_rewards, inputs.values, inputs.mask, hyper.gamma,
                                               hyper.lam, hyper.high_level_gamma)
    else:
        adv, returns = advantages.gae(inputs.token_rewards, inputs.values, inputs.mask, hyper.gamma, hyper.lam)
    return adv, returns, {}


@register_adv_estimator("grpo", uses_critic=False, min_group_size=2)
def _grpo(inputs: AdvantageInputs, hyper: AdvantageHyper, options: AdvantageOptions):
    """`advantages.grpo` of the row scores (sums of the token rewards), Dr.GRPO without `norm_adv_by_std`, divided
    by the relative length with `grpo_length_weight`, then (`soft_advantage_reweight`) scaled by the group's soft
    weight (docs/filtering.md#loss-scaling-and-soft-reweighting: it needs the per-group std, hence GRPO only);
    broadcast over the kept rows' trained tokens. Returns equal the advantages; metrics: the soft weights'."""
    del hyper
    num_groups = inputs.group_mask.shape[0]
    lengths = inputs.loss_mask.sum(axis=1) if options.grpo_length_weight else None
    row_scores = inputs.token_rewards.sum(axis=1)
    per_row = advantages.grpo(row_scores, inputs.group_ids, num_groups, options.norm_adv_by_std, lengths=lengths,
                              row_mask=inputs.row_mask)
    metrics = {}
    if options.soft_advantage_reweight:
        group_std = filtering.group_stats(row_scores.reshape(num_groups, -1))["std"]
        weights, metrics = filtering.soft_advantage_weights(group_std, inputs.group_mask)
        per_row = per_row * weights[inputs.group_ids]
    adv = per_row[:, None] * inputs.mask
    return adv, adv, metrics


def estimate(name: str, inputs: AdvantageInputs, hyper: AdvantageHyper, options: AdvantageOptions
             ) -> tuple[jax.Array, jax.Array, dict[str, jax.Array]]:
    """(advantages f32[B, T], returns f32[B, T], metrics) of the `ADV_ESTIMATORS` entry `name` (static)."""
    return ADV_ESTIMATORS.entry(name).fn(inputs, hyper, options)

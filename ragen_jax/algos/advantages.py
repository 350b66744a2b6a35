"""Advantage estimators of StarPO: GAE, bi-level GAE, GRPO / Dr.GRPO (docs/rewards_and_objectives.md).

All functions are pure, jittable and shape-static. Token arrays are `[B, T]` float32 aligned with
the `(B, L-1)` layout (docs/prompts_and_parsing.md#token-layout-and-the-loss-mask): position t scores the prediction of
token t+1. `mask` is the loss mask (1 on trained assistant tokens); rows of groups dropped by the filter must already be
zero in it, so they neither enter the whitening statistics nor receive advantages.

Discount factors and coefficients may be traced arrays (they are swept), nothing else is.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from ragen_jax.algos.losses import kl_penalty

WHITEN_EPS = 1e-8  # verl masked_whiten


def masked_whiten(values: jax.Array, mask: jax.Array, eps: float = WHITEN_EPS) -> jax.Array:
    """`(x - mean) / sqrt(var + eps)` with mean and UNBIASED variance over all masked entries.

    Args:
      values: f32[...]; mask: same shape, 1 where the entry counts.
    Returns:
      f32[...], zero where `mask` is 0. verl raises for fewer than two masked entries; here the
      Bessel factor falls back to 1 so one masked token whitens to 0 and an empty mask to all zeros.
    """
    mask = mask.astype(jnp.float32)
    count = mask.sum()
    mean = (values * mask).sum() / (count + 1e-8)
    var = (jnp.square(values - mean) * mask).sum() / (count + 1e-8)
    var = var * jnp.where(count > 1, count / jnp.maximum(count - 1, 1.0), 1.0)
    return (values - mean) * jax.lax.rsqrt(var + eps) * mask


def _reverse_scan_rows(step, carry, xs):
    """Runs `step` backwards over the time axis of `[B, T]` arrays (scanned as `[T, B]`)."""
    xs_t = jax.tree.map(lambda x: jnp.swapaxes(x, 0, 1), xs)
    _, ys = jax.lax.scan(step, carry, xs_t, reverse=True)
    return jax.tree.map(lambda y: jnp.swapaxes(y, 0, 1), ys)


def gae(
    rewards: jax.Array,
    values: jax.Array,
    mask: jax.Array,
    gamma: float | jax.Array,
    lam: float | jax.Array,
    whiten: bool = True,
) -> tuple[jax.Array, jax.Array]:
    """Generalised advantage estimation over the loss tokens (verl `compute_gae_advantage_return`).

    Tokens outside `mask` (observations, padding) neither bootstrap nor accumulate: the backward
    recursion carries the next masked token's value and GAE across them (docs/rewards_and_objectives.md#gae).

    Args:
      rewards, values, mask: f32[B, T].
      gamma, lam: discount and GAE lambda (scalars, may be traced).
      whiten: masked whitening (unbiased variance over all masked tokens of the batch).
    Returns:
      (advantages, returns), both f32[B, T]; returns = raw advantages + values, computed BEFORE
      whitening. Advantages are zero outside `mask` when whitened.
    """
    rewards, values, mask = (jnp.asarray(x, jnp.float32) for x in (rewards, values, mask))
    gamma, lam = jnp.float32(gamma), jnp.float32(lam)

    def step(carry, x):
        next_value, last_gae = carry
        r, v, m = x
        delta = r + gamma * next_value - v
        g = delta + gamma * lam * last_gae
        next_value = v * m + (1.0 - m) * next_value
        last_gae = g * m + (1.0 - m) * last_gae
        return (next_value, last_gae), last_gae

    zeros = jnp.zeros(rewards.shape[0], jnp.float32)
    advantages = _reverse_scan_rows(step, (zeros, zeros), (rewards, values, mask))
    returns = advantages + values
    if whiten:
        advantages = masked_whiten(advantages, mask)
    return advantages, returns


def bi_level_gae(
    rewards: jax.Array,
    values: jax.Array,
    mask: jax.Array,
    gamma: float | jax.Array,
    lam: float | jax.Array,
    high_level_gamma: float | jax.Array,
    whiten: bool = True,
) -> tuple[jax.Array, jax.Array]:
    """Turn-level + token-level GAE (RAGEN `compute_bi_level_gae_advantage_return`,
    docs/rewards_and_objectives.md#bi-level-gae).

    "eos" tokens are those with a non-zero reward. High level: GAE over the eos tokens with
    `high_level_gamma` and `lam`; each eos reward becomes its turn return A + V. Low level: GAE over
    the masked tokens with `gamma`, `lam`, restarting (bootstrap 0, running GAE 0) at every eos token.

    Deliberate difference (docs/differences.md#bi-level-gae): RAGEN indexes past the end when the last masked
    token is not an eos token (e.g. an episode with zero total reward) and crashes; here that token
    bootstraps from 0, i.e. behaves like the end of the episode.

    Args:
      rewards, values, mask: f32[B, T]; gamma, lam, high_level_gamma: scalars (may be traced).
      whiten: masked whitening of the advantages, as in `gae`.
    Returns:
      (advantages, returns) f32[B, T]. Returns are A + V on masked tokens and on eos tokens, 0 elsewhere.
    """
    rewards, values, mask = (jnp.asarray(x, jnp.float32) for x in (rewards, values, mask))
    gamma, lam, gamma_high = jnp.float32(gamma), jnp.float32(lam), jnp.float32(high_level_gamma)
    is_eos = rewards != 0

    def step(carry, x):
        next_eos_value, high_gae, next_value, low_gae = carry
        r, v, m, e = x
        # High level (only moves on eos tokens).
        high_delta = r + gamma_high * next_eos_value - v
        high_new = high_delta + gamma_high * lam * high_gae
        high_gae = jnp.where(e, high_new, high_gae)
        next_eos_value = jnp.where(e, v, next_eos_value)
        reward = jnp.where(e, high_new + v, r)
        # Low level (only moves on masked tokens; an eos token restarts it).
        bootstrap = jnp.where(e, 0.0, next_value)
        running = jnp.where(e, 0.0, low_gae)
        low_new = reward - v + gamma * bootstrap + gamma * lam * running
        on = m > 0
        low_gae = jnp.where(on, low_new, low_gae)
        next_value = jnp.where(on, v, next_value)
        advantage = jnp.where(on, low_new, jnp.where(e, high_new, 0.0))
        ret = jnp.where(on | e, advantage + v, 0.0)
        return (next_eos_value, high_gae, next_value, low_gae), (advantage, ret)

    zeros = jnp.zeros(rewards.shape[0], jnp.float32)
    advantages, returns = _reverse_scan_rows(step, (zeros,) * 4, (rewards, values, mask, is_eos))
    if whiten:
        advantages = masked_whiten(advantages, mask)
    return advantages, returns


def grpo(
    scores: jax.Array,
    group_ids: jax.Array,
    num_groups: int,
    norm_by_std: bool = True,
    eps: float = 1e-6,
    lengths: jax.Array | None = None,
    row_mask: jax.Array | None = None,
) -> jax.Array:
    """GRPO (and, with `norm_by_std=False`, Dr.GRPO) outcome advantages per sample
    (docs/rewards_and_objectives.md#grpo-and-drgrpo).

    A_i = (s_i - mean_g) / (std_g + eps) with the UNBIASED std of the sample's group; a group of one
    sample has mean 0 and std 1 (RAGEN `compute_grpo_outcome_advantage`). Multiply the result by the
    loss mask to broadcast it over the sample's tokens; GRPO returns equal the advantages.

    Args:
      scores: f32[B], the episode score of each sample (sum of its token-level rewards).
      group_ids: int[B] in [0, num_groups).
      num_groups: static number of groups.
      norm_by_std: divide by the group std (GRPO) or not (Dr.GRPO).
      eps: added to the std.
      lengths: optional f32[B] response token counts: `grpo_advantage_length_weight`,
        A_i <- A_i / ((len_i + 1e-6) / mean_j len_j).
      row_mask: optional bool[B] of rows that are in the (filtered) batch; the mean length is over
        them (RAGEN's batch holds only kept rows). Group statistics need no mask: filtering keeps or
        drops whole groups.
    Returns:
      f32[B] advantages.
    """
    scores = jnp.asarray(scores, jnp.float32)
    count = jax.ops.segment_sum(jnp.ones_like(scores), group_ids, num_groups)
    total = jax.ops.segment_sum(scores, group_ids, num_groups)
    mean = total / jnp.maximum(count, 1.0)
    sq_dev = jax.ops.segment_sum(jnp.square(scores - mean[group_ids]), group_ids, num_groups)
    std = jnp.sqrt(sq_dev / jnp.maximum(count - 1.0, 1.0))
    single = count <= 1
    mean, std = jnp.where(single, 0.0, mean), jnp.where(single, 1.0, std)
    advantages = scores - mean[group_ids]
    if norm_by_std:
        advantages = advantages / (std[group_ids] + eps)
    if lengths is not None:
        lengths = jnp.asarray(lengths, jnp.float32)
        rows = jnp.ones_like(lengths) if row_mask is None else jnp.asarray(row_mask, jnp.float32)
        mean_length = (lengths * rows).sum() / jnp.maximum(rows.sum(), 1.0)
        advantages = advantages / ((lengths + 1e-6) / mean_length)
    return advantages


def kl_in_reward(
    token_rewards: jax.Array,
    logp: jax.Array,
    ref_logp: jax.Array,
    mask: jax.Array,
    beta: float | jax.Array,
    kind: str = "kl",
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """KL as a reward penalty (verl `apply_kl_penalty` with a fixed controller,
    docs/rewards_and_objectives.md#kl-estimators-and-placements).

    r_t <- r_t - beta * kl_t * mask_t, with `kl_t = kl_penalty(old_logp, ref_logp, kind)`.

    Args:
      token_rewards, logp (the recomputed old log-probs), ref_logp, mask: f32[B, T].
      beta: the fixed coefficient `algo.kl_coef` (may be traced); kind: a `KL_ESTIMATORS` name.
    Returns:
      (rewards f32[B, T], metrics) with `actor/reward_kl_penalty` (batch mean of per-row token-mean
      KL over rows that hold loss tokens) and `actor/reward_kl_penalty_coeff`.
    """
    mask = jnp.asarray(mask, jnp.float32)
    kl = kl_penalty(logp, ref_logp, kind) * mask
    per_row = kl.sum(-1) / (mask.sum(-1) + 1e-8)
    rows = (mask.sum(-1) > 0).astype(jnp.float32)
    metrics = {
        "actor/reward_kl_penalty": (per_row * rows).sum() / jnp.maximum(rows.sum(), 1.0),
        "actor/reward_kl_penalty_coeff": jnp.float32(beta),
    }
    return token_rewards - beta * kl, metrics

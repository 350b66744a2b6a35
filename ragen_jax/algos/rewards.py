"""Episode rewards -> token-level rewards (docs/rewards_and_objectives.md, episode and token rewards).

RAGEN adds the format penalties to the episode reward, normalises it within each prompt group
(`agent_proxy.reward_normalization`, grouping "state") and places it on the last token of the sequence.
Here the sequence's trained tokens are the sampled ones, so the reward sits on the last sampled target.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from ragen_jax.config import REWARD_NORMALIZATIONS, check_choice

NORM_EPS = 1e-6
ASYM_CLIP = (-1.0, 3.0)


def normalize_group_rewards(rewards: jax.Array, method: str) -> jax.Array:
    """Normalise f32[N, G] episode rewards within each group (row) by `method`
    (docs/rewards_and_objectives.md#episode-rewards).

    identity: unchanged; mean: x - mean; mean_std: (x - mean) / (std + 1e-6) with the unbiased std, all zeros
    when std <= 1e-6; asym_clip: mean_std clipped to [-1, 3]. Groups of one rollout are left unchanged
    (RAGEN normalises only when there are fewer groups than samples).
    """
    check_choice("rollout.reward_normalization", method, REWARD_NORMALIZATIONS)
    rewards = jnp.asarray(rewards, jnp.float32)
    if method == "identity" or rewards.shape[1] < 2:
        return rewards
    centred = rewards - rewards.mean(axis=1, keepdims=True)
    if method == "mean":
        return centred
    std = jnp.std(rewards, axis=1, ddof=1, keepdims=True)
    out = jnp.where(std > NORM_EPS, centred / (std + NORM_EPS), 0.0)
    return jnp.clip(out, *ASYM_CLIP) if method == "asym_clip" else out


def last_token_rewards(episode_rewards: jax.Array, loss_mask: jax.Array) -> jax.Array:
    """f32[B, T]: each row's episode reward f32[B] on its last masked position of `loss_mask` f32[B, T]."""
    positions = jnp.arange(loss_mask.shape[1])
    last = jnp.max(jnp.where(loss_mask > 0, positions, -1), axis=1)
    return jnp.where(positions[None, :] == last[:, None], episode_rewards[:, None], 0.0).astype(jnp.float32)

"""What an actor or critic update reads besides the parameters: its rows (`UpdateBatch`) and its traced
hyperparameters (`ActorHyper`, `CriticHyper`), shared by the update (train/update.py) and the gradient diagnostics."""
from __future__ import annotations

from typing import NamedTuple

import jax


class UpdateBatch(NamedTuple):
    """One step's training rows (compacted: kept rows first). L = sequence length, T = L - 1."""

    tokens: jax.Array  # int32[B, L]
    positions: jax.Array  # int32[B, L]
    attention_mask: jax.Array  # bool[B, L]
    loss_mask: jax.Array  # f32[B, T], 1 on trained (assistant) targets
    old_logp: jax.Array  # f32[B, T], log-probs recomputed before the update
    advantages: jax.Array  # f32[B, T]
    ref_logp: jax.Array  # f32[B, T], reference-policy log-probs (zeros when no KL loss)
    returns: jax.Array  # f32[B, T], critic targets
    old_values: jax.Array  # f32[B, T], critic values before the update


class ActorHyper(NamedTuple):
    """Traced actor hyperparameters (f32 scalars): a new value never recompiles (filled from the config by
    `train.hyper.Hyper.from_config`)."""

    lr: jax.Array
    clip_ratio_low: jax.Array
    clip_ratio_high: jax.Array
    clip_ratio_c: jax.Array
    entropy_coeff: jax.Array
    kl_loss_coef: jax.Array
    temperature: jax.Array


class CriticHyper(NamedTuple):
    """Traced critic hyperparameters (f32 scalars)."""

    lr: jax.Array
    value_clip: jax.Array

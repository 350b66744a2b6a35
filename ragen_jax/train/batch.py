"""From a rollout `Trajectory` to the arrays the update and the collapse diagnostics read.

The trajectory buffer is already laid out by position (token s at position s, right-padded), so the model
inputs are the buffer itself; the loss mask marks the sampled tokens as *targets* (index t of the [B, L-1]
arrays scores tokens[:, t + 1], as in `scoring.token_logprobs`). Unlike RAGEN (docs/differences.md#sampled-tokens), which
also trains on the chat-template tokens around each assistant message, only the sampled tokens are trained
(docs/architecture.md, design rule 6).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from ragen_jax.diagnostics.families import ReasoningSpans
from ragen_jax.rollout.rollout import Trajectory


def model_inputs(traj: Trajectory) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
    """(tokens i32[B, L], positions i32[B, L], attention_mask bool[B, L], loss_mask f32[B, L-1])."""
    batch, length = traj.tokens.shape
    positions = jnp.broadcast_to(jnp.arange(length, dtype=jnp.int32), (batch, length))
    attention = positions < traj.length[:, None]
    return traj.tokens, positions, attention, traj.sampled[:, 1:].astype(jnp.float32)


def reasoning_spans(traj: Trajectory) -> ReasoningSpans:
    """The per-turn reasoning spans of the collapse diagnostics (docs/diagnostics.md#sampling-families)."""
    return ReasoningSpans(tokens=traj.tokens, think_start=traj.think_start, think_len=traj.think_len,
                          turn_taken=traj.turn_taken, group_ids=traj.group_ids)

"""Early-stop rules of RAGEN's trainer as pure state + update functions (docs/filtering.md#early-stops).

Each rule is a small NamedTuple of arrays and an `update(state, observation, ...) -> (state, stop)`
function. They run on host values or inside jit alike; the training loop owns the state (and saves it
in checkpoints) and stops when `stop` is true.

1. Empty steps: `consecutive_empty` counts steps in a row whose filter kept nothing; stop when it reaches
   `stop_steps` (0 disables). Any non-empty step resets it.
2. Reward-variance collapse: the first `window` non-empty steps' `rollout/in_group_reward_std` define
   the base (their mean); the following non-empty steps fill a sliding window of the last `window`
   values; stop when the window is full and every value < ratio * base. Empty steps are ignored.
3. Low validation success: one counter per `val-env/*/success` key, incremented when the success is
   below `floor` and reset otherwise; stop when any counter reaches `patience` (0 disables).
"""
from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp


class EmptyStopState(NamedTuple):
    consecutive_empty: jax.Array  # int32


def empty_stop_init() -> EmptyStopState:
    return EmptyStopState(jnp.int32(0))


def empty_stop_update(
    state: EmptyStopState, kept_count: jax.Array, stop_steps: int | jax.Array
) -> tuple[EmptyStopState, jax.Array]:
    """Counts consecutive empty steps (kept_count == 0); stop once the count reaches `stop_steps` > 0.

    Returns (state, stop); `state.consecutive_empty` is RAGEN's
    `rollout/consecutive_empty_after_filter_steps`.
    """
    empty = jnp.asarray(kept_count) == 0
    count = jnp.where(empty, state.consecutive_empty + 1, 0).astype(jnp.int32)
    stop = empty & (stop_steps > 0) & (count >= stop_steps)
    return EmptyStopState(count), stop


class RewardVarianceState(NamedTuple):
    base_values: jax.Array  # f32[W], the first W non-empty steps' values
    base_count: jax.Array  # int32 in [0, W]
    window: jax.Array  # f32[W], ring buffer of the values after the base
    window_count: jax.Array  # int32 in [0, W]
    window_pos: jax.Array  # int32, next ring slot


def reward_variance_init(window: int) -> RewardVarianceState:
    """State for a base / window of `window` steps (static; 0 disables the rule)."""
    zeros = jnp.zeros(window, jnp.float32)
    return RewardVarianceState(zeros, jnp.int32(0), zeros, jnp.int32(0), jnp.int32(0))


def reward_variance_base(state: RewardVarianceState) -> jax.Array:
    """The base value (mean of the first W values), NaN until W values were seen."""
    size = state.base_values.shape[0]
    ready = (size > 0) & (state.base_count >= size)
    return jnp.where(ready, state.base_values.mean() if size else jnp.nan, jnp.nan)


def reward_variance_update(
    state: RewardVarianceState, in_group_reward_std: jax.Array, nonempty: jax.Array, ratio: float | jax.Array
) -> tuple[RewardVarianceState, jax.Array]:
    """Feeds one step's `rollout/in_group_reward_std` (mean std over ALL groups, before filtering).

    Args:
      nonempty: whether the filter kept anything this step (empty steps leave the state unchanged).
      ratio: the collapse ratio (RAGEN: 0.1).
    Returns:
      (state, stop).
    """
    size = state.base_values.shape[0]
    if size == 0:
        return state, jnp.bool_(False)
    value = jnp.asarray(in_group_reward_std, jnp.float32)
    nonempty = jnp.asarray(nonempty, bool)
    in_base = nonempty & (state.base_count < size)
    in_window = nonempty & ~in_base
    base_slot = jnp.minimum(state.base_count, size - 1)
    base_values = jnp.where(in_base, state.base_values.at[base_slot].set(value), state.base_values)
    window = jnp.where(in_window, state.window.at[state.window_pos].set(value), state.window)
    new = RewardVarianceState(
        base_values=base_values,
        base_count=state.base_count + in_base.astype(jnp.int32),
        window=window,
        window_count=jnp.minimum(state.window_count + in_window.astype(jnp.int32), size),
        window_pos=jnp.where(in_window, (state.window_pos + 1) % size, state.window_pos),
    )
    threshold = ratio * base_values.mean()
    stop = in_window & (new.window_count >= size) & jnp.all(window < threshold)
    return new, stop


class ValidationSuccessState(NamedTuple):
    low_counts: jax.Array  # int32[K], one per `val-env/*/success` key


def validation_success_init(num_keys: int) -> ValidationSuccessState:
    return ValidationSuccessState(jnp.zeros(num_keys, jnp.int32))


def validation_success_update(
    state: ValidationSuccessState,
    success: jax.Array,
    floor: float | jax.Array = 0.01,
    patience: int | jax.Array = 5,
) -> tuple[ValidationSuccessState, jax.Array]:
    """Feeds one evaluation's success rates f32[K] (same key order every time).

    Returns (state, stop): stop when any key was below `floor` for `patience` > 0 evaluations in a row.
    """
    low = jnp.asarray(success, jnp.float32) < floor
    counts = jnp.where(low, state.low_counts + 1, 0).astype(jnp.int32)
    stop = (patience > 0) & jnp.any(counts >= patience)
    return ValidationSuccessState(counts), stop

"""When a diagnostic runs (docs/diagnostics.md#schedule): RAGEN's two step schedules are one rule with a phase."""
from __future__ import annotations

import jax
import jax.numpy as jnp


def runs_at(step, every: int, phase: int) -> jax.Array:
    """bool[]: never at step 0, always at step 1, then at the steps with `(step - phase) % every == 0`;
    `every <= 0`: never. Phase 0 gives steps 1, 5, 10, ... (every=5), phase 1 steps 1, 51, 101, ... (every=50)."""
    if every <= 0:
        return jnp.zeros((), jnp.bool_)
    step = jnp.asarray(step)
    return (step == 1) | ((step > 0) & ((step - phase) % every == 0))

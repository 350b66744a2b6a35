"""Pytree helpers shared by the environments and `ragen_jax` (which imports `environments`, never the reverse)."""
from __future__ import annotations

import jax
import jax.numpy as jnp


def tree_select(pred: jnp.ndarray, on_true, on_false):
    """Leafwise `where(pred, on_true, on_false)` for two pytrees of the same structure."""
    return jax.tree.map(lambda a, b: jnp.where(pred, a, b), on_true, on_false)


def filled_like(fn, value, *args):
    """The pytree `fn(*args)` would return, every leaf `value` in that leaf's shape and dtype: the result of a
    skipped `lax.cond` branch. `fn` is only traced (`jax.eval_shape`), never run."""
    return jax.tree.map(lambda s: jnp.full(s.shape, value, s.dtype), jax.eval_shape(fn, *args))

"""Pytree helpers shared by the environments and `ragen_jax` (which imports `environments`, never the reverse)."""
from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.extend import core as jax_core


def tree_select(pred: jnp.ndarray, on_true, on_false):
    """Leafwise `where(pred, on_true, on_false)` for two pytrees of the same structure."""
    return jax.tree.map(lambda a, b: jnp.where(pred, a, b), on_true, on_false)


def traced_once(fn, *operands):
    """(run, shapes): `fn` traced once at the shapes of `operands` (`jax.make_jaxpr`); `run(*operands)` replays that
    trace (the same computation, without running `fn`'s Python again) and `shapes` is its output pytree of
    `jax.ShapeDtypeStruct`s. For a `lax.cond` whose other branch only needs `fn`'s output shapes (`filled`): tracing
    the taken branch once, not once more for its shapes, keeps nested conds (the minibatch steps inside the actor
    update) from multiplying the step's tracing time at every level."""
    closed, shapes = jax.make_jaxpr(fn, return_shape=True)(*operands)
    treedef = jax.tree.structure(shapes)

    def run(*args):
        return jax.tree.unflatten(treedef, jax_core.jaxpr_as_fun(closed)(*jax.tree.leaves(args)))

    return run, shapes


def filled(shapes, value):
    """A pytree of arrays shaped as `shapes` (ShapeDtypeStructs), every element `value`: a skipped branch's result."""
    return jax.tree.map(lambda s: jnp.full(s.shape, value, s.dtype), shapes)

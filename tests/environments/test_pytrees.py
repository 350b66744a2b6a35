"""environments/pytrees.py: `traced_once` replays one trace of a function (its Python runs once however often the
replay is traced) and gives the shapes a skipped `lax.cond` branch fills."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from environments.pytrees import filled, traced_once


def test_replay_computes_what_the_function_does_from_one_python_trace():
    calls = []

    def step(x, scale):  # closes over `scale`, a tracer of the enclosing jit / vmap
        def fn(operand):
            calls.append(1)
            return {"y": jnp.sin(operand["x"]) * scale, "n": jnp.sum(operand["x"] > 0).astype(jnp.int32)}

        run, shapes = traced_once(fn, {"x": x})
        skip = lambda operand: filled(shapes, -1)  # noqa: E731
        taken = jax.lax.cond(scale > 0, run, skip, {"x": x})
        skipped = jax.lax.cond(scale < 0, run, skip, {"x": x})
        return taken, skipped, run({"x": x + 1.0})

    x = jnp.linspace(-1.0, 1.0, 6, dtype=jnp.float32).reshape(2, 3)
    scales = jnp.array([0.5, 2.0], jnp.float32)
    taken, skipped, shifted = jax.jit(jax.vmap(step, in_axes=(None, 0)))(x, scales)
    assert len(calls) == 1  # three uses of the replay, one Python trace
    for i, scale in enumerate(np.asarray(scales)):
        np.testing.assert_allclose(taken["y"][i], np.sin(np.asarray(x)) * scale, rtol=1e-6)
        np.testing.assert_allclose(shifted["y"][i], np.sin(np.asarray(x) + 1.0) * scale, rtol=1e-6)
    assert taken["n"].tolist() == [3, 3] and shifted["n"].tolist() == [5, 5]
    assert skipped["y"].dtype == jnp.float32 and skipped["n"].dtype == jnp.int32
    np.testing.assert_array_equal(skipped["y"], np.full((2, 2, 3), -1.0, np.float32))
    np.testing.assert_array_equal(skipped["n"], [-1, -1])

"""Instance datasets for the free-text environments, stored through tensorflow-datasets.

Builders (array_record files, read with `tfds.data_source` / `builder.as_data_source()`; TensorFlow
is never imported):

* `environments.datasets.generated`: `CountdownInstances` and `ArithmeticProblems`, instances made by
  the environments' own JAX generators (run on the host), plus `load_countdown` / `load_problems`
  returning the arrays or texts the environments take as `instances=` / `problems=`.
* `environments.datasets.math_jsonl`: `MathJsonl`, a user's local MetaMathQA (`query`/`response`
  with "The answer is: X") or GSM8K (`question`/`answer` with "#### X") JSONL from a manual directory.

An environment built with a dataset draws instance `instance_index(key, size)` on reset. This module
stays free of the tensorflow-datasets import so environments load fast.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp


def instance_seed(key: jax.Array) -> jnp.ndarray:
    """u32[] the seed a reset key stands for (same key, same seed)."""
    return jax.random.bits(key, (), jnp.uint32)


def instance_index(key: jax.Array, size: int) -> jnp.ndarray:
    """i32[] index of the dataset instance drawn for `key`: `instance_seed(key) mod size`."""
    return (instance_seed(key) % jnp.uint32(size)).astype(jnp.int32)

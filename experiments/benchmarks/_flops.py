"""FLOPs counted from shapes, and the matmul rate they are compared with (helpers of lm.py and study_throughput.py;
the leading underscore keeps `run_all` from running this module)."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from ragen_jax import models


def forward_flops(c: models.ModelConfig, batch: int, length: int) -> float:
    """Matmul FLOPs of one forward pass over `batch` sequences of `length` tokens: the layers' projections, the LM
    head, and causal attention (length (length + 1) / 2 query-key pairs, QK and PV)."""
    q, k = c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim
    per_token = c.d_model * (2 * q + 2 * k) + 3 * c.d_model * c.mlp_dim
    forward = 2 * batch * length * (c.num_layers * per_token + c.d_model * c.vocab_size)
    return forward + c.num_layers * 4 * batch * (length * (length + 1) // 2) * q


def train_flops(c: models.ModelConfig, batch: int, length: int) -> float:
    """Forward + backward (3x the forward's matmul FLOPs)."""
    return 3.0 * forward_flops(c, batch, length)


def matmul_reference(n: int = 2048, chain: int = 8):
    """(blocking callable, its FLOPs): `chain` dependent float32 n x n matmuls, about as long as a train step."""
    a = jax.random.normal(jax.random.key(0), (n, n), jnp.float32)
    b = jax.random.normal(jax.random.key(1), (n, n), jnp.float32) / np.sqrt(n)

    def chained(x, y):
        return jax.lax.fori_loop(0, chain, lambda _, acc: acc @ y, x)

    compiled = jax.jit(chained).lower(a, b).compile()
    return (lambda: compiled(a, b).block_until_ready()), 2.0 * chain * n ** 3


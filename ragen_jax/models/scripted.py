"""A scripted bigram policy: parameters of a normal decoder that make it answer a fixed token script.

All layer weights are zero, so the residual stream carries the current token's embedding unchanged; the
embedding of script token i is the unit vector e_i and the LM head maps e_i to the next script token with logit
`scale * sqrt(d_model)` (RMSNorm rescales e_i to sqrt(d_model) e_i). Greedy decoding after the first script token
therefore reproduces the script, whatever the prompt, and its log-probs do not depend on the prompt: a *template*
policy (docs/diagnostics.md), the reference case of template collapse. The forward pass costs exactly what any model of
the same shape costs, so benchmarks use it to get valid, realistic-length responses from an untrained model.
"""
from __future__ import annotations

from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from ragen_jax.models import transformer
from ragen_jax.models.config import ModelConfig


def scripted_params(config: ModelConfig, script: Sequence[int], scale: float = 10.0) -> transformer.Params:
    """Params making token script[i] predict script[i + 1] (f32 pytree of `transformer.init_params`'s structure).

    script: distinct token ids, at most `config.d_model` of them; needs `config.tie_embeddings=False`.
    scale: how peaked each next-token distribution is (10: nearly deterministic; 1: high entropy, same argmax).
    """
    if config.tie_embeddings:
        raise ValueError("scripted_params needs ModelConfig.tie_embeddings=False (a separate LM head)")
    if len(set(script)) != len(script) or len(script) > config.d_model:
        raise ValueError(f"the script needs distinct token ids, at most d_model = {config.d_model}; got {list(script)}")
    shapes = jax.eval_shape(lambda key: transformer.init_params(config, key), jax.random.key(0))
    params = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes)
    params["final_norm"]["scale"] = jnp.ones_like(params["final_norm"]["scale"])
    embed = np.zeros((config.vocab_size, config.d_model), np.float32)
    head = np.zeros((config.d_model, config.vocab_size), np.float32)
    for i, (token, following) in enumerate(zip(script[:-1], script[1:])):
        embed[token, i] = 1.0
        head[i, following] = scale
    params["embed"]["embedding"] = jnp.asarray(embed)
    params["lm_head"]["kernel"] = jnp.asarray(head)
    return params

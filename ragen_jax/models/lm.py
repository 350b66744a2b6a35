"""The model seam: `CausalLM`, the one interface through which the rest of the package uses a language model.

The sampler, the rollout, the collapse diagnostics' cross log-probs, the training step, the update phase and the
SFT warm start receive a `CausalLM` where they need a model and call only its methods. It is a small frozen object
of pure functions over explicit params pytrees: hashable by its config, so it is a static argument of `jax.jit`,
and it holds no parameters or state (design rule 1). A new architecture is one module that subclasses it and one
`model.arch` entry (`config.MODEL_ARCHS`):

    @MODEL_ARCHS.register("my_arch")
    @dataclasses.dataclass(frozen=True)
    class MyLM(CausalLM):
        def hidden_states(self, params, tokens, positions=None, attention_mask=None): ...
        ...                                     # and the other abstract methods

registered in a module that `ragen_jax/models/__init__.py` imports; `make(config.model.arch, model_config)` then
builds it. `ragen_jax.models.transformer.DecoderLM` (`model.arch = "transformer"`, the Qwen2 / Llama-3 decoder) is
the one registered today.

Shapes: tokens int32[B, T]; positions int32[B, T] (None: the count of earlier real tokens); attention_mask [B, T]
(1/True = real token; None: all real); hidden states float32[B, T, D]; logits float32[B, T, V]; values float32[B, T].
The cache is a `kv_cache.KVCache` (its row operations `take_rows`, `repeat_rows`, `truncate`, `shard_rows` and its
`lengths` / `max_len` are the architecture-independent part): row b is compact, and appending a right-padded chunk
writes its first `num_new[b]` tokens at slots `lengths[b] ..`.
"""
from __future__ import annotations

import abc
import dataclasses
from typing import Any

import jax
import jax.numpy as jnp

from ragen_jax.config import MODEL_ARCHS
from ragen_jax.models import kv_cache as kv
from ragen_jax.models.config import ModelConfig

Params = Any  # a pytree of float32 arrays, structured by the architecture


@dataclasses.dataclass(frozen=True)
class CausalLM(abc.ABC):
    """A causal LM of `config` as pure functions of its params, split at the LM head (see the module docstring).

    Calling it gives the logits, so it serves wherever a logits function `(params, tokens, positions,
    attention_mask) -> f32[B, T, V]` is expected; scorers that see a `CausalLM` (`algos.scoring.token_logprobs`)
    unembed its hidden states a few positions at a time instead of holding every position's logits.
    """

    config: ModelConfig

    def __call__(self, params: Params, tokens: jax.Array, positions: jax.Array | None = None,
                 attention_mask: jax.Array | None = None) -> jax.Array:
        """Logits float32[B, T, V] of tokens int32[B, T]."""
        return self.logits_from_hidden(params, self.hidden_states(params, tokens, positions, attention_mask))

    @abc.abstractmethod
    def init_params(self, key: jax.Array) -> Params:
        """Random float32 policy parameters."""

    @abc.abstractmethod
    def init_value_params(self, key: jax.Array, backbone: Params | None = None) -> Params:
        """Critic parameters: a copy of `backbone`'s body (fresh random ones if None) plus a value head."""

    @abc.abstractmethod
    def hidden_states(self, params: Params, tokens: jax.Array, positions: jax.Array | None = None,
                      attention_mask: jax.Array | None = None) -> jax.Array:
        """Final hidden states float32[B, T, D] (the input of the LM head and of the value head)."""

    def grouped_hidden_states(self, params: Params, tokens: jax.Array, positions: jax.Array,
                              attention_mask: jax.Array, group_size: int, starts: jax.Array, width: int
                              ) -> tuple[jax.Array, jax.Array]:
        """Hidden states of rows in groups of n = `group_size` consecutive rows, group g's rows agreeing on their
        first starts[g] positions (i32[B/n], each at most T - width): (each group's first row at positions 0 ..
        T - width - 1 float32[B/n, T - width, D], exact before its start; every row's `width` (static) positions from
        its group's start on float32[B, width, D]). An architecture may compute the shared positions once per group
        (`transformer.grouped_hidden_states`); this default runs every row in full."""
        hidden = self.hidden_states(params, tokens, positions, attention_mask)
        T = tokens.shape[1]
        return hidden[::group_size, :T - width], row_windows(hidden, jnp.repeat(starts, group_size), width)

    @abc.abstractmethod
    def logits_from_hidden(self, params: Params, hidden: jax.Array) -> jax.Array:
        """LM head: float32[..., D] hidden states -> float32[..., V] logits."""

    @abc.abstractmethod
    def values(self, value_params: Params, tokens: jax.Array, positions: jax.Array | None = None,
               attention_mask: jax.Array | None = None) -> jax.Array:
        """Critic values float32[B, T] (one scalar per token) from `init_value_params`-shaped params."""

    @abc.abstractmethod
    def init_cache(self, batch_size: int, max_len: int | None = None) -> kv.KVCache:
        """An empty cache (all lengths 0) of `max_len` slots per row (default `config.max_seq_len`)."""

    @abc.abstractmethod
    def hidden_states_with_cache(self, params: Params, tokens: jax.Array, cache: kv.KVCache,
                                 num_new: jax.Array | None = None, positions: jax.Array | None = None
                                 ) -> tuple[jax.Array, kv.KVCache]:
        """Prefill / extend: appends the right-padded chunk tokens int32[B, T] to `cache`; returns (float32[B, T, D]
        hidden states of the chunk, the cache). num_new: int32[B] real tokens at the start of each row (default T;
        0 leaves a row unchanged); positions: int32[B, T], default `cache.lengths[b] + t`. Hidden states at padded
        steps are meaningless."""


def row_windows(x: jax.Array, starts: jax.Array, width: int) -> jax.Array:
    """x[b, starts[b] : starts[b] + width] of each row of x [B, T, ...] (starts i32[B], clamped to fit): [B, width,
    ...]."""
    return jax.vmap(lambda row, start: jax.lax.dynamic_slice_in_dim(row, start, width, axis=0))(x, starts)


def make(arch: str, config: ModelConfig) -> CausalLM:
    """The `model.arch` entry `arch` built for `config` (a ConfigError naming `model.arch` if none is registered)."""
    return MODEL_ARCHS.entry(arch).fn(config)

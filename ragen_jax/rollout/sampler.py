"""Jitted generation on a KV cache: extend with a prompt chunk, then a `lax.while_loop` decode.

One call of `generate` appends a right-padded prompt chunk (`prompt_lengths[b]` real tokens) to the cache,
then samples up to `max_new_tokens` tokens per row. Every sampled token (the stop token included) is written
to the cache before the call returns, so a multi-turn rollout continues on the SAME cache:

    cache = model.init_cache(B, max_len)                                   # model: a `models.lm.CausalLM`
    out, cache = generate(model, params, cache, obs_1, obs_1_len, key_1, temperature, top_p, ...)
    out, cache = generate(model, params, cache, obs_2, obs_2_len, key_2, temperature, top_p, ...)
    cache = extend(model, params, cache, final_obs, final_obs_len)         # append without generating

Rows stop independently on any stop sequence (token-id sequences, e.g. `</answer>` spelled in several
tokens, or the end-of-turn token), at `max_new_tokens`, or when their cache is full. Temperature and
top-p are traced (no recompiles); top-k, max_new_tokens and the stop-sequence count/width are static.
The input cache is donated (`donate_argnames="cache"`): do not reuse it after the call.
"""
from __future__ import annotations

import functools
from typing import Sequence

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from ragen_jax import sharding
from ragen_jax.models import kv_cache as kv
from ragen_jax.models.lm import CausalLM, Params


@flax.struct.dataclass
class SampleOutput:
    """tokens int32[B, N] (pad_id past a row's length); lengths int32[B] tokens generated (stop tokens included);
    logprobs float32[B, N] log-probability of each token under the sampling distribution actually used
    (temperature-scaled, top-k/top-p truncated and renormalised; 0 for greedy rows and past the length);
    stopped bool[B] True where the row ended with a stop sequence (False: max_new_tokens, full cache, inactive)."""

    tokens: jax.Array
    lengths: jax.Array
    logprobs: jax.Array
    stopped: jax.Array


@flax.struct.dataclass
class _LoopState:
    step: jax.Array  # int32 scalar: next column of `tokens`
    cache: kv.KVCache
    logits: jax.Array  # float32[B, V] next-token logits
    tokens: jax.Array
    logprobs: jax.Array
    lengths: jax.Array
    done: jax.Array  # bool[B]
    stopped: jax.Array
    window: jax.Array  # int32[B, W] the last W generated tokens (-1 before generation)


def stop_sequence_array(sequences: Sequence[Sequence[int]]) -> np.ndarray:
    """int32[N, W] right-aligned stop sequences, left-padded with -1 (a wildcard); N may be 0."""
    for s in sequences:
        if len(s) == 0:
            raise ValueError("stop_sequences contains an empty sequence (it would stop every row at once)")
        if min(s) < 0:
            raise ValueError(f"stop sequence {list(s)} contains a negative token id")
    width = max([len(s) for s in sequences], default=1)
    out = np.full((len(sequences), width), -1, np.int32)
    for i, s in enumerate(sequences):
        out[i, width - len(s):] = s
    return out


def _top_p_mask(logits: jax.Array, top_p: jax.Array) -> jax.Array:
    """Keeps the smallest most-likely set whose probability mass reaches top_p (HF TopPLogitsWarper rule)."""
    sorted_logits = jnp.sort(logits, axis=-1)[:, ::-1]
    probs = jax.nn.softmax(sorted_logits, axis=-1)
    mass_before = jnp.cumsum(probs, axis=-1) - probs
    keep_count = jnp.maximum(jnp.sum(mass_before < top_p, axis=-1, keepdims=True), 1)
    threshold = jnp.take_along_axis(sorted_logits, keep_count - 1, axis=-1)
    return jnp.where(logits < threshold, -jnp.inf, logits)


def first_argmax(x: jax.Array) -> jax.Array:
    """`jnp.argmax(x, axis=-1)` (the first index of the maximum) as a max and a min: two plain reductions, which XLA:CPU
    runs faster than argmax's index-carrying reduction (docs/performance.md, "a cheaper argmax")."""
    top = jnp.max(x, axis=-1, keepdims=True)
    return jnp.min(jnp.where(x == top, jnp.arange(x.shape[-1]), x.shape[-1]), axis=-1)


def sample_tokens(logits: jax.Array, key: jax.Array, temperature: jax.Array, top_p: jax.Array,
                  top_k: int = 0) -> tuple[jax.Array, jax.Array]:
    """Samples one token per row from float32[B, V] logits; returns (int32[B] tokens, float32[B] log-probs).

    temperature: float32 scalar or [B]; <= 0 means greedy (argmax of the raw logits, log-prob 0).
    top_p: float32 scalar (1 = off); top_k: static int (0 = off). Ties at a cut-off are kept.
    """
    temperature = jnp.broadcast_to(jnp.asarray(temperature, jnp.float32), logits.shape[:1])[:, None]
    greedy = temperature <= 0
    scaled = logits.astype(jnp.float32) / jnp.where(greedy, 1.0, temperature)
    if top_k and top_k < logits.shape[-1]:
        kth = jax.lax.top_k(scaled, top_k)[0][:, -1:]
        scaled = jnp.where(scaled < kth, -jnp.inf, scaled)
    top_p = jnp.asarray(top_p, jnp.float32)
    scaled = sharding.sweep_cond(top_p < 1.0, _top_p_mask, lambda x, _: x, scaled, top_p)
    logp = jax.nn.log_softmax(scaled, axis=-1)
    # `jax.random.categorical(key, logp)` (the argmax of Gumbel noise + logp: the same draws), greedy rows folded into
    # the same argmax
    noisy = jnp.where(greedy, logits.astype(jnp.float32), jax.random.gumbel(key, logp.shape, jnp.float32) + logp)
    tokens = first_argmax(noisy).astype(jnp.int32)
    token_logp = jnp.take_along_axis(logp, tokens[:, None], axis=-1)[:, 0]
    return tokens, jnp.where(greedy[:, 0], 0.0, token_logp)


SHORT_PROMPT = 8  # the narrowest prompt width `generate` prefills (see `prompt_widths`)


def prompt_widths(width: int) -> tuple[int, ...]:
    """The static widths at which `generate` prefills a prompt chunk `width` columns wide: `SHORT_PROMPT` when that
    is narrower, then `kv.attended_widths(width)`. The narrowest holding every row's real tokens runs: a short
    prompt (e.g. the rollout's turn 1, whose context is in the cache already but for its last token) does not pay
    for a whole chunk of queries."""
    return ((SHORT_PROMPT,) if SHORT_PROMPT < width else ()) + kv.attended_widths(width)


def _last_logits(model: CausalLM, params, hidden, lengths):
    """Logits float32[B, V] at each row's last real chunk position (hidden float32[B, T, D])."""
    last = jnp.take_along_axis(hidden, jnp.maximum(lengths - 1, 0)[:, None, None], axis=1)[:, 0]
    return model.logits_from_hidden(params, last)


@functools.partial(jax.jit, static_argnums=0, donate_argnames="cache")
def extend(model: CausalLM, params: Params, cache: kv.KVCache, chunk: jax.Array,
           chunk_lengths: jax.Array) -> kv.KVCache:
    """Appends a right-padded chunk int32[B, T] (chunk_lengths int32[B] real tokens) to the cache."""
    return model.hidden_states_with_cache(params, chunk, cache, chunk_lengths)[1]


@functools.partial(jax.jit, static_argnums=0,
                   static_argnames=("max_new_tokens", "top_k", "pad_id", "num_tokens"),
                   donate_argnames="cache")
def generate(model: CausalLM, params: Params, cache: kv.KVCache, prompt: jax.Array,
             prompt_lengths: jax.Array, key: jax.Array, temperature: jax.Array, top_p: jax.Array,
             stop_sequences: jax.Array | None = None, active: jax.Array | None = None, *,
             max_new_tokens: int, top_k: int = 0, pad_id: int = 0,
             num_tokens: int = 0) -> tuple[SampleOutput, kv.KVCache]:
    """Extends `cache` with `prompt` and samples up to `max_new_tokens` tokens per row of `model` (static).

    prompt: int32[B, T] right-padded chunk; prompt_lengths: int32[B] >= 1 for active rows.
    key: PRNG key; temperature: float32 scalar or [B] (0 = greedy); top_p: float32 scalar.
    stop_sequences: int32[N, W] from `stop_sequence_array` (None = no stop sequences).
    active: bool[B] rows that generate (default all); inactive rows leave their cache untouched and
    return length 0. num_tokens: sample only ids below it (the tokenizer's vocabulary when the model's is
    padded; 0 = every id). Returns (SampleOutput, cache holding prompt + generated tokens).
    """
    B = prompt.shape[0]
    active = jnp.ones((B,), bool) if active is None else active.astype(bool)
    if stop_sequences is None:
        stop_sequences = np.zeros((0, 1), np.int32)
    stop_sequences = jnp.asarray(stop_sequences, jnp.int32)
    prompt_lengths = jnp.where(active, prompt_lengths, 0).astype(jnp.int32)

    def prefill(cache, width):  # the chunk's first `width` columns hold every real token
        hidden, cache = model.hidden_states_with_cache(params, prompt[:, :width], cache, prompt_lengths)
        return _last_logits(model, params, hidden, prompt_lengths), cache

    logits, cache = sharding.tiered(jnp.max(prompt_lengths), prompt_widths(prompt.shape[1]), prefill, cache)
    state = _LoopState(
        step=jnp.int32(0), cache=cache, logits=logits,
        tokens=jnp.full((B, max_new_tokens), pad_id, jnp.int32),
        logprobs=jnp.zeros((B, max_new_tokens), jnp.float32), lengths=jnp.zeros((B,), jnp.int32),
        done=~active | (cache.lengths >= cache.max_len), stopped=jnp.zeros((B,), bool),
        window=jnp.full((B, stop_sequences.shape[1]), -1, jnp.int32))

    def cond(s: _LoopState):  # in a sweep: until every member is done (extra iterations are no-ops for done rows)
        return (s.step < max_new_tokens) & sharding.sweep_any(~jnp.all(s.done))

    def body(s: _LoopState):
        logits = s.logits
        if 0 < num_tokens < logits.shape[-1]:
            logits = jnp.where(jnp.arange(logits.shape[-1]) < num_tokens, logits, -jnp.inf)
        token, logp = sample_tokens(logits, jax.random.fold_in(key, s.step), temperature, top_p, top_k)
        live = ~s.done
        token = jnp.where(live, token, pad_id)
        window = jnp.where(live[:, None], jnp.concatenate([s.window[:, 1:], token[:, None]], axis=1), s.window)
        hit = live & jnp.any(jnp.all((stop_sequences[None] == -1) | (window[:, None] == stop_sequences[None]),
                                     axis=-1), axis=-1)
        hidden, cache = model.hidden_states_with_cache(params, token[:, None], s.cache, live.astype(jnp.int32))
        return _LoopState(
            step=s.step + 1, cache=cache, logits=model.logits_from_hidden(params, hidden[:, 0]),
            tokens=s.tokens.at[:, s.step].set(token), logprobs=s.logprobs.at[:, s.step].set(jnp.where(live, logp, 0.0)),
            lengths=s.lengths + live, stopped=s.stopped | hit,
            done=s.done | hit | (cache.lengths >= cache.max_len), window=window)

    final = jax.lax.while_loop(cond, body, state)
    output = SampleOutput(tokens=final.tokens, lengths=final.lengths, logprobs=final.logprobs, stopped=final.stopped)
    return output, final.cache

"""Cross log-prob matrix l[i, j] = log p(z_i | x_j) for R reasoning strings against C prompts
(docs/diagnostics.md#cross-log-prob-matrix).

`cross_log_probs` prefills the C prompts ONCE into a KV cache and scores all R reasoning strings against each
cached prefix in a batch, so its cost grows with C*R*|z| instead of C*R*(|x| + |z|) (RAGEN re-runs the whole
[x_j | z_i] sequence for every pair). `cross_log_probs_naive` is that full-sequence computation, kept as the
reference for tests and benchmarks.

Shapes: prompts int32[C, P] right-padded with lengths int32[C]; reasoning int32[R, Z] right-padded with
lengths int32[R]. Token p of a prompt sits at position p and reasoning token t of a row scored against prompt j
at position len_j + t (as in the contiguous sequence). `cross_log_probs` unembeds the reasoning's hidden states
a block of positions at a time (`losses.DEFAULT_LOGITS_CHUNK` logits at most), so no float32[rows, Z, V] array is
held. Logits are
divided by `temperature` (a float or traced scalar) as in the training forward. Returns (logp_mean, logp_sum),
both float32[R, C]: the sum over the real reasoning tokens and that sum divided by max(|z_i|, 1). A row with no
reasoning gives 0 (mask it downstream).
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from ragen_jax import sharding
from ragen_jax.algos import losses
from ragen_jax.models import kv_cache as kv
from ragen_jax.models.lm import CausalLM


def _check(prompts, prompt_len, reasoning, reasoning_len):
    if prompts.ndim != 2 or prompt_len.shape != prompts.shape[:1]:
        raise ValueError(f"prompts {prompts.shape} / prompt_len {prompt_len.shape} must be [C, P] / [C]")
    if reasoning.ndim != 2 or reasoning_len.shape != reasoning.shape[:1]:
        raise ValueError(f"reasoning {reasoning.shape} / reasoning_len {reasoning_len.shape} must be [R, Z] / [R]")


def _target_logprobs(logits: jax.Array, targets: jax.Array, temperature) -> jax.Array:
    """float32[...] log-softmax(logits / temperature) at the target ids (the training forward's numerics)."""
    return losses.logprobs_and_entropy(logits, targets, temperature)[0]


def _reduce(token_logp: jax.Array, reasoning_len: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Masked sum and per-token mean over the reasoning axis: ([R], [R])."""
    mask = jnp.arange(token_logp.shape[1])[None, :] < reasoning_len[:, None]
    total = jnp.sum(jnp.where(mask, token_logp, 0.0), axis=1)
    return total / jnp.maximum(reasoning_len, 1).astype(jnp.float32), total


def width_tiers(width: int, num_tiers: int) -> tuple[int, ...]:
    """Static widths width * k / num_tiers (rounded up), k = 1..num_tiers, ascending (evenly spaced: a chunk pays
    for at most width / num_tiers padded positions beyond its longest member)."""
    n = max(num_tiers, 1)
    return tuple(sorted({max(1, -(-width * k // n)) for k in range(1, n + 1)}))


def _sorted_chunks(lengths: jax.Array, chunk: int) -> jax.Array:
    """int32[n // chunk, chunk]: indices sorted by length (stable), cut into consecutive chunks."""
    return jnp.argsort(lengths, stable=True).astype(jnp.int32).reshape(-1, chunk)


def cross_log_probs(model: CausalLM, params, prompts: jax.Array, prompt_len: jax.Array, reasoning: jax.Array,
                    reasoning_len: jax.Array, temperature=1.0, *, row_chunk: int = 16, col_chunk: int = 8,
                    num_tiers: int = 4):
    """Prefix-cached cross log-probs of `model` (static) with `params` (see module docstring); returns (logp_mean,
    logp_sum) float32[R, C].

    Columns are sorted by prompt length and handled `col_chunk` at a time (prefill of the chunk, then its
    columns one by one); rows are sorted by reasoning length and scored `row_chunk` at a time (a chunk size that
    does not divide C or R means all at once). Each chunk runs at the smallest of `width_tiers(P or Z,
    num_tiers)` widths that holds its longest member, so short prompts and short reasoning do not pay for the
    padded widths. A column of prompt length 0 costs nothing and scores 0: callers pass 0 for columns they do
    not need (invalid or duplicate prompts).
    """
    _check(prompts, prompt_len, reasoning, reasoning_len)
    num_cols, max_prompt = prompts.shape
    num_rows, max_reason = reasoning.shape
    prompt_len = jnp.minimum(prompt_len.astype(jnp.int32), max_prompt)
    reasoning_len = jnp.minimum(reasoning_len.astype(jnp.int32), max_reason)
    rc = row_chunk if 0 < row_chunk and num_rows % row_chunk == 0 else num_rows
    cc = col_chunk if 0 < col_chunk and num_cols % col_chunk == 0 else num_cols
    row_chunks = _sorted_chunks(reasoning_len, rc)
    unembed = functools.partial(model.logits_from_hidden, params)

    def score_columns(col_ids, prompt_width):
        """[n_row_chunks, cc, rc] x 2: the columns `col_ids` (prompts no longer than prompt_width)."""
        lengths = prompt_len[col_ids]
        cache = model.init_cache(cc, prompt_width + max_reason)
        hidden, cache = model.hidden_states_with_cache(params, prompts[col_ids, :prompt_width], cache, num_new=lengths)
        last = jnp.take_along_axis(hidden, jnp.maximum(lengths - 1, 0)[:, None, None], axis=1)[:, 0]
        first_logits = model.logits_from_hidden(params, last)  # [cc, V]: predicts reasoning token 0

        def score_rows(row_ids, width):
            tokens, row_len = reasoning[row_ids, :width], reasoning_len[row_ids]
            prefix = kv.truncate(cache, prompt_width + width)

            def score(j):
                rows = kv.take_rows(prefix, jnp.full((rc,), j, jnp.int32))
                h, _ = model.hidden_states_with_cache(params, tokens, rows, num_new=row_len)
                # logits at reasoning token t predict token t + 1; the prompt's last logits predict token 0
                rest = losses.hidden_logprobs_and_entropy(unembed, h[:, :-1], tokens[:, 1:], temperature)[0]
                first = _target_logprobs(jnp.broadcast_to(first_logits[j], (rc, first_logits.shape[-1])),
                                         tokens[:, 0], temperature)
                return _reduce(jnp.concatenate([first[:, None], rest], axis=1), row_len)

            empty = lambda j: (jnp.zeros((rc,), jnp.float32),) * 2  # noqa: E731
            return jax.lax.map(lambda j: sharding.sweep_cond(lengths[j] > 0, score, empty, j), jnp.arange(cc))

        return jax.lax.map(lambda ids: sharding.tiered(jnp.max(reasoning_len[ids]), width_tiers(max_reason, num_tiers),
                                                       score_rows, ids), row_chunks)

    col_chunks = _sorted_chunks(prompt_len, cc)
    mean, total = jax.lax.map(
        lambda ids: sharding.tiered(jnp.max(prompt_len[ids]), width_tiers(max_prompt, num_tiers), score_columns, ids),
        col_chunks)

    def unsort(x):  # [col chunk, row chunk, cc, rc] -> [R, C]
        x = x.transpose(0, 2, 1, 3).reshape(num_cols, num_rows)
        x = jnp.zeros_like(x).at[col_chunks.reshape(-1)].set(x)
        return jnp.zeros_like(x).at[:, row_chunks.reshape(-1)].set(x).T

    return unsort(mean), unsort(total)


def concat_prompt_reasoning(prompt: jax.Array, prompt_len: jax.Array, reasoning: jax.Array) -> jax.Array:
    """int32[R, P+Z]: row i = prompt[:prompt_len] followed by reasoning[i] (then whatever padding follows)."""
    max_prompt, max_reason = prompt.shape[0], reasoning.shape[1]
    s = jnp.arange(max_prompt + max_reason)
    from_reason = jnp.take(reasoning, jnp.clip(s - prompt_len, 0, max_reason - 1), axis=1)
    return jnp.where(s[None, :] < prompt_len, prompt[jnp.minimum(s, max_prompt - 1)][None, :], from_reason)


def cross_log_probs_naive(model: CausalLM, params, prompts: jax.Array, prompt_len: jax.Array,
                          reasoning: jax.Array, reasoning_len: jax.Array, temperature=1.0):
    """The full-sequence reference: the whole model on [x_j | z_i] for every pair (RAGEN's computation)."""
    _check(prompts, prompt_len, reasoning, reasoning_len)
    num_rows, max_reason = reasoning.shape
    reasoning_len = jnp.minimum(reasoning_len.astype(jnp.int32), max_reason)
    seq_len = prompts.shape[1] + max_reason
    positions = jnp.broadcast_to(jnp.arange(seq_len, dtype=jnp.int32), (num_rows, seq_len))

    def score_column(args):
        prompt, length = args
        seq = concat_prompt_reasoning(prompt, length, reasoning)
        mask = positions < length + reasoning_len[:, None]
        logits = model(params, seq, positions, mask)
        # reasoning token t sits at length + t and is predicted by the logits at length + t - 1
        at = jnp.clip(length - 1 + jnp.arange(max_reason), 0, seq_len - 1)
        token_logp = _target_logprobs(jnp.take(logits, at, axis=1), reasoning, temperature)
        return _reduce(token_logp, reasoning_len)

    mean, total = jax.lax.map(score_column, (prompts, prompt_len.astype(jnp.int32)))
    return mean.T, total.T

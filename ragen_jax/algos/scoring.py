"""Scoring rows with a model: per-token log-probs, entropies and critic values of a batch, over the prefix its real
tokens need, with a shared prompt scored once per group (docs/performance.md). The update, the step's old and
reference log-probs, SFT and the gradient diagnostics all score with these functions, so a ratio of new to old
log-probs is 1 up to float32 rounding before the first optimizer step (docs/architecture.md, design rule 6).

Model functions are generic: `logits_fn(params, tokens, positions, attention_mask) -> f32[B, T, V]` and
`values_fn(params, tokens, positions, attention_mask) -> f32[B, T]` must be causal; they are called on the
first L-1 tokens, whose outputs score the (B, L-1) targets `tokens[:, 1:]`
(docs/prompts_and_parsing.md#token-layout-and-the-loss-mask). A `logits_fn` that is a `models.lm.CausalLM` (the
model seam, split at its LM head) is scored from its final hidden states, unembedding blocks of positions that hold
at most `logits_chunk` logits (or one position of every row), so a large vocabulary's f32[B, T, V] logits never
exist, in the forward or the backward pass; a plain function's logits are computed whole (then reduced over
vocabulary chunks).
"""
from __future__ import annotations

import functools
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp

from ragen_jax import sharding
from ragen_jax.algos.losses import DEFAULT_LOGITS_CHUNK, DEFAULT_VOCAB_CHUNK, hidden_logprobs_and_entropy
from ragen_jax.algos.losses import logprobs_and_entropy
from ragen_jax.models import kv_cache as kv
from ragen_jax.models import lm
from ragen_jax.models.lm import CausalLM

Params = Any
LogitsFn = Callable[[Params, jax.Array, jax.Array, jax.Array], jax.Array]
ValuesFn = Callable[[Params, jax.Array, jax.Array, jax.Array], jax.Array]


def token_logprobs(logits_fn: LogitsFn | CausalLM, params, tokens, positions, attention_mask, temperature,
                   vocab_chunk: int = DEFAULT_VOCAB_CHUNK, logits_chunk: int = DEFAULT_LOGITS_CHUNK,
                   width: "int | ScoreTier | None" = None, group_size: int = 1, max_tiers: int = 0
                   ) -> tuple[jax.Array, jax.Array]:
    """(log pi(tokens[:, 1:]), full-vocabulary entropy), both f32[B, L-1], at `temperature`.

    tokens, positions: int32[B, L]; attention_mask: bool[B, L]. A `CausalLM` is scored from its hidden states,
    in blocks of positions holding at most `logits_chunk` logits (`losses.hidden_logprobs_and_entropy`; in the
    backward pass too, one position of every row at least); a plain logits function's f32[B, L-1, V]
    logits are computed whole. The same code scores old log-probs before the update and new ones inside it, so
    the ratio is 1 on the first minibatch up to float32 rounding (docs/architecture.md, design rule 6). Only a
    prefix that holds every real token is scored (`scored_prefix`, `width` as there); targets after it get 0.
    group_size > 1 (a `CausalLM`): groups of that many consecutive rows that share a prompt have it computed once
    per group (`grouped_scoring`; `width` is then a `ScoreTier` of `scoring_tiers`, or None). `max_tiers`: as
    `limit_tiers`, when `width` is None.
    """
    if group_size > 1 and isinstance(logits_fn, CausalLM):
        unembed = functools.partial(logits_fn.logits_from_hidden, params)

        def score_hidden(hidden, targets):
            return hidden_logprobs_and_entropy(unembed, hidden, targets, temperature, logits_chunk, vocab_chunk)

        return grouped_scoring(logits_fn, params, score_hidden, tokens, positions, attention_mask, group_size, width,
                               max_tiers)

    def score(tokens, positions, attention_mask, targets):
        if isinstance(logits_fn, CausalLM):
            unembed = functools.partial(logits_fn.logits_from_hidden, params)
            hidden = logits_fn.hidden_states(params, tokens, positions, attention_mask)
            return hidden_logprobs_and_entropy(unembed, hidden, targets, temperature, logits_chunk, vocab_chunk)
        return logprobs_and_entropy(logits_fn(params, tokens, positions, attention_mask), targets, temperature,
                                    vocab_chunk)

    return scored_prefix(score, tokens, positions, attention_mask, width, max_tiers)


def token_values(values_fn: ValuesFn, params, tokens, positions, attention_mask, width: int | None = None,
                 max_tiers: int = 0) -> jax.Array:
    """Critic values f32[B, L-1] aligned with the targets (value of the prefix up to token t); 0 after the prefix
    that holds every real token (`scored_prefix`, `width` and `max_tiers` as there)."""
    return scored_prefix(lambda t, p, m, _: values_fn(params, t, p, m).astype(jnp.float32),
                         tokens, positions, attention_mask, width, max_tiers)


def limit_tiers(tiers: tuple, max_tiers: int) -> tuple:
    """At most `max_tiers` of the ordered `tiers` (0: all of them): the first max_tiers - 1 and the last, which holds
    every row. Fewer tiers compile fewer copies of the forward (and of the backward in the update); a row that would
    have taken a dropped tier is scored at the next one kept, with more padding."""
    return tiers if not max_tiers or len(tiers) <= max_tiers else tiers[:max_tiers - 1] + tiers[-1:]


def prefix_widths(tokens: jax.Array, max_tiers: int = 0) -> tuple[int, ...]:
    """The static widths `scored_prefix` chooses from for tokens [B, L]: those of `kv_cache.attended_widths(L - 1)`
    that are at least a quarter of L - 1 (every width is one more compiled copy of the model's forward, and of its
    backward in the update: shorter ones would rarely pay for theirs), at most `max_tiers` (`limit_tiers`)."""
    length = tokens.shape[1] - 1
    return limit_tiers(tuple(w for w in kv.attended_widths(length) if 4 * w >= length), max_tiers)


def needed_width(attention_mask: jax.Array) -> jax.Array:
    """i32[]: the input positions whose targets may be real, up to the last True of bool[B, L] `attention_mask`."""
    return jnp.max(row_needed_widths(attention_mask))


def row_needed_widths(attention_mask: jax.Array) -> jax.Array:
    """i32[B]: `needed_width` of each row of bool[B, L] `attention_mask`."""
    return jnp.max(jnp.where(attention_mask, jnp.arange(attention_mask.shape[1]) + 1, 0), axis=1) - 1


def scored_prefix(score, tokens, positions, attention_mask, width: int | None = None, max_tiers: int = 0):
    """`score(tokens, positions, attention_mask, targets)` of a causal model over the first w of the L - 1 input
    positions, its f32[B, w] outputs zero-padded to [B, L - 1]: w is the smallest width of
    `prefix_widths` that holds every real target (up to the last True of `attention_mask`), so a
    batch padded far beyond its longest row costs what its rows need (one compiled branch per width, one runs;
    `sharding.tiered`). Causality makes the outputs before w those of the whole sequence (up to float rounding);
    the targets after it are padding. A static `width` (one of `prefix_widths`, at least `needed_width`) is used
    as given: a caller that differentiates picks the width outside its gradient, so the branches' residuals stay
    inside them (a switch inside the gradient carries every branch's residuals, zero-filled). `max_tiers`: see
    `prefix_widths`.
    """
    length = tokens.shape[1] - 1

    def run(operands, width):
        tokens, positions, attention_mask = operands
        out = score(tokens[:, :width], positions[:, :width], attention_mask[:, :width], tokens[:, 1:width + 1])
        return jax.tree.map(lambda x: jnp.pad(x, [(0, 0), (0, length - width)]), out)

    operands = (tokens, positions, attention_mask)
    if width is not None:
        return run(operands, width)
    return sharding.tiered(needed_width(attention_mask), prefix_widths(tokens, max_tiers), run, operands)


def group_split(tokens: jax.Array, positions: jax.Array, attention_mask: jax.Array, group_size: int) -> jax.Array:
    """i32[B/n]: per group of n = `group_size` consecutive rows of tokens, positions and attention_mask [B, T], the
    longest P such that all its rows agree with its first row at positions 0 .. P-1 (their shared prompt)."""
    B, T = tokens.shape

    def agree(x):
        groups = x.reshape(B // group_size, group_size, T)
        return jnp.all(groups == groups[:, :1], axis=1)

    same = agree(tokens) & agree(positions) & agree(attention_mask.astype(bool))
    return jnp.sum(jnp.cumprod(same.astype(jnp.int32), axis=1), axis=1)


def shared_targets(tokens, positions, attention_mask, group_size: int) -> jax.Array:
    """i32[B/n]: per group of tokens [B, L], the input positions whose inputs and targets its rows share: one less
    than the shared prompt of the inputs (`group_split`), as each target is the next token."""
    inputs = (tokens[:, :-1], positions[:, :-1], attention_mask[:, :-1])
    return jnp.maximum(group_split(*inputs, group_size) - 1, 0)


class ScoreTier(NamedTuple):
    """A static way to score a batch: a window of `width` positions after each group's shared prompt
    (`grouped_scoring`), or, not `grouped`, the prefix of `width` positions (`scored_prefix`)."""

    width: int
    grouped: bool


def group_windows(tokens: jax.Array) -> tuple[int, ...]:
    """The window widths `grouped_scoring` uses for tokens [B, L]: 64, 128, ... of at most an eighth of L - 1, where a
    group's shared prompt is most of each row (a wider need is scored as a prefix: fewer compiled forwards); rows too
    short for that (L - 1 < 512) get the one window of at most half their length."""
    length = tokens.shape[1] - 1
    widths = [64 << i for i in range(length.bit_length())]
    eighths = tuple(w for w in widths if 8 * w <= length)
    return eighths or tuple(w for w in widths if 2 * w <= length)[-1:]


def scoring_tiers(tokens, positions, attention_mask, group_size: int, max_tiers: int = 0
                  ) -> tuple[jax.Array, tuple]:
    """(index i32[], tiers): `sharding.tier_switch(index, tiers, fn, operand)` picks how `token_logprobs(...,
    width=tiers[index], group_size=group_size)` scores tokens [B, L]: with group_size 1, the smallest of
    `prefix_widths` holding every real target (ints); else the smallest of `group_windows` that holds each row's
    targets after its group's shared ones, or, when none does, that prefix (`ScoreTier`s); at most `max_tiers` of
    them (`limit_tiers`: a pick past the kept ones takes the last, the whole length). A caller that differentiates
    picks it outside its gradient."""
    index, tiers = _all_scoring_tiers(tokens, positions, attention_mask, group_size)
    kept = limit_tiers(tiers, max_tiers)
    return jnp.minimum(index, len(kept) - 1), kept


def _all_scoring_tiers(tokens, positions, attention_mask, group_size: int) -> tuple[jax.Array, tuple]:
    prefixes = prefix_widths(tokens)
    prefix = sharding.sweep_max(jnp.minimum(jnp.searchsorted(jnp.asarray(prefixes), needed_width(attention_mask)),
                                            len(prefixes) - 1))  # one prefix for every member that takes one
    windows = group_windows(tokens) if group_size > 1 else ()
    if not windows:
        return prefix, prefixes if group_size == 1 else tuple(ScoreTier(w, False) for w in prefixes)
    shared = jnp.repeat(shared_targets(tokens, positions, attention_mask, group_size), group_size)
    need = jnp.max(row_needed_widths(attention_mask) - shared)
    index = jnp.where(need <= windows[-1], jnp.searchsorted(jnp.asarray(windows), need), len(windows) + prefix)
    return index, tuple(ScoreTier(w, True) for w in windows) + tuple(ScoreTier(w, False) for w in prefixes)


def grouped_scoring(model: CausalLM, params, score_hidden, tokens, positions, attention_mask, group_size: int,
                    tier: ScoreTier | None = None, max_tiers: int = 0):
    """`score_hidden(hidden f32[R, W, D], targets i32[R, W])` (outputs f32[R, W] each) of tokens [B, L] in groups of
    n = `group_size` consecutive rows that share a prompt, as `tier` says (default: `scoring_tiers`' pick). A grouped
    tier: `model.grouped_hidden_states` computes each group's prompt once and each row's window of `tier.width`
    positions after it, and the prompt is scored once per group too; the outputs f32[B, L-1] are the group's before
    the row's window, the row's in it, 0 after it. Otherwise every row's prefix of `tier.width` (`scored_prefix`)."""
    length = tokens.shape[1] - 1

    def run(operands, tier):
        tokens, positions, attention_mask = operands
        if not tier.grouped:
            return scored_prefix(lambda t, p, m, targets: score_hidden(model.hidden_states(params, t, p, m), targets),
                                 tokens, positions, attention_mask, tier.width)
        width = tier.width
        inputs = (tokens[:, :-1], positions[:, :-1], attention_mask[:, :-1])
        starts = jnp.minimum(shared_targets(tokens, positions, attention_mask, group_size), length - width)
        group_hidden, window_hidden = model.grouped_hidden_states(params, *inputs, group_size, starts, width)
        targets, row_starts = tokens[:, 1:], jnp.repeat(starts, group_size)
        group_out = score_hidden(group_hidden, targets[::group_size, :length - width])
        window_out = score_hidden(window_hidden, lm.row_windows(targets, row_starts, width))

        def assemble(group, window):
            shared = jnp.where(jnp.arange(length - width) < row_starts[:, None],
                               jnp.repeat(group, group_size, axis=0), 0.0)
            place = lambda row, w, start: jax.lax.dynamic_update_slice_in_dim(row, w, start, axis=0)  # noqa: E731
            return jax.vmap(place)(jnp.pad(shared, [(0, 0), (0, width)]), window, row_starts)

        return jax.tree.map(assemble, group_out, window_out)

    operands = (tokens, positions, attention_mask)
    if tier is not None:
        return run(operands, tier)
    return sharding.tier_switch(*scoring_tiers(*operands, group_size, max_tiers), run, operands)

"""The update phase of one training step: critic and actor optimisation over a compacted batch
(docs/rewards_and_objectives.md#the-update-phase).

Pure and jittable. The batch arrives COMPACTED (`ragen_jax.filtering.compact`): rows [0, kept_rows) are the
kept rows, the rest were dropped by the filter. Epochs x minibatches run as nested `lax.scan`s over
consecutive row blocks (verl's unshuffled `batch.split`); a minibatch whose first row is at or past
`kept_rows` is skipped with `lax.cond` (no forward, backward or optimizer step), so filtering saves
compute. Dropped rows inside a partly kept minibatch are masked out of every loss.

Differences from RAGEN/verl, deliberate (docs/differences.md#compaction-instead-of-duplicates): RAGEN pads a filtered
batch to a multiple of the minibatch size with randomly duplicated rows that then count twice; here the last partial
minibatch is simply smaller (masked). With micro-batches (gradient accumulation) the minibatch loss is the mean of the
micro-batch losses over micro-batches that hold a kept row (verl divides by the fixed micro-batch count).

Model functions are generic: `logits_fn(params, tokens, positions, attention_mask) -> f32[B, T, V]` and
`values_fn(params, tokens, positions, attention_mask) -> f32[B, T]` must be causal; they are called on the
first L-1 tokens, whose outputs score the (B, L-1) targets `tokens[:, 1:]`
(docs/prompts_and_parsing.md#token-layout-and-the-loss-mask). A `logits_fn` that is a `models.lm.CausalLM` (the
model seam, split at its LM head) is scored from its final hidden states, unembedding blocks of positions that hold
at most `UpdateConfig.logits_chunk` logits (or one position of every row), so a large vocabulary's f32[B, T, V]
logits never exist, in the forward or the backward pass; a plain function's logits are computed whole (then reduced
over vocabulary chunks).
"""
from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import ml_collections
import optax

from environments.pytrees import filled, traced_once
from ragen_jax import sharding
from ragen_jax.algos.losses import DEFAULT_LOGITS_CHUNK, DEFAULT_VOCAB_CHUNK, agg_loss, hidden_logprobs_and_entropy
from ragen_jax.algos.losses import kl_penalty, logprobs_and_entropy, masked_mean, policy_loss, value_loss
from ragen_jax.config import KL_ESTIMATORS, LOSS_AGG_MODES, check_choice
from ragen_jax.models import kv_cache as kv
from ragen_jax.models import lm
from ragen_jax.models.lm import CausalLM

Params = Any
LogitsFn = Callable[[Params, jax.Array, jax.Array, jax.Array], jax.Array]
ValuesFn = Callable[[Params, jax.Array, jax.Array, jax.Array], jax.Array]
CLIP_NORM_EPS = 1e-6  # torch clip_grad_norm_: coef = max_norm / (norm + 1e-6)


class UpdateBatch(NamedTuple):
    """One step's training rows (compacted: kept rows first). L = sequence length, T = L - 1."""

    tokens: jax.Array  # int32[B, L]
    positions: jax.Array  # int32[B, L]
    attention_mask: jax.Array  # bool[B, L]
    loss_mask: jax.Array  # f32[B, T], 1 on trained (assistant) targets
    old_logp: jax.Array  # f32[B, T], log-probs recomputed before the update
    advantages: jax.Array  # f32[B, T]
    ref_logp: jax.Array  # f32[B, T], reference-policy log-probs (zeros when no KL loss)
    returns: jax.Array  # f32[B, T], critic targets
    old_values: jax.Array  # f32[B, T], critic values before the update


@dataclasses.dataclass(frozen=True)
class UpdateConfig:
    """Static structure of one model's update (changing a field recompiles)."""

    epochs: int = 1  # ppo_epochs
    minibatch_size: int = 32  # rows per optimizer step (ppo_mini_batch_size)
    micro_batch_size: int | None = None  # rows per gradient-accumulation chunk; None = the minibatch
    loss_agg_mode: str = "token-mean"
    use_kl_loss: bool = False
    kl_loss_type: str = "kl"
    vocab_chunk: int = DEFAULT_VOCAB_CHUNK  # vocabulary entries per step of the streamed logsumexp / entropy
    logits_chunk: int = DEFAULT_LOGITS_CHUNK  # logits (rows x positions x vocabulary) a CausalLM scorer holds at once
    b1: float = 0.9
    b2: float = 0.999
    adam_eps: float = 1e-8
    weight_decay: float = 0.01
    grad_clip: float = 1.0
    group_size: int = 1  # consecutive rows that share a prompt (rollout.group_size): the actor scores it once per group
    score_tiers: int = 0  # at most this many static scoring widths (`limit_tiers`; algo.score_width_tiers); 0 = all

    def __post_init__(self):
        micro = self.micro_batch_size or self.minibatch_size
        if self.minibatch_size < 1 or self.epochs < 1 or self.minibatch_size % micro:
            raise ValueError(f"UpdateConfig epochs={self.epochs}, minibatch_size={self.minibatch_size}, "
                             f"micro_batch_size={self.micro_batch_size}: need positive sizes, micro dividing minibatch")
        if self.group_size < 1 or self.score_tiers < 0:
            raise ValueError(f"UpdateConfig group_size={self.group_size}, score_tiers={self.score_tiers}: need a "
                             "positive group size and score_tiers >= 0")
        if self.vocab_chunk < 1 or self.logits_chunk < 1:
            raise ValueError(f"UpdateConfig vocab_chunk={self.vocab_chunk}, logits_chunk={self.logits_chunk}: "
                             "need positive chunk sizes")
        check_choice("algo.loss_agg_mode", self.loss_agg_mode, LOSS_AGG_MODES)
        check_choice("algo.kl_loss_type", self.kl_loss_type, KL_ESTIMATORS)

    @property
    def micro(self) -> int:
        return self.micro_batch_size or self.minibatch_size

    @classmethod
    def from_config(cls, config: ml_collections.ConfigDict, **overrides) -> "UpdateConfig":
        """Actor and critic share these keys of `configs/base.py` (algo.*, optim.*)."""
        a, o = config.algo, config.optim
        fields = dict(epochs=a.ppo_epochs, minibatch_size=a.ppo_mini_batch_size,
                      micro_batch_size=a.ppo_micro_batch_size or None, loss_agg_mode=a.loss_agg_mode,
                      use_kl_loss=a.use_kl_loss, kl_loss_type=a.kl_loss_type, b1=o.b1, b2=o.b2,
                      weight_decay=o.weight_decay, grad_clip=o.grad_clip, group_size=config.rollout.group_size,
                      score_tiers=a.score_width_tiers)
        return cls(**{**fields, **overrides})


class ActorHyper(NamedTuple):
    """Traced actor hyperparameters (f32 scalars): a new value never recompiles."""

    lr: jax.Array
    clip_ratio_low: jax.Array
    clip_ratio_high: jax.Array
    clip_ratio_c: jax.Array
    entropy_coeff: jax.Array
    kl_loss_coef: jax.Array
    temperature: jax.Array

    @classmethod
    def from_config(cls, config: ml_collections.ConfigDict) -> "ActorHyper":
        a = config.algo
        values = (config.optim.actor_lr, a.clip_ratio_low, a.clip_ratio_high, a.clip_ratio_c, a.entropy_coeff,
                  a.kl_loss_coef, config.rollout.temperature)
        return cls(*(jnp.float32(v) for v in values))


class CriticHyper(NamedTuple):
    lr: jax.Array
    value_clip: jax.Array

    @classmethod
    def from_config(cls, config: ml_collections.ConfigDict) -> "CriticHyper":
        return cls(jnp.float32(config.optim.critic_lr), jnp.float32(config.algo.value_clip))


# ------------------------------------------------------------------------------------------------ optimizer
def _adamw(config: UpdateConfig) -> optax.GradientTransformation:
    """AdamW without the learning rate (applied as a traced scalar): Adam moments + decoupled weight decay."""
    return optax.chain(optax.scale_by_adam(config.b1, config.b2, config.adam_eps),
                       optax.add_decayed_weights(config.weight_decay))


def optimizer_init(params: Params, config: UpdateConfig) -> optax.OptState:
    """AdamW state (float32 moments and step count) for `params`."""
    return _adamw(config).init(params)


def optimizer_step(params, opt_state, grads, lr, config: UpdateConfig):
    """Global-norm clip (torch semantics) then AdamW; a non-finite grad norm skips the step entirely.

    Returns (params, opt_state, grad_norm before clipping, applied: bool).
    """
    grad_norm = optax.tree.norm(grads)
    finite = jnp.isfinite(grad_norm)
    scale = jnp.minimum(1.0, config.grad_clip / (grad_norm + CLIP_NORM_EPS))
    grads = jax.tree.map(lambda g: g * scale, grads)
    updates, new_state = _adamw(config).update(grads, opt_state, params)
    new_params = jax.tree.map(lambda p, u: p - lr * u, params, updates)
    keep = lambda new, old: jax.tree.map(lambda n, o: jnp.where(finite, n, o), new, old)
    return keep(new_params, params), keep(new_state, opt_state), grad_norm, finite


# ------------------------------------------------------------------------------------------------ forward passes
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
    group's shared prompt is most of each row (a wider need is scored as a prefix: fewer compiled forwards)."""
    length = tokens.shape[1] - 1
    return tuple(w for w in (64 << i for i in range(length.bit_length())) if 8 * w <= length)


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


def _actor_loss(logits_fn, config: UpdateConfig, hyper: ActorHyper, params, batch: UpdateBatch, mask, width):
    logp, entropy = token_logprobs(logits_fn, params, batch.tokens, batch.positions, batch.attention_mask,
                                   hyper.temperature, config.vocab_chunk, config.logits_chunk, width,
                                   config.group_size)
    mode = config.loss_agg_mode
    pg_loss, pg_metrics = policy_loss(logp, batch.old_logp, batch.advantages, mask, hyper.clip_ratio_low,
                                      hyper.clip_ratio_high, hyper.clip_ratio_c, mode)
    entropy_loss = agg_loss(entropy, mask, mode)
    loss = pg_loss - hyper.entropy_coeff * entropy_loss
    metrics = {"actor/pg_loss": pg_loss, "actor/entropy_loss": entropy_loss,
               **{f"actor/{k}": v for k, v in pg_metrics.items()}}
    if config.use_kl_loss:
        kl_loss = agg_loss(kl_penalty(logp, batch.ref_logp, config.kl_loss_type), mask, mode)
        loss = loss + hyper.kl_loss_coef * kl_loss
        metrics["actor/kl_loss"] = kl_loss
    return loss, metrics


def _critic_loss(values_fn, config: UpdateConfig, hyper: CriticHyper, params, batch: UpdateBatch, mask, width):
    values = token_values(values_fn, params, batch.tokens, batch.positions, batch.attention_mask, width)
    loss, metrics = value_loss(values, batch.old_values, batch.returns, mask, hyper.value_clip, config.loss_agg_mode)
    return loss, {"critic/vf_loss": loss, "critic/vf_clipfrac": metrics["vf_clipfrac"],
                  "critic/vpred_mean": masked_mean(values, mask)}


# ------------------------------------------------------------------------------------------------ minibatch loop
def _split(tree, block: int):
    """[B, ...] leaves -> [B // block, block, ...], each block split over the mesh's batch axes (when there is one),
    so every device works on every (mini/micro-)batch."""
    split = jax.tree.map(lambda x: x.reshape(x.shape[0] // block, block, *x.shape[1:]), tree)
    return sharding.shard_batch(split, axis=1)


def _minibatch_gradient(loss_fn, params, minibatch: UpdateBatch, row_ids, kept_rows, micro: int, group_size: int,
                        max_tiers: int):
    """Mean over micro-batches holding a kept row of (grad, metrics); empty micro-batches are skipped. Each
    micro-batch is scored at the width `scoring_tiers` picks for its rows (groups of `group_size` rows, at most
    `max_tiers` widths)."""
    micro_batches = (_split(minibatch, micro), row_ids.reshape(-1, micro))
    grad_fn = jax.grad(loss_fn, has_aux=True)
    first = jax.tree.map(lambda x: x[0], micro_batches[0])

    def prefix_gradient(batch, mask):
        tiers = scoring_tiers(batch.tokens, batch.positions, batch.attention_mask, group_size, max_tiers)
        return sharding.tier_switch(*tiers, lambda operands, width: grad_fn(params, *operands, width), (batch, mask))

    gradient, shapes = traced_once(prefix_gradient, first, first.loss_mask)
    zeros = filled(shapes, 0)

    def micro_step(acc, xs):
        batch, rows = xs
        active = rows[0] < kept_rows
        run = lambda _: gradient(batch, batch.loss_mask * (rows < kept_rows)[:, None])  # noqa: E731
        result = sharding.sweep_cond(active, run, lambda _: zeros, None)
        grads_sum, metrics_sum, count = acc
        grads_sum, metrics_sum = jax.tree.map(jnp.add, (grads_sum, metrics_sum), result)
        return (grads_sum, metrics_sum, count + active), None

    (grads, metrics, count), _ = jax.lax.scan(micro_step, (*zeros, jnp.int32(0)), micro_batches)
    denominator = jnp.maximum(count, 1).astype(jnp.float32)
    return jax.tree.map(lambda x: x / denominator, (grads, metrics))


def run_minibatches(loss_fn, params, opt_state, batch: UpdateBatch, kept_rows, lr, config: UpdateConfig,
                    prefix: str):
    """Epochs x minibatches of `loss_fn(params, batch, mask, width) -> (loss, metrics)` with AdamW; see module doc.
    `width` is the static prefix width its forward scores (`token_logprobs`), chosen per micro-batch.

    Returns (params, opt_state, metrics): metrics averaged over the optimizer steps that ran, plus
    `{prefix}/grad_norm`, `{prefix}/lr`, `{prefix}/num_updates` (minibatch steps run, incl. skipped
    non-finite ones) and `{prefix}/nonfinite_skips`.
    """
    num_rows = batch.tokens.shape[0]
    if num_rows % config.minibatch_size:
        raise ValueError(f"batch of {num_rows} rows is not a multiple of minibatch_size={config.minibatch_size}")
    row_ids = jnp.arange(num_rows, dtype=jnp.int32)
    minibatches = (_split(batch, config.minibatch_size), row_ids.reshape(-1, config.minibatch_size))
    kept_rows = jnp.asarray(kept_rows, jnp.int32)

    def minibatch_step(carry, xs):
        params, opt_state = carry
        minibatch, rows = xs

        def run(carry):
            params, opt_state = carry
            grads, metrics = _minibatch_gradient(loss_fn, params, minibatch, rows, kept_rows, config.micro,
                                                 config.group_size, config.score_tiers)
            params, opt_state, grad_norm, applied = optimizer_step(params, opt_state, grads, lr, config)
            stats = {**metrics, f"{prefix}/grad_norm": grad_norm, f"{prefix}/num_updates": jnp.float32(1),
                     f"{prefix}/nonfinite_skips": 1.0 - applied.astype(jnp.float32)}
            return (params, opt_state), stats

        run, shapes = traced_once(run, (params, opt_state))
        skip = lambda carry: (carry, filled(shapes[1], 0))  # noqa: E731
        return sharding.sweep_cond(rows[0] < kept_rows, run, skip, (params, opt_state))

    def epoch(carry, _):
        carry, stats = jax.lax.scan(minibatch_step, carry, minibatches)
        return carry, jax.tree.map(jnp.sum, stats)

    (params, opt_state), stats = jax.lax.scan(epoch, (params, opt_state), None, length=config.epochs)
    stats = jax.tree.map(jnp.sum, stats)
    count_key = f"{prefix}/num_updates"
    steps = jnp.maximum(stats[count_key], 1.0)
    metrics = {k: (v if k in (count_key, f"{prefix}/nonfinite_skips") else v / steps) for k, v in stats.items()}
    metrics[f"{prefix}/lr"] = jnp.asarray(lr, jnp.float32)
    return params, opt_state, metrics


def actor_update(logits_fn: LogitsFn, params, opt_state, batch: UpdateBatch, kept_rows, hyper: ActorHyper,
                 config: UpdateConfig):
    """Actor phase: loss = pg_loss - entropy_coeff * entropy [+ kl_loss_coef * kl]
    (docs/rewards_and_objectives.md#policy-loss).

    Args:
      logits_fn: causal `(params, tokens, positions, attention_mask) -> f32[B, T, V]`, or a `CausalLM` (scored in
        token chunks, see `token_logprobs`).
      params, opt_state: actor parameters and `optimizer_init` state.
      batch: compacted `UpdateBatch` (B a multiple of `config.minibatch_size`).
      kept_rows: int32 scalar (traced): rows [0, kept_rows) are trained, the rest skipped or masked.
      hyper: traced `ActorHyper`; config: static `UpdateConfig`.
    Returns:
      (params, opt_state, metrics) with verl's names: actor/pg_loss, actor/pg_clipfrac,
      actor/pg_clipfrac_lower, actor/ppo_kl, actor/entropy_loss, [actor/kl_loss], actor/grad_norm, actor/lr,
      actor/num_updates, actor/nonfinite_skips.
    """
    # a micro-batch holds whole groups, or equal parts of one, when the groups are consecutive and aligned; only a
    # CausalLM can score a group's prompt once
    group_size = math.gcd(config.group_size, config.micro) if isinstance(logits_fn, CausalLM) else 1
    config = dataclasses.replace(config, group_size=group_size)
    loss_fn = lambda p, b, m, w: _actor_loss(logits_fn, config, hyper, p, b, m, w)
    return run_minibatches(loss_fn, params, opt_state, batch, kept_rows, hyper.lr, config, "actor")


def critic_update(values_fn: ValuesFn, params, opt_state, batch: UpdateBatch, kept_rows, hyper: CriticHyper,
                  config: UpdateConfig):
    """Critic phase: clipped value loss (docs/rewards_and_objectives.md#value-loss); same minibatch loop and skipping as
    `actor_update`.

    Returns (params, opt_state, metrics): critic/vf_loss, critic/vf_clipfrac, critic/vpred_mean,
    critic/grad_norm, critic/lr, critic/num_updates, critic/nonfinite_skips.
    """
    loss_fn = lambda p, b, m, w: _critic_loss(values_fn, config, hyper, p, b, m, w)
    # the critic scores every row in full (`token_values`): its widths are prefix widths
    config = dataclasses.replace(config, group_size=1)
    return run_minibatches(loss_fn, params, opt_state, batch, kept_rows, hyper.lr, config, "critic")

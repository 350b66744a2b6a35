"""Gradient-component analysis by reward-variance bucket (docs/diagnostics.md#gradient-analysis): does the task gradient
shrink with RV while the regulariser gradients stay flat?

Groups are bucketed by their reward std (RV): `quantile` sorts the valid groups ascending by RV (ties: lower
group first) into min(num_buckets, #groups) equal-count buckets, the remainder going to the LAST one (128 groups
-> 21,21,21,21,21,23); `fixed_rv` uses [0,1), [1,2), ..., [num_buckets-1, inf). Buckets are `bucket_1` (lowest
RV) .. `bucket_n`, plus `all` (every valid row). For each bucket the gradients of the three loss terms are
taken separately on that bucket's rows (no optimizer step, parameters untouched):

  task = policy_loss(...)            entropy = -entropy_coeff * agg(H)      kl = kl_loss_coef * agg(kl_penalty)

so task + entropy + kl is the actor loss and the three gradients sum to its gradient. Logged (RAGEN names,
prefix `grad_norm/`): `<bucket>/{task,entropy,kl}` global L2 norms and `<bucket>/total` (the norm of their sum,
the actor's gradient on that bucket), `<bucket>/per_sample/<c>` (norm / rows),
`<bucket>/per_token/<c>` (norm / loss tokens), `<bucket>/loss/{policy,entropy,kl,total}` (the signed terms
above), `<bucket>/sample_count|sample_pct|group_rv_count`, `<bucket>/reward_std_mean|min|max` (over the bucket's
groups), and `all/reg` = ||g_entropy + g_kl|| with `all/snr` = ||g_task|| / ||g_reg|| (the SNR proxy of
docs/diagnostics.md). An empty bucket reports NaN norms, losses and RV stats with sample_count 0 (RAGEN omits it).

Differences from RAGEN: one gradient per bucket over all its rows instead of the mean of per-minibatch norms
(the norm of the bucket's mean gradient, as in the SNR argument's ||sum_x g_task(x)||), and no trailing-row trimming for
data-parallel divisibility. Cost: one chunked forward over the batch gives every loss term; each bucket's
backward then runs only on its own rows (chunks of `chunk_rows`, one forward and three pullbacks each), so
the whole analysis costs about three forward and six backward passes over the batch.
"""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from ragen_jax import sharding
from ragen_jax.algos import losses
from ragen_jax.algos.scoring import LogitsFn, token_logprobs
from ragen_jax.algos.update_inputs import ActorHyper, UpdateBatch
from ragen_jax.config import BUCKET_MODES, check_choice
from ragen_jax.diagnostics import schedule

COMPONENTS = ("task", "entropy", "kl")


@dataclasses.dataclass(frozen=True)
class GradAnalysisOptions:
    """Static structure of the analysis (config `diagnostics.grad_analysis_*`,
    `algo.loss_agg_mode/use_kl_loss/kl_loss_type`)."""

    every: int = 0
    bucket_mode: str = "quantile"
    num_buckets: int = 6
    agg_mode: str = "token-mean"
    use_kl_loss: bool = False
    kl_type: str = "kl"
    chunk_rows: int = 16

    @classmethod
    def from_config(cls, config, chunk_rows: int = 16) -> "GradAnalysisOptions":
        d, a = config.diagnostics, config.algo
        return cls(every=d.grad_analysis_every, bucket_mode=d.grad_analysis_bucket_mode,
                   num_buckets=d.grad_analysis_num_buckets, agg_mode=a.loss_agg_mode, use_kl_loss=a.use_kl_loss,
                   kl_type=a.kl_loss_type, chunk_rows=chunk_rows)


def should_run(step, every: int) -> jax.Array:
    """RAGEN's trigger `(step - 1) % every == 0` (every=50: steps 1, 51, 101); every=0: never."""
    return schedule.runs_at(step, every, phase=1)


def assign_buckets(group_rv: jax.Array, group_valid: jax.Array, mode: str, num_buckets: int) -> jax.Array:
    """int32[G]: each valid group's bucket in [0, num_buckets), -1 for invalid groups."""
    check_choice("diagnostics.grad_analysis_bucket_mode", mode, BUCKET_MODES)
    if num_buckets < 1:
        raise ValueError(f"num_buckets = {num_buckets} is invalid: must be >= 1")
    if mode == "fixed_rv":
        bucket = jnp.clip(jnp.floor(group_rv), 0, num_buckets - 1).astype(jnp.int32)
    else:
        count = jnp.sum(group_valid)
        used = jnp.maximum(jnp.minimum(num_buckets, count), 1)
        per_bucket = jnp.maximum(count // used, 1)
        order = jnp.argsort(jnp.where(group_valid, group_rv, jnp.inf), stable=True)
        rank = jnp.zeros_like(order).at[order].set(jnp.arange(order.shape[0], dtype=order.dtype))
        bucket = jnp.minimum(rank // per_bucket, used - 1).astype(jnp.int32)
    return jnp.where(group_valid, bucket, -1)


def _global_norm(tree) -> jax.Array:
    return jnp.sqrt(sum(jnp.sum(jnp.square(x.astype(jnp.float32))) for x in jax.tree.leaves(tree)))


def _component_losses(logp, entropy, batch: UpdateBatch, mask, hyper: ActorHyper, agg_mode: str, use_kl_loss: bool,
                      kl_type: str):
    """The three signed loss terms f32[3] on the token mask `mask` (the KL term is 0 without a KL loss)."""
    task, _ = losses.policy_loss(logp, batch.old_logp, batch.advantages, mask, hyper.clip_ratio_low,
                                 hyper.clip_ratio_high, hyper.clip_ratio_c, agg_mode)
    ent = -hyper.entropy_coeff * losses.agg_loss(entropy, mask, agg_mode)
    if use_kl_loss:
        kl = hyper.kl_loss_coef * losses.agg_loss(losses.kl_penalty(logp, batch.ref_logp, kl_type), mask, agg_mode)
    else:
        kl = jnp.zeros((), jnp.float32)
    return jnp.stack([task, ent, kl])


def _chunk_outputs(logits_fn: LogitsFn, params, batch: UpdateBatch, rows: jax.Array, temperature):
    """(logp, entropy) f32[m, L-1] of the batch rows `rows` int32[m], scored as the update scores them (a
    `models.lm.CausalLM` a block of positions at a time)."""
    return token_logprobs(logits_fn, params, batch.tokens[rows], batch.positions[rows], batch.attention_mask[rows],
                          temperature)


def _all_outputs(logits_fn, params, batch: UpdateBatch, temperature, chunk_rows: int):
    """(logp, entropy) f32[B, L-1] for the whole batch, `chunk_rows` rows at a time."""
    num_rows, width = batch.tokens.shape[0], batch.tokens.shape[1] - 1
    chunks = jnp.arange(num_rows, dtype=jnp.int32).reshape(-1, chunk_rows)
    logp, entropy = jax.lax.map(lambda rows: _chunk_outputs(logits_fn, params, batch, rows, temperature), chunks)
    return logp.reshape(num_rows, width), entropy.reshape(num_rows, width)


def _bucket_gradients(logits_fn, params, batch: UpdateBatch, outputs, rows, hyper: ActorHyper, agg_mode: str,
                      use_kl_loss: bool, kl_type: str, chunk_rows: int):
    """(terms f32[3], [g_task, g_entropy, g_kl], loss tokens) on the rows weighted by `rows` f32[B].

    The loss terms and their cotangents w.r.t. (logp, entropy) come from the whole-batch outputs (cheap);
    the backward through the model then runs only on the bucket's own rows, gathered `chunk_rows` at a
    time (a while loop of ceil(#rows / chunk_rows) steps), one forward and three pullbacks per chunk.
    """
    logp, entropy = outputs
    mask = batch.loss_mask.astype(jnp.float32) * rows[:, None]
    terms, per_term = jax.vjp(
        lambda lp, ent: _component_losses(lp, ent, batch, mask, hyper, agg_mode, use_kl_loss, kl_type), logp,
        entropy)
    cotangents = jax.vmap(per_term)(jnp.eye(3, dtype=jnp.float32))  # ([3, B, L-1], [3, B, L-1])
    num_rows = rows.shape[0]
    order = jnp.argsort(rows == 0, stable=True).astype(jnp.int32)  # the bucket's rows first
    count = jnp.sum(rows > 0)

    def add_chunk(c, acc):
        slot = c * chunk_rows + jnp.arange(chunk_rows)
        ids = order[jnp.minimum(slot, num_rows - 1)]
        weight = (slot < count).astype(jnp.float32)[None, :, None]  # clamped duplicates weigh 0
        _, pullback = jax.vjp(lambda p: _chunk_outputs(logits_fn, p, batch, ids, hyper.temperature), params)
        # three pullbacks of one forward; on CPU this beats vmapping the pullback over the components
        chunk_cotangents = jax.tree.map(lambda g: g[:, ids] * weight, cotangents)
        grads = [pullback(jax.tree.map(lambda g, c=c: g[c], chunk_cotangents))[0] for c in range(3)]
        return jax.tree.map(jnp.add, acc, grads)

    zeros = [jax.tree.map(lambda x: jnp.zeros(x.shape, jnp.float32), params) for _ in range(3)]
    # in a sweep every member runs the most chunks any member needs (chunks past `count` weigh 0)
    grads = jax.lax.fori_loop(0, sharding.sweep_max((count + chunk_rows - 1) // chunk_rows), add_chunk, zeros)
    return terms, grads, jnp.sum(mask)


def _check_chunk(batch: UpdateBatch, chunk_rows: int) -> int:
    num_rows = batch.tokens.shape[0]
    chunk_rows = min(chunk_rows, num_rows)
    if chunk_rows < 1 or num_rows % chunk_rows:
        raise ValueError(f"chunk_rows = {chunk_rows} is invalid: it must divide the batch of {num_rows} rows")
    return chunk_rows


def gradient_analysis(logits_fn: LogitsFn, params, batch: UpdateBatch, hyper: ActorHyper, row_valid: jax.Array,
                      group_ids: jax.Array, group_rv: jax.Array, *, agg_mode: str, use_kl_loss: bool,
                      kl_type: str = "kl", bucket_mode: str = "quantile", num_buckets: int = 6,
                      chunk_rows: int = 16, prefix: str = "grad_norm") -> dict:
    """Per-bucket, per-component gradient norms and RV statistics (see module docstring). Jittable.

    batch: the actor's `UpdateBatch` (B rows of length L; only the actor fields are read, `ref_logp` only with
    `use_kl_loss`); hyper: the actor's traced `ActorHyper` (`lr` unused). Its extras: row_valid bool[B] rows in the
    analysed (filtered) batch; group_ids int32[B] in [0, G); group_rv f32[G] each group's reward std
    (`filtering.group_stats`). chunk_rows: rows per forward/backward chunk (memory grows with it); must divide B.
    Returns a dict of f32 scalars keyed `{prefix}/{bucket}/...` for bucket in `all`, `bucket_1..n`.
    """
    chunk_rows = _check_chunk(batch, chunk_rows)
    num_groups = group_rv.shape[0]
    row_valid = row_valid.astype(bool)
    group_valid = jnp.zeros((num_groups,), bool).at[group_ids].max(row_valid)
    group_bucket = assign_buckets(group_rv, group_valid, bucket_mode, num_buckets)
    names = ("all",) + tuple(f"bucket_{b + 1}" for b in range(num_buckets))
    group_in = jnp.stack([group_valid] + [group_bucket == b for b in range(num_buckets)])  # [K, G]
    in_bucket = group_in[:, group_ids] & row_valid[None, :]  # [K, B]
    outputs = _all_outputs(logits_fn, params, batch, hyper.temperature, chunk_rows)

    def per_bucket(rows):
        terms, grads, tokens = _bucket_gradients(logits_fn, params, batch, outputs, rows, hyper, agg_mode,
                                                 use_kl_loss, kl_type, chunk_rows)
        reg = jax.tree.map(jnp.add, grads[1], grads[2])
        norms = jnp.stack([_global_norm(g) for g in (*grads, jax.tree.map(jnp.add, grads[0], reg), reg)])
        return terms, norms, jnp.sum(rows), tokens

    terms, norms, rows, tokens = jax.lax.map(per_bucket, in_bucket.astype(jnp.float32))  # norms: task ent kl total reg

    rv = group_rv.astype(jnp.float32)[None, :]
    group_count = jnp.sum(group_in, axis=1).astype(jnp.float32)
    nan = jnp.float32(jnp.nan)
    total_rows = jnp.maximum(rows[0], 1.0)
    out = {}
    for k, name in enumerate(names):
        key = f"{prefix}/{name}"
        empty = rows[k] == 0
        out[f"{key}/sample_count"] = rows[k]
        out[f"{key}/sample_pct"] = rows[k] / total_rows
        out[f"{key}/group_rv_count"] = group_count[k]
        out[f"{key}/reward_std_mean"] = jnp.where(empty, nan, jnp.sum(jnp.where(group_in[k], rv, 0.0))
                                                  / jnp.maximum(group_count[k], 1.0))
        out[f"{key}/reward_std_min"] = jnp.where(empty, nan, jnp.min(jnp.where(group_in[k], rv, jnp.inf)))
        out[f"{key}/reward_std_max"] = jnp.where(empty, nan, jnp.max(jnp.where(group_in[k], rv, -jnp.inf)))
        for c, comp in enumerate(COMPONENTS):
            out[f"{key}/{comp}"] = jnp.where(empty, nan, norms[k, c])
            out[f"{key}/per_sample/{comp}"] = jnp.where(empty, nan, norms[k, c] / jnp.maximum(rows[k], 1.0))
            out[f"{key}/per_token/{comp}"] = jnp.where(empty, nan, norms[k, c] / jnp.maximum(tokens[k], 1.0))
        out[f"{key}/total"] = jnp.where(empty, nan, norms[k, 3])
        for c, term in enumerate(("policy", "entropy", "kl")):
            out[f"{key}/loss/{term}"] = jnp.where(empty, nan, terms[k, c])
        out[f"{key}/loss/total"] = jnp.where(empty, nan, jnp.sum(terms[k]))
    out[f"{prefix}/all/reg"] = norms[0, 4]
    out[f"{prefix}/all/snr"] = norms[0, 0] / jnp.maximum(norms[0, 4], 1e-30)
    return {k: jnp.asarray(v, jnp.float32) for k, v in out.items()}

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

Model functions and how rows are scored: `ragen_jax.algos.scoring`.
"""
from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
import ml_collections
import optax

from environments.pytrees import filled, traced_once
from ragen_jax import sharding
from ragen_jax.algos.losses import DEFAULT_LOGITS_CHUNK, DEFAULT_VOCAB_CHUNK, agg_loss, kl_penalty, masked_mean
from ragen_jax.algos.losses import policy_loss, value_loss
from ragen_jax.algos.scoring import LogitsFn, Params, ValuesFn, scoring_tiers, token_logprobs, token_values
from ragen_jax.algos.update_inputs import ActorHyper, CriticHyper, UpdateBatch
from ragen_jax.config import KL_ESTIMATORS, LOSS_AGG_MODES, check_choice
from ragen_jax.models.lm import CausalLM

CLIP_NORM_EPS = 1e-6  # torch clip_grad_norm_: coef = max_norm / (norm + 1e-6)


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
        """Actor and critic share these keys of `ragen_jax/defaults.py` (algo.*, optim.*)."""
        a, o = config.algo, config.optim
        fields = dict(epochs=a.ppo_epochs, minibatch_size=a.ppo_mini_batch_size,
                      micro_batch_size=a.ppo_micro_batch_size or None, loss_agg_mode=a.loss_agg_mode,
                      use_kl_loss=a.use_kl_loss, kl_loss_type=a.kl_loss_type, b1=o.b1, b2=o.b2,
                      weight_decay=o.weight_decay, grad_clip=o.grad_clip, group_size=config.rollout.group_size,
                      score_tiers=a.score_width_tiers)
        return cls(**{**fields, **overrides})


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

"""One compiled training step (docs/architecture.md#the-walk-of-one-training-step):

    rollout -> collapse diagnostics on the UNFILTERED batch -> normalised episode scores -> group filter
    (mask + compaction) -> old / reference log-probs, values -> token rewards (- KL) -> advantages
    -> loss scaling -> critic update -> actor update -> (TrainState', metrics)

    train_step = TrainStep(config, env, tokenizer, model_config, chat_format)
    state = train_step.init(key, actor_params)
    hyper = Hyper.from_config(config, env_params)
    step = jax.jit(train_step, donate_argnums=0)
    state, metrics = step(state, key, hyper)           # metrics: dict of f32 scalars

Everything that people sweep is in `Hyper` (traced: a new value never recompiles, and `vmap` over it works);
structure (algorithm, filter strategy, geometry, model) comes from the config and is static.

Differences from RAGEN's trainer: old log-probs are computed for the whole batch before filtering (the filter's
entropy metrics need them); RAGEN's `adjust_batch` duplicates or deletes kept rows to fill minibatches, here the
update skips or masks the rows of dropped groups instead; the collapse metrics run inside the step.
"""
from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp

from environments.pytrees import filled_like
from ragen_jax import filtering, sharding
from ragen_jax.algos import advantages as adv_lib
from ragen_jax.algos import presets
from ragen_jax.algos import rewards as rewards_lib
from ragen_jax.diagnostics import cross_logprobs, gradients, sampling
from ragen_jax.models import transformer
from ragen_jax.rollout.metrics import rollout_metrics
from ragen_jax.rollout.rollout import Rollout, Trajectory
from ragen_jax.train import batch as batch_lib
from ragen_jax.train import update


@flax.struct.dataclass
class Hyper:
    """Traced hyperparameters of a step (f32 scalars, plus the env's params pytree)."""

    actor: update.ActorHyper
    critic: update.CriticHyper
    top_p: jax.Array
    filter_value: jax.Array
    filter_eps: jax.Array
    gamma: jax.Array
    lam: jax.Array
    high_level_gamma: jax.Array
    kl_coef: jax.Array  # beta of the KL reward penalty (algo.use_kl_in_reward)
    env: Any

    @classmethod
    def from_config(cls, config, env_params) -> "Hyper":
        a, f = config.algo, config.filter
        f32 = jnp.float32
        return cls(actor=update.ActorHyper.from_config(config), critic=update.CriticHyper.from_config(config),
                   top_p=f32(config.rollout.top_p), filter_value=f32(f.value), filter_eps=f32(f.eps),
                   gamma=f32(a.gamma), lam=f32(a.lam), high_level_gamma=f32(a.high_level_gamma),
                   kl_coef=f32(a.kl_coef), env=env_params)


@flax.struct.dataclass
class TrainState:
    """step: i32[] steps done; actor/critic/ref: parameter pytrees (critic and ref None when unused);
    *_opt: optimizer states; collapse: the collapse diagnostics' EMA state."""

    step: jax.Array
    actor: Any
    actor_opt: Any
    critic: Any
    critic_opt: Any
    ref: Any
    collapse: dict


class TrainStep:
    """The static structure of a step, built once from the config; calling it runs one step (jit it).

    Args:
      config: a `configs/base.py` config checked by `ragen_jax.config.validate` (e.g. minibatches dividing the
        batch); env, tokenizer: the environment and its tokenizer;
      model_config: the policy's ModelConfig; chat_format: a `ragen_jax.models.chat.ChatFormat`.
    """

    def __init__(self, config, env, tokenizer, model_config, chat_format):
        r, d = config.rollout, config.diagnostics
        self.config, self.model_config = config, model_config
        self.num_groups, self.group_size = r.num_groups, r.group_size

        def rollout(num_groups: int, group_size: int) -> Rollout:
            return Rollout(env, tokenizer, chat_format, model_config, num_groups=num_groups, group_size=group_size,
                           max_turn=r.max_turn, response_length=r.response_length, max_len=r.max_model_len,
                           top_k=r.top_k, format_penalty=r.format_penalty)

        self.rollout = rollout(r.num_groups, r.group_size)
        self.update_config = update.UpdateConfig.from_config(config)
        self.use_critic, self.use_ref = presets.uses_critic(config), presets.uses_reference(config)
        self.collapse_options = dataclasses.replace(sampling.CollapseOptions.from_config(config),
                                                    max_prompt_len=r.max_model_len - 1)
        if d.collapse_every > 0 and model_config.max_seq_len < r.max_model_len - 1 + r.response_length:
            raise ValueError(f"model.max_seq_len = {model_config.max_seq_len} must be >= rollout.max_model_len - 1 + "
                             f"rollout.response_length = {r.max_model_len - 1 + r.response_length}: the collapse "
                             "diagnostics score reasoning after prompts of up to max_model_len - 1 tokens")
        self.analysis_rollout = None
        if d.grad_analysis_every > 0 and d.grad_analysis_num_groups > 0:
            self.analysis_rollout = rollout(d.grad_analysis_num_groups, d.grad_analysis_group_size or r.group_size)
        self.grad_options = gradients.GradAnalysisOptions.from_config(
            config, chunk_rows=math.gcd(16, self.rollout.batch_size))
        self.logits_fn = functools.partial(transformer.apply, model_config)
        self.values_fn = functools.partial(transformer.values, model_config)
        self.metric_prefix = config.env.name

    def init(self, key: jax.Array, actor_params) -> TrainState:
        """The state before step 1: the critic copies the actor's backbone, the reference is the initial actor.
        Every leaf is a fresh buffer (optimizer states share zero arrays otherwise), so the step can donate it."""
        critic = transformer.init_value_params(self.model_config, key, actor_params) if self.use_critic else None
        state = TrainState(
            step=jnp.int32(0), actor=actor_params, actor_opt=update.optimizer_init(actor_params, self.update_config),
            critic=critic, critic_opt=update.optimizer_init(critic, self.update_config) if self.use_critic else None,
            ref=actor_params if self.use_ref else None, collapse=sampling.init_state())
        return jax.tree.map(jnp.array, state)  # one buffer per leaf: the jitted step donates the state

    def _filter_values(self, scores, old_entropy, loss_mask) -> jax.Array:
        """f32[B] per-trajectory quantity of `filter.metric`."""
        metric = self.config.filter.metric
        tokens = loss_mask.sum(axis=1)
        if metric.startswith("entropy"):
            return (old_entropy * loss_mask).sum(axis=1) / jnp.maximum(tokens, 1.0)
        return tokens if metric == "length" else scores

    def __call__(self, state: TrainState, key: jax.Array, hyper: Hyper) -> tuple[TrainState, dict]:
        c, a = self.config, self.config.algo
        step = state.step + 1  # 1-based, as RAGEN's global_steps
        hyper = self._warmed_up(hyper, step)
        temperature = hyper.actor.temperature
        rollout_key, diag_key = jax.random.split(jax.random.fold_in(key, step))
        traj = sharding.shard_batch(self.rollout(state.actor, rollout_key, hyper.env, temperature, hyper.top_p))
        metrics = rollout_metrics(traj, self.group_size, self.metric_prefix)

        score_fn = functools.partial(cross_logprobs.cross_log_probs, self.model_config, state.actor,
                                     temperature=temperature)
        collapse_metrics, collapse_state = sampling.collapse_diagnostics_every(
            step, score_fn, batch_lib.reasoning_spans(traj), diag_key, state.collapse, self.collapse_options,
            c.diagnostics.std_eps, c.diagnostics.ema_decay)
        metrics.update(collapse_metrics)

        rows, kept, scores = self._prepare(state, traj, hyper, self.num_groups, self.group_size, True, metrics)
        metrics.update(self._gradient_analysis(step, state, diag_key, rows, kept, scores, traj.group_ids, hyper))
        critic, critic_opt = state.critic, state.critic_opt
        if self.use_critic:
            critic, critic_opt, critic_metrics = update.critic_update(
                self.values_fn, critic, critic_opt, rows, kept.kept_rows, hyper.critic, self.update_config)
            metrics.update(critic_metrics)

        def train_actor(_):
            return update.actor_update(self.logits_fn, state.actor, state.actor_opt, rows, kept.kept_rows, hyper.actor,
                                       self.update_config)

        def warm_up(_):  # critic warm-up steps leave the actor unchanged (metrics zero)
            return state.actor, state.actor_opt, filled_like(lambda operand: train_actor(operand)[2], 0, None)

        actor, actor_opt, actor_metrics = jax.lax.cond(step > a.critic_warmup, train_actor, warm_up, None)
        metrics.update(actor_metrics)
        metrics["train/step"] = step.astype(jnp.float32)
        new_state = TrainState(step=step, actor=actor, actor_opt=actor_opt, critic=critic, critic_opt=critic_opt,
                               ref=state.ref, collapse=collapse_state)
        return new_state, {k: jnp.asarray(v, jnp.float32) for k, v in metrics.items()}

    def _prepare(self, state: TrainState, traj: Trajectory, hyper: Hyper, num_groups: int, group_size: int,
                 filtered: bool, metrics: dict):
        """Scores, filter (or keep everything), log-probs, values, token rewards and advantages of a rollout batch,
        compacted: (UpdateBatch rows with the kept rows first, FilterResult, normalised episode scores f32[B])."""
        c, a, f = self.config, self.config.algo, self.config.filter
        temperature = hyper.actor.temperature
        tokens, positions, attention, loss_mask = batch_lib.model_inputs(traj)
        old_logp, old_entropy = update.token_logprobs(self.logits_fn, state.actor, tokens, positions, attention,
                                                      temperature, self.update_config.vocab_chunk)
        metrics["actor/entropy"] = (old_entropy * loss_mask).sum() / jnp.maximum(loss_mask.sum(), 1.0)
        scores = rewards_lib.normalize_group_rewards(
            traj.episode_reward.reshape(num_groups, group_size), c.rollout.reward_normalization).reshape(-1)
        values_for_filter = self._filter_values(scores, old_entropy, loss_mask).reshape(num_groups, group_size)
        if filtered:
            kept = filtering.apply_filter(values_for_filter, f.metric, f.strategy, hyper.filter_value, f.type,
                                          f.include_zero, f.top_p_mode, hyper.filter_eps)
        else:  # top-p 1 over all groups keeps every group
            kept = filtering.apply_filter(values_for_filter, f.metric, "top_p", 1.0, f.type, True, f.top_p_mode)
        metrics.update(kept.metrics)

        zeros = jnp.zeros_like(old_logp)
        ref_logp = zeros
        if self.use_ref:
            ref_logp = update.token_logprobs(self.logits_fn, state.ref, tokens, positions, attention, temperature,
                                             self.update_config.vocab_chunk)[0]
        values = zeros
        if self.use_critic:
            values = update.token_values(self.values_fn, state.critic, tokens, positions, attention)
        token_rewards = rewards_lib.last_token_rewards(scores, loss_mask)
        if a.use_kl_in_reward:
            token_rewards, kl_metrics = adv_lib.kl_in_reward(token_rewards, old_logp, ref_logp, loss_mask,
                                                             hyper.kl_coef, a.kl_penalty)
            metrics.update(kl_metrics)
        advantages, returns = self._advantages(token_rewards, values, loss_mask, kept, traj.group_ids, hyper,
                                               num_groups, metrics)
        metrics.update(self._advantage_metrics(advantages, returns, loss_mask * kept.row_mask[:, None]))
        rows = sharding.shard_batch(filtering.permute_rows(update.UpdateBatch(
            tokens=tokens, positions=positions, attention_mask=attention, loss_mask=loss_mask, old_logp=old_logp,
            advantages=advantages, ref_logp=ref_logp, returns=returns, old_values=values), kept.perm))
        return rows, kept, scores

    def _advantages(self, token_rewards, values, loss_mask, kept: filtering.FilterResult, group_ids, hyper: Hyper,
                    num_groups: int, metrics: dict):
        """(advantages, returns) f32[B, T] over the kept rows (docs/rewards_and_objectives.md); adds metrics in
        place."""
        a, f = self.config.algo, self.config.filter
        mask = loss_mask * kept.row_mask[:, None]
        if self.use_critic:
            gae_fn = adv_lib.bi_level_gae if a.bi_level_gae else adv_lib.gae
            extra = (hyper.high_level_gamma,) if a.bi_level_gae else ()
            advantages, returns = gae_fn(token_rewards, values, mask, hyper.gamma, hyper.lam, *extra)
        else:
            lengths = loss_mask.sum(axis=1) if a.grpo_length_weight else None
            row_scores = token_rewards.sum(axis=1)
            per_row = adv_lib.grpo(row_scores, group_ids, num_groups, a.norm_adv_by_std, lengths=lengths,
                                   row_mask=kept.row_mask)
            # GRPO only: it needs the per-group std (docs/filtering.md#loss-scaling-and-soft-reweighting)
            if a.soft_advantage_reweight:
                group_std = filtering.group_stats(row_scores.reshape(num_groups, -1))["std"]
                weights, reweight_metrics = filtering.soft_advantage_weights(group_std, kept.group_mask)
                per_row = per_row * weights[group_ids]
                metrics.update(reweight_metrics)
            advantages = returns = per_row[:, None] * mask
        advantages = filtering.filter_loss_scaling(advantages, kept.kept_ratio, f.loss_scaling)
        if a.zero_task_advantage:
            advantages = jnp.zeros_like(advantages)
        return advantages * mask, returns

    def _warmed_up(self, hyper: Hyper, step) -> Hyper:
        """Linear learning-rate warm-up over `optim.warmup_steps` steps (lr * min(1, step / warmup))."""
        warmup = self.config.optim.warmup_steps
        if warmup <= 0:
            return hyper
        scale = jnp.minimum(1.0, step.astype(jnp.float32) / warmup)
        return hyper.replace(actor=hyper.actor._replace(lr=hyper.actor.lr * scale),
                             critic=hyper.critic._replace(lr=hyper.critic.lr * scale))

    def _gradient_analysis(self, step, state: TrainState, key, rows: update.UpdateBatch, kept: filtering.FilterResult,
                           scores, group_ids, hyper: Hyper) -> dict[str, jax.Array]:
        """Gradient-component norms by reward-variance bucket (docs/diagnostics.md#gradient-analysis) every
        `diagnostics.grad_analysis_every` steps (NaN on other steps; nothing when 0): on the kept rows of the training
        batch, or, with `diagnostics.grad_analysis_num_groups` > 0, on a separate unfiltered rollout of that many groups
        (rolled out only on analysis steps). Parameters are untouched."""
        options = self.grad_options
        if options.every <= 0:
            return {}
        a = self.config.algo
        actor_hyper = hyper.actor
        loss_hyper = gradients.LossHyper(
            clip_low=actor_hyper.clip_ratio_low, clip_high=actor_hyper.clip_ratio_high, clip_c=actor_hyper.clip_ratio_c,
            entropy_coeff=actor_hyper.entropy_coeff,
            kl_coef=actor_hyper.kl_loss_coef if a.use_kl_loss else jnp.float32(0.0),
            temperature=actor_hyper.temperature)

        def analyse(rows, kept, scores, group_ids, num_groups, group_size, chunk_rows):
            batch = gradients.GradBatch(
                tokens=rows.tokens, positions=rows.positions, attention_mask=rows.attention_mask,
                loss_mask=rows.loss_mask, old_logp=rows.old_logp, advantages=rows.advantages,
                ref_logp=rows.ref_logp if a.use_kl_loss else None,
                row_valid=jnp.arange(rows.tokens.shape[0]) < kept.kept_rows, group_ids=group_ids[kept.perm],
                group_rv=filtering.group_stats(scores.reshape(num_groups, group_size))["std"])
            return gradients.gradient_analysis(
                self.logits_fn, state.actor, batch, loss_hyper, agg_mode=options.agg_mode, kl_type=options.kl_type,
                bucket_mode=options.bucket_mode, num_buckets=options.num_buckets, chunk_rows=chunk_rows)

        def run(_):
            if self.analysis_rollout is None:
                return analyse(rows, kept, scores, group_ids, self.num_groups, self.group_size, options.chunk_rows)
            ro = self.analysis_rollout
            traj = ro(state.actor, jax.random.fold_in(key, 1), hyper.env, actor_hyper.temperature, hyper.top_p)
            rows_a, kept_a, scores_a = self._prepare(state, traj, hyper, ro.num_groups, ro.group_size, False, {})
            return analyse(rows_a, kept_a, scores_a, traj.group_ids, ro.num_groups, ro.group_size,
                           math.gcd(16, ro.batch_size))

        def skip(_):
            return filled_like(run, jnp.nan, None)

        return jax.lax.cond(gradients.should_run(step, options.every), run, skip, None)

    @staticmethod
    def _advantage_metrics(advantages, returns, mask) -> dict[str, jax.Array]:
        count = jnp.maximum(mask.sum(), 1.0)
        return {"critic/advantages/mean": (advantages * mask).sum() / count,
                "critic/returns/mean": (returns * mask).sum() / count}

"""One compiled training step (docs/architecture.md#the-walk-of-one-training-step):

    rollout -> collapse diagnostics on the UNFILTERED batch -> normalised episode scores -> group filter
    (mask + compaction) -> old / reference log-probs, values -> token rewards (- KL) -> advantages
    -> loss scaling -> critic update -> actor update -> (TrainState', metrics)

    train_step = TrainStep(config, env, tokenizer, model_config, chat_format)
    state = train_step.init(key, actor_params)
    hyper = Hyper.from_config(config, env_params)
    step = jax.jit(train_step, donate_argnums=0)
    state, metrics = step(state, key, hyper)           # metrics: dict of f32 scalars
    state, metrics, sample = jax.jit(train_step.with_transcripts)(state, key, hyper)  # + transcripts.Sample

Everything that people sweep is in `Hyper` (traced: a new value never recompiles, and `vmap` over it works);
structure (algorithm, filter strategy, geometry, model) is `StepOptions` (`train.step_options`), read once from the
config and static. The step is four PHASES, each a pure function `(state, key, hyper, *inputs)` that returns its
outputs and its metrics, merged in phase order: `rollout_phase` (generation + envs, and the batch's first rows for
the transcripts), `diagnostics_phase` (collapse diagnostics), `prepare_phase` (log-probs, values, scores, filter,
advantages), `update_phase` (gradient analysis, critic and actor updates). Jitted together they are one XLA program;
`train.phases.PhasedStep` (`logging.phase_timings`) runs them as four programs to time each.

Differences from RAGEN's trainer: old log-probs are computed for the whole batch before filtering (the filter's
entropy metrics need them); RAGEN's `adjust_batch` duplicates or deletes kept rows to fill minibatches, here the
update skips or masks the rows of dropped groups instead; the collapse metrics run inside the step.
"""
from __future__ import annotations

import functools
import math
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp

from environments.pytrees import filled, traced_once
from ragen_jax import config as config_lib
from ragen_jax import filtering, sharding
from ragen_jax.algos import advantages as adv_lib
from ragen_jax.algos import estimators
from ragen_jax.algos import rewards as rewards_lib
from ragen_jax.algos import scoring, update_inputs
from ragen_jax.diagnostics import cross_logprobs, families, gradients
from ragen_jax.models import lm
from ragen_jax.rollout.env_metrics import rollout_metrics
from ragen_jax.rollout.rollout import Rollout, Trajectory
from ragen_jax.train import batch as batch_lib
from ragen_jax.train import transcripts, update
from ragen_jax.train.hyper import Hyper
from ragen_jax.train.step_options import StepOptions


PHASES = config_lib.STEP_PHASES  # TrainStep.with_transcripts' phases, in order


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
      config: a `ragen_jax/defaults.py` config checked by `ragen_jax.config.validate` (e.g. minibatches dividing the
        batch); env, tokenizer: the environment and its tokenizer;
      model_config: the policy's ModelConfig, built as the `model.arch` architecture (`models.lm.make`) into the
        step's `model`; chat_format: a `ragen_jax.models.chat.ChatFormat`.
    """

    def __init__(self, config, env, tokenizer, model_config, chat_format):
        r, d = config.rollout, config.diagnostics
        self.model = lm.make(config.model.arch, model_config)

        def rollout(num_groups: int, group_size: int) -> Rollout:
            return Rollout(env, tokenizer, chat_format, self.model, num_groups=num_groups, group_size=group_size,
                           max_turn=r.max_turn, response_length=r.response_length, max_len=r.max_model_len,
                           top_k=r.top_k, format_penalty=r.format_penalty)

        self.rollout = rollout(r.num_groups, r.group_size)
        self.options = StepOptions.from_config(config)
        if d.collapse_every > 0 and model_config.max_seq_len < r.max_model_len - 1 + r.response_length:
            raise config_lib.ConfigError(
                "model.max_seq_len", model_config.max_seq_len, f"must be >= rollout.max_model_len - 1 + "
                f"rollout.response_length = {r.max_model_len - 1 + r.response_length}: the collapse diagnostics score "
                "reasoning after prompts of up to max_model_len - 1 tokens")
        self.analysis_rollout = None
        if d.grad_analysis_every > 0 and d.grad_analysis_num_groups > 0:
            self.analysis_rollout = rollout(d.grad_analysis_num_groups, d.grad_analysis_group_size or r.group_size)
        self.logits_fn = self.model  # a CausalLM: scorers unembed a few positions at a time
        self.values_fn = self.model.values

    def init(self, key: jax.Array, actor_params) -> TrainState:
        """The state before step 1: the critic copies the actor's backbone, the reference is the initial actor.
        Every leaf is a fresh buffer (optimizer states share zero arrays otherwise), so the step can donate it."""
        o = self.options
        critic = self.model.init_value_params(key, actor_params) if o.use_critic else None
        state = TrainState(
            step=jnp.int32(0), actor=actor_params, actor_opt=update.optimizer_init(actor_params, o.update_config),
            critic=critic, critic_opt=update.optimizer_init(critic, o.update_config) if o.use_critic else None,
            ref=actor_params if o.use_ref else None, collapse=families.init_state())
        return jax.tree.map(jnp.array, state)  # one buffer per leaf: the jitted step donates the state

    def __call__(self, state: TrainState, key: jax.Array, hyper: Hyper) -> tuple[TrainState, dict]:
        """One step: (the new TrainState, a dict of f32 scalar metrics)."""
        return self.with_transcripts(state, key, hyper)[:2]

    def with_transcripts(self, state: TrainState, key: jax.Array, hyper: Hyper, phase=None
                         ) -> tuple[TrainState, dict, transcripts.Sample]:
        """`__call__` that also returns the first `transcripts.COUNT` trajectories of its training batch (a
        `transcripts.Sample`, rows of the rollout before this step's update). The step is its PHASES in order, each a
        pure function (state, key, hyper, *inputs) run by `phase(name, fn, *args) -> fn(*args)`: by default called
        here (one compiled program when this is jitted), by `train.phases.PhasedStep` each as its own timed program."""
        phase = phase or _call
        traj, traj_metrics, sample = phase("rollout", self.rollout_phase, state, key, hyper)
        collapse, collapse_metrics = phase("diagnostics", self.diagnostics_phase, state, key, hyper, traj)
        prepared, prepare_metrics = phase("prepare", self.prepare_phase, state, key, hyper, traj)
        new_state, update_metrics = phase("update", self.update_phase, state, key, hyper, traj.group_ids, collapse,
                                          prepared)
        return new_state, {**traj_metrics, **collapse_metrics, **prepare_metrics, **update_metrics}, sample

    def rollout_phase(self, state: TrainState, key: jax.Array, hyper: Hyper
                      ) -> tuple[Trajectory, dict, transcripts.Sample]:
        """(the training batch: a `Trajectory` of B = num_groups * group_size rows, its env metrics, its first
        `transcripts.COUNT` rows)."""
        o = self.options
        _, hyper, rollout_key, _ = self._begin(state, key, hyper)
        traj = sharding.shard_batch(self.rollout(state.actor, rollout_key, hyper.env, hyper.actor.temperature,
                                                 hyper.top_p))
        return traj, _f32(rollout_metrics(traj, o.group_size, o.metric_prefix)), transcripts.select(traj, self.rollout)

    def diagnostics_phase(self, state: TrainState, key: jax.Array, hyper: Hyper, traj: Trajectory
                          ) -> tuple[dict, dict]:
        """(the collapse diagnostics' next EMA state, their metrics) on the unfiltered batch, on their schedule."""
        o = self.options
        step, hyper, _, diag_key = self._begin(state, key, hyper)
        score_fn = functools.partial(cross_logprobs.cross_log_probs, self.model, state.actor,
                                     temperature=hyper.actor.temperature, num_tiers=o.collapse.width_tiers)
        metrics, collapse_state = families.collapse_diagnostics_every(
            step, score_fn, batch_lib.reasoning_spans(traj), diag_key, state.collapse, o.collapse, o.std_eps,
            o.ema_decay)
        return collapse_state, _f32(metrics)

    def prepare_phase(self, state: TrainState, key: jax.Array, hyper: Hyper, traj: Trajectory) -> tuple[tuple, dict]:
        """((UpdateBatch rows with the kept rows first, FilterResult, episode scores f32[B]), metrics): `_prepare`
        of the training batch under the config's filter."""
        _, hyper, _, _ = self._begin(state, key, hyper)
        rows, kept, scores, metrics = self._prepare_filtered(state, traj, hyper)
        return (rows, kept, scores), _f32(metrics)

    def update_phase(self, state: TrainState, key: jax.Array, hyper: Hyper, group_ids: jax.Array, collapse: dict,
                     prepared: tuple) -> tuple[TrainState, dict]:
        """(the new TrainState, metrics): gradient analysis, critic and actor updates on `prepare_phase`'s
        `prepared`; group_ids: i32[B] the batch's groups; collapse: `diagnostics_phase`'s state."""
        o = self.options
        step, hyper, _, diag_key = self._begin(state, key, hyper)
        rows, kept, scores = prepared
        analysis_metrics = self._gradient_analysis(step, state, diag_key, rows, kept, scores, group_ids, hyper)
        critic, critic_opt, critic_metrics = state.critic, state.critic_opt, {}
        if o.use_critic:
            critic, critic_opt, critic_metrics = update.critic_update(
                self.values_fn, critic, critic_opt, rows, kept.kept_rows, hyper.critic, o.update_config)

        def train_actor(_):
            return update.actor_update(self.logits_fn, state.actor, state.actor_opt, rows, kept.kept_rows, hyper.actor,
                                       o.update_config)

        train_actor, shapes = traced_once(train_actor, None)

        def warm_up(_):  # critic warm-up steps leave the actor unchanged (metrics zero)
            return state.actor, state.actor_opt, filled(shapes[2], 0)

        actor, actor_opt, actor_metrics = jax.lax.cond(step > o.critic_warmup, train_actor, warm_up, None)
        metrics = {**analysis_metrics, **critic_metrics, **actor_metrics, "train/step": step.astype(jnp.float32)}
        new_state = TrainState(step=step, actor=actor, actor_opt=actor_opt, critic=critic, critic_opt=critic_opt,
                               ref=state.ref, collapse=collapse)
        return new_state, _f32(metrics)

    def _begin(self, state: TrainState, key: jax.Array, hyper: Hyper):
        """(step i32[], 1-based as RAGEN's global_steps; the warmed-up hyper; rollout key; diagnostics key) of the
        step after `state`: every phase derives the same ones."""
        step = state.step + 1
        rollout_key, diag_key = jax.random.split(jax.random.fold_in(key, step))
        return step, self._warmed_up(hyper, step), rollout_key, diag_key

    def _prepare_filtered(self, state: TrainState, traj: Trajectory, hyper: Hyper):
        """`_prepare` of the training batch under the config's group filter."""
        o = self.options

        def select(values):
            return filtering.apply_filter(values, o.filter_metric, o.filter_strategy, hyper.filter_value, o.filter_type,
                                          hyper.filter_include_zero, o.filter_top_p_mode, hyper.filter_eps)

        return self._prepare(state, traj, hyper, o.num_groups, o.group_size, select)

    def _prepare_unfiltered(self, state: TrainState, traj: Trajectory, hyper: Hyper, num_groups: int,
                            group_size: int):
        """`_prepare` of a `num_groups` x `group_size` batch that keeps every group (top-p 1 over all groups)."""
        o = self.options

        def select(values):
            return filtering.apply_filter(values, o.filter_metric, "top_p", 1.0, o.filter_type, True,
                                          o.filter_top_p_mode)

        return self._prepare(state, traj, hyper, num_groups, group_size, select)

    def _prepare(self, state: TrainState, traj: Trajectory, hyper: Hyper, num_groups: int, group_size: int, select):
        """Scores, filter, log-probs, values, token rewards and advantages of a rollout batch, compacted.

        select: f32[num_groups, group_size] per-trajectory filter quantities -> `filtering.FilterResult`.
        Returns (UpdateBatch rows with the kept rows first, FilterResult, normalised episode scores f32[B], metrics).
        """
        o = self.options
        temperature = hyper.actor.temperature
        tokens, positions, attention, loss_mask = batch_lib.model_inputs(traj)
        tiers = o.update_config.score_tiers
        old_logp, old_entropy = scoring.token_logprobs(self.logits_fn, state.actor, tokens, positions, attention,
                                                      temperature, o.update_config.vocab_chunk, group_size=group_size,
                                                      max_tiers=tiers)
        metrics = {"actor/entropy": (old_entropy * loss_mask).sum() / jnp.maximum(loss_mask.sum(), 1.0)}
        scores = rewards_lib.normalize_group_rewards(
            traj.episode_reward.reshape(num_groups, group_size), o.reward_normalization).reshape(-1)
        kept = select(self._filter_values(scores, old_entropy, loss_mask).reshape(num_groups, group_size))
        metrics.update(kept.metrics)

        zeros = jnp.zeros_like(old_logp)
        ref_logp = zeros
        if o.use_ref:
            ref_logp = scoring.token_logprobs(self.logits_fn, state.ref, tokens, positions, attention, temperature,
                                             o.update_config.vocab_chunk, group_size=group_size, max_tiers=tiers)[0]
        values = zeros
        if o.use_critic:
            values = scoring.token_values(self.values_fn, state.critic, tokens, positions, attention, max_tiers=tiers)
        token_rewards = rewards_lib.last_token_rewards(scores, loss_mask)
        if o.use_kl_in_reward:
            token_rewards, kl_metrics = adv_lib.kl_in_reward(token_rewards, old_logp, ref_logp, loss_mask,
                                                             hyper.kl_coef, o.kl_penalty)
            metrics.update(kl_metrics)
        advantages, returns, advantage_metrics = self._advantages(token_rewards, values, loss_mask, kept,
                                                                  traj.group_ids, hyper)
        metrics.update(advantage_metrics)
        rows = sharding.shard_batch(filtering.permute_rows(update_inputs.UpdateBatch(
            tokens=tokens, positions=positions, attention_mask=attention, loss_mask=loss_mask, old_logp=old_logp,
            advantages=advantages, ref_logp=ref_logp, returns=returns, old_values=values), kept.perm))
        return rows, kept, scores, metrics

    def _filter_values(self, scores, old_entropy, loss_mask) -> jax.Array:
        """f32[B] per-trajectory quantity of `filter.metric` (its registered `filtering.FILTER_QUANTITIES` one)."""
        quantity = filtering.FILTER_METRICS[self.options.filter_metric].quantity
        tokens = loss_mask.sum(axis=1)
        if quantity == "entropy":
            return (old_entropy * loss_mask).sum(axis=1) / jnp.maximum(tokens, 1.0)
        return tokens if quantity == "length" else scores

    def _advantages(self, token_rewards, values, loss_mask, kept: filtering.FilterResult, group_ids, hyper: Hyper):
        """(advantages, returns) f32[B, T] over the kept rows of the `algo.adv_estimator` entry of the estimator
        registry (docs/rewards_and_objectives.md#advantage-estimators), then filter loss scaling and
        `zero_task_advantage`; and their metrics."""
        o = self.options
        mask = loss_mask * kept.row_mask[:, None]
        inputs = estimators.AdvantageInputs(token_rewards=token_rewards, values=values, loss_mask=loss_mask, mask=mask,
                                            group_ids=group_ids, row_mask=kept.row_mask, group_mask=kept.group_mask)
        advantages, returns, estimator_metrics = estimators.estimate(
            o.adv_estimator, inputs, hyper.advantage,
            o.advantage)
        advantages = filtering.filter_loss_scaling(advantages, kept.kept_ratio, o.loss_scaling)
        advantages = jnp.where(hyper.zero_task_advantage, 0.0, advantages) * mask
        return advantages, returns, {**estimator_metrics, **_advantage_metrics(advantages, returns, mask)}

    def _warmed_up(self, hyper: Hyper, step) -> Hyper:
        """Linear learning-rate warm-up over `optim.warmup_steps` steps (lr * min(1, step / warmup))."""
        warmup = self.options.warmup_steps
        if warmup <= 0:
            return hyper
        scale = jnp.minimum(1.0, step.astype(jnp.float32) / warmup)
        return hyper.replace(actor=hyper.actor._replace(lr=hyper.actor.lr * scale),
                             critic=hyper.critic._replace(lr=hyper.critic.lr * scale))

    def _gradient_analysis(self, step, state: TrainState, key, rows: update_inputs.UpdateBatch,
                           kept: filtering.FilterResult, scores, group_ids, hyper: Hyper) -> dict[str, jax.Array]:
        """Gradient-component norms by reward-variance bucket (docs/diagnostics.md#gradient-analysis) every
        `diagnostics.grad_analysis_every` steps (NaN on other steps; nothing when 0): on the kept rows of the training
        batch, or, with `diagnostics.grad_analysis_num_groups` > 0, on a separate unfiltered rollout of that many groups
        (rolled out only on analysis steps). Parameters are untouched."""
        o, options = self.options, self.options.grad_analysis
        if options.every <= 0:
            return {}

        def analyse(rows, kept, scores, group_ids, num_groups, group_size, chunk_rows):
            return gradients.gradient_analysis(
                self.logits_fn, state.actor, rows, hyper.actor, jnp.arange(rows.tokens.shape[0]) < kept.kept_rows,
                group_ids[kept.perm], filtering.group_stats(scores.reshape(num_groups, group_size))["std"],
                agg_mode=options.agg_mode, use_kl_loss=options.use_kl_loss, kl_type=options.kl_type,
                bucket_mode=options.bucket_mode, num_buckets=options.num_buckets, chunk_rows=chunk_rows)

        def run(_):
            if self.analysis_rollout is None:
                return analyse(rows, kept, scores, group_ids, o.num_groups, o.group_size, options.chunk_rows)
            ro = self.analysis_rollout
            traj = ro(state.actor, jax.random.fold_in(key, 1), hyper.env, hyper.actor.temperature, hyper.top_p)
            rows_a, kept_a, scores_a, _ = self._prepare_unfiltered(state, traj, hyper, ro.num_groups, ro.group_size)
            return analyse(rows_a, kept_a, scores_a, traj.group_ids, ro.num_groups, ro.group_size,
                           math.gcd(16, ro.batch_size))

        run, shapes = traced_once(run, None)
        return jax.lax.cond(gradients.should_run(step, options.every), run, lambda _: filled(shapes, jnp.nan), None)


def _call(name: str, fn, *args):
    """The default phase runner of `TrainStep.with_transcripts`: calls the phase."""
    del name
    return fn(*args)


def _f32(metrics: dict) -> dict[str, jax.Array]:
    return {k: jnp.asarray(v, jnp.float32) for k, v in metrics.items()}


def _advantage_metrics(advantages, returns, mask) -> dict[str, jax.Array]:
    """Masked means of the advantages and returns f32[B, T] over `mask` f32[B, T]."""
    count = jnp.maximum(mask.sum(), 1.0)
    return {"critic/advantages/mean": (advantages * mask).sum() / count,
            "critic/returns/mean": (returns * mask).sum() / count}

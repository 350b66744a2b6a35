"""Validation rollouts (docs/prompts_and_parsing.md#batch-geometry-and-seeding): the same prompts every evaluation,
metrics under `val-env/`.

    validator = Validator(config, env, tokenizer, model_config, chat_format)
    evaluate = jax.jit(validator)                       # compiled once; params change, shapes do not
    keys = success_keys(jax.eval_shape(validator, params, env_params, jnp.float32(1.0)))  # traces, runs nothing
    low = filtering.validation_success_init(len(keys))
    for step in range(total_steps + 1):                 # step = number of updates done so far
        if step:
            state, metrics = step_fn(state, key, hyper)
        if should_validate(step, config.train.test_freq, total_steps):
            val = to_floats(evaluate(state.actor, hyper.env, jnp.float32(1.0)))
            low, stop = filtering.validation_success_update(
                low, jnp.asarray([val[k] for k in keys]),
                config.filter.val_success_floor, config.filter.val_success_patience)
            # stop -> `early_stopped/low_validation_success`

RAGEN resets `es_manager.val.env_groups` x `group_size` envs with the seeds 123, 124, ... at every evaluation, so
each validation scores the same prompts. Here the whole rollout key (env resets, generation, env steps) is
`jax.random.key(rollout.val_seed)`: two evaluations of the same params give identical metrics, and any change
comes from the params. The prompts are not RAGEN's seed-123 boards (our envs draw boards from JAX keys).

Metric keys are RAGEN's: every key of the training rollout's env metrics (`rollout.env_metrics.rollout_metrics`, with
the env's name as tag) prefixed by `val-env/`, e.g. `val-env/frozen_lake/success`,
`val-env/frozen_lake/pass@1`, `val-env/response_length/mean` (RAGEN's `_validate` prefixes each env-manager
metric the same way), so no validation key collides with a training key.

Difference from RAGEN's inference prompts: none for validation. The "No valid action provided previously..."
warning (docs/prompts_and_parsing.md) is in every rollout here, validation and training alike; RAGEN drops it only when
it rebuilds training sequences (docs/differences.md#prompts), which is the training rollout's concern, not this
module's.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from ragen_jax.models import lm
from ragen_jax.rollout.env_metrics import rollout_metrics
from ragen_jax.rollout.rollout import Rollout, Trajectory

PREFIX = "val-env"


def should_validate(step: int, test_freq: int, total_steps: int) -> bool:
    """Whether the loop validates the params after `step` updates (step 0 = before training).

    RAGEN (`agent_trainer.fit`): before training, then after every step that is a multiple of `test_freq` and
    after the last step. `test_freq <= 0` means never (RAGEN would still validate once before training,
    `trainer.val_before_train`).
    """
    if test_freq <= 0:
        return False
    return step == 0 or step % test_freq == 0 or step == total_steps


def success_keys(metrics) -> list[str]:
    """The sorted `val-env/<tag>/success` keys of `metrics` (a dict or its keys): the per-env success rates
    that `filtering.validation_success_update` takes, in a fixed order (docs/filtering.md#early-stops, rule 3)."""
    return sorted(k for k in metrics if k.startswith(PREFIX + "/") and k.endswith("/success"))


def validation_metrics(traj: Trajectory, group_size: int, tag: str) -> dict[str, jax.Array]:
    """`rollout_metrics(traj, group_size, tag)` with every key prefixed by `val-env/` (f32 scalars)."""
    return {f"{PREFIX}/{k}": v for k, v in rollout_metrics(traj, group_size, tag).items()}


class Validator:
    """A rollout of `rollout.val_num_groups` x `rollout.val_group_size` trajectories sampled at
    `rollout.val_temperature` from the fixed key `rollout.val_seed`; every other rollout setting (turns,
    response length, buffer length, top-k, format penalty) is the training rollout's (`train.step.TrainStep`).

    Args:
      config: a validated `ragen_jax/defaults.py` config; env, tokenizer: the environment and its tokenizer;
      model_config: the policy's ModelConfig, built as the `model.arch` architecture (`models.lm.make`);
      chat_format: a `ragen_jax.models.chat.ChatFormat`.
    """

    def __init__(self, config, env, tokenizer, model_config, chat_format):
        r = config.rollout
        model = lm.make(config.model.arch, model_config)
        self.rollout = Rollout(env, tokenizer, chat_format, model, num_groups=r.val_num_groups,
                               group_size=r.val_group_size, max_turn=r.max_turn, response_length=r.response_length,
                               max_len=r.max_model_len, top_k=r.top_k, format_penalty=r.format_penalty)
        self.group_size = r.val_group_size
        self.temperature = float(r.val_temperature)
        self.seed = int(r.val_seed)
        self.tag = config.env.name

    def key(self) -> jax.Array:
        """The rollout key of every evaluation (resets, generation and env steps derive from it)."""
        return jax.random.key(self.seed)

    def run(self, params, env_params, top_p, temperature=None) -> tuple[Trajectory, dict[str, jax.Array]]:
        """(the validation batch, its metrics): B = val_num_groups * val_group_size trajectories, for logging
        sample generations as RAGEN does (`trainer.generations_to_log_to_wandb.val`). `temperature` (f32, may be
        traced) replaces `rollout.val_temperature` (a constant of the compiled program)."""
        temperature = jnp.float32(self.temperature) if temperature is None else temperature
        traj = self.rollout(params, self.key(), env_params, temperature, top_p)
        return traj, validation_metrics(traj, self.group_size, self.tag)

    def __call__(self, params, env_params, top_p) -> dict[str, jax.Array]:
        """Validation metrics of `params` (dict of f32 scalars, keys under `val-env/`); pure and jittable.

        top_p: f32 scalar nucleus threshold (traced). RAGEN samples validation with verl's `val_kwargs` (top_p
        1.0 unless overridden) rather than the training top_p; pass `jnp.float32(1.0)` for that.
        """
        return self.run(params, env_params, top_p)[1]

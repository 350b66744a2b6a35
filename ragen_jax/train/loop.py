"""The host loop around the compiled step: build, warm start or resume, step, validate, log, checkpoint, stop early.

    state, history = train(config)          # config from `ragen_jax.config.load` or a configs/*.py file

Only this loop touches the host: it logs the step's metrics (console, `<logging.dir>/metrics.jsonl`,
TensorBoard), validates the actor before training and every `train.test_freq` steps (`train.validation`, metrics
under `val-env/` in the same step's row; step 0 is the untrained policy), saves checkpoints every
`checkpoint.save_freq` steps and at the end, and runs RAGEN's early stops (docs/filtering.md#early-stops,
`train.early_stops`); unlike RAGEN, which stops before that step's actor update, the step has already updated when the
loop sees its metrics. The stop states travel in the checkpoints. The step key is the same every step (the step folds
its own counter in), so a resumed run repeats an uninterrupted one exactly. The files, the resume-or-start decision
and the progress bar are `train.host.RunFiles`, shared with the sweep and closed on any exit (a failing step too).

The step runs on the mesh of `config.mesh` (`ragen_jax.sharding`): the batch split over data x fsdp, parameters
and optimizer states split over fsdp; with one device that is the plain single-device step. Vectorised sweeps
(`mesh.sweep` > 1) run through `ragen_jax.train.sweep`. Multi-host: `ragen_jax.distributed.initialize()` first,
then the same call on every process; only process 0 logs and writes metrics.
"""
from __future__ import annotations

import time
from typing import Callable

import jax
import jax.numpy as jnp

from ragen_jax import config as config_lib
from ragen_jax import distributed, sharding
from ragen_jax.train import sft, validation
from ragen_jax.train.build import build
from ragen_jax.train.early_stops import EarlyStops
from ragen_jax.train.host import RunFiles
from ragen_jax.train.metrics import summary_line, to_floats
from ragen_jax.train.step import Hyper, TrainStep
from ragen_jax.train.validation import Validator

SUMMARY_KEYS = ("success", "episode_reward", "rollout/filter_kept_ratio", "actor/entropy",
                "collapse_first_turn_sample/mi_estimate", "collapse_trajectory_sample/mi_estimate")
# validation runs at RAGEN's `val_kwargs` top_p of 1.0, not the training top_p
VALIDATION_TOP_P = 1.0


def run_keys(seed: int) -> tuple[jax.Array, jax.Array, jax.Array]:
    """(init_key, sft_key, step_key) of a run with `train.seed` = seed."""
    return tuple(jax.random.split(jax.random.key(seed), 3))


def summary_keys(config) -> tuple[str, ...]:
    return tuple(f"{config.env.name}/{k}" if "/" not in k else k for k in SUMMARY_KEYS)


def initial_params(config, parts, train_step: TrainStep, sft_key: jax.Array, log: Callable[[str], None] | None):
    """The actor's parameters before RL: the built model, warm-started on environment demonstrations when
    `train.sft_steps` > 0 (`train.sft`)."""
    t = config.train
    if t.sft_steps <= 0:
        return parts.params
    params, _ = sft.warm_start(train_step.rollout, parts.tokenizer, parts.params, parts.env_params, sft_key,
                               t.sft_steps, t.sft_lr, batch_size=t.sft_batch_size or None,
                               oracle_prob=t.sft_oracle_prob, log=log)
    return params


def make_validator(config, parts):
    """(jitted validator params -> metrics, its success keys), or (None, []) when `train.test_freq` <= 0."""
    if config.train.test_freq <= 0:
        return None, []
    validator = Validator(config, parts.env, parts.tokenizer, parts.model_config, parts.chat_format)
    evaluate = jax.jit(lambda params: validator(params, parts.env_params, jnp.float32(VALIDATION_TOP_P)))
    return evaluate, validation.success_keys(jax.eval_shape(evaluate, parts.params))


def train(config, log: Callable[[str], None] | None = print) -> tuple[object, list[dict]]:
    """Runs `config.train.total_steps` steps (fewer on an early stop). Returns (final TrainState, metrics per step)."""
    config_lib.validate(config)
    main = distributed.is_main_process()
    log = log if main else None
    if config.mesh.sweep != 1:
        raise config_lib.ConfigError("mesh.sweep", config.mesh.sweep,
                                     "a single run uses sweep = 1; vectorised sweeps run through ragen_jax.train.sweep")
    mesh = sharding.make_mesh(config)
    parts = build(config)
    train_step = TrainStep(config, parts.env, parts.tokenizer, parts.model_config, parts.chat_format)
    init_key, sft_key, step_key = run_keys(config.train.seed)
    total = config.train.total_steps
    evaluate, success_keys = make_validator(config, parts)
    stops = EarlyStops(config.filter, len(success_keys))
    _log(log, f"mesh {dict(mesh.shape)} over {mesh.devices.size} of {jax.device_count()} devices")
    with RunFiles(config, [config.logging.dir]) as files, jax.set_mesh(mesh):
        (writer,), checkpointer = files.writers, files.checkpointer
        abstract = jax.eval_shape(train_step.init, init_key, parts.params)
        state_sharding = sharding.state_shardings(abstract, mesh)

        def fresh_state():
            params = initial_params(config, parts, train_step, sft_key, log)
            return jax.device_put(train_step.init(init_key, params), state_sharding)

        state, extra = files.restore_or_start(sharding.with_shardings(abstract, state_sharding), fresh_state, log)
        if extra is not None:
            stops.load_json(extra["early_stop"])
        hyper = Hyper.from_config(config, parts.env_params)
        replicated = sharding.replicated(mesh)
        step_fn = jax.jit(train_step, in_shardings=(state_sharding, replicated, replicated),
                          out_shardings=(state_sharding, replicated), donate_argnums=0)
        keys = summary_keys(config)
        history = []
        bar = files.progress_bar(int(state.step), "train")
        reason = None
        if int(state.step) == 0 and evaluate is not None:
            val = to_floats(evaluate(state.actor))
            writer.write(0, val, force=True)
            _log(log, summary_line(0, val, success_keys))
            reason = stops.after_validation([val[k] for k in success_keys])
        while reason is None and int(state.step) < total:
            start = time.perf_counter()
            state, metrics = step_fn(state, step_key, hyper)
            metrics = to_floats(metrics)
            metrics["time/step_s"] = time.perf_counter() - start
            step = int(state.step)
            reason = stops.after_step(metrics)
            if evaluate is not None and validation.should_validate(step, config.train.test_freq, total):
                metrics.update(to_floats(evaluate(state.actor)))
                reason = reason or stops.after_validation([metrics[k] for k in success_keys])
            history.append(metrics)
            writer.write(step, metrics, force=any(k.startswith(validation.PREFIX) for k in metrics))
            _log(log, summary_line(step, metrics, keys + tuple(success_keys)))
            bar.update(1)
            if checkpointer is not None:
                extra = {"early_stop": stops.to_json(), "metrics": metrics}
                checkpointer.save(step, state, extra, force=reason is not None or step == total)
        if reason is not None:
            _log(log, f"early stop at step {int(state.step)}: {reason} (docs/filtering.md#early-stops)")
    return state, history


def _log(log, text: str) -> None:
    if log is not None:
        log(text)

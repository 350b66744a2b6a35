"""The host loop around the compiled step: build, warm start or resume, step, validate, log, checkpoint, stop early.

    state, history = train(config)          # config from `ragen_jax.config.load` or a configs/*.py file

Only this loop touches the host: it logs the step's metrics (console, `<logging.dir>/metrics.jsonl`,
TensorBoard), validates the actor before training and every `train.test_freq` steps (`train.validation`, metrics
under `val-env/` in the same step's row; step 0 is the untrained policy), saves checkpoints every
`checkpoint.save_freq` steps and at the end, and runs RAGEN's early stops (docs/filtering.md#early-stops,
`train.early_stops`); unlike RAGEN, which stops before that step's actor update, the step has already updated when the
loop sees its metrics. The stop states travel in the checkpoints. The step key is the same every step (the step folds
its own counter in), so a resumed run repeats an uninterrupted one exactly. The files, the resume-or-start decision
and the console progress are `train.host.RunFiles`, shared with the sweep and closed on any exit (a failing step too).

Every `logging.samples_every` steps (step 0 included) the validation rollout's first trajectories are decoded to
`<logging.dir>/samples/step_N.jsonl` (`train.transcripts`; the rollout runs once for a step that also validates).
Timings and throughput, RAGEN's families, in each step's row: `timing_s/step` (the compiled step, until its outputs
are ready), `timing_s/testing` (the validation rollout, transcripts included), and on the process's first call of
each program `timing_s/lower_step` / `timing_s/compile_step` (and `_testing`): tracing + lowering, and XLA's
compilation, timed apart by compiling ahead of time (`train.host.Timed`); `perf/generated_tokens` and
`perf/generated_tokens_per_s` (over `timing_s/step`). The persistent compilation cache
(`logging.compilation_cache`, `ragen_jax.compile_cache`) is enabled first, so a resumed or repeated run loads the
compiled programs instead of compiling them.

The step runs on the mesh of `config.mesh` (`ragen_jax.sharding`): the batch split over data x fsdp, parameters
and optimizer states split over fsdp; with one device that is the plain single-device step. Vectorised sweeps
(`mesh.sweep` > 1) run through `ragen_jax.train.sweep`. Multi-host: `ragen_jax.distributed.initialize()` first,
then the same call on every process; only process 0 logs and writes metrics.
"""
from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp

from ragen_jax import config as config_lib
from ragen_jax import compile_cache, distributed, sharding
from ragen_jax.train import sft, transcripts, validation
from ragen_jax.train.build import build
from ragen_jax.train.early_stops import EarlyStops
from ragen_jax.train.host import RunFiles, Timed
from ragen_jax.train.metrics import summary_line, throughput, to_floats
from ragen_jax.train.step import Hyper, TrainStep
from ragen_jax.train.validation import Validator

SUMMARY_KEYS = ("success", "episode_reward", "rollout/in_group_reward_std", "rollout/filter_kept_ratio",
                "actor/entropy", "collapse_first_turn_sample/mi_estimate", "collapse_first_turn_sample/mi_zscore",
                "collapse_trajectory_sample/mi_estimate", "timing_s/step", "perf/generated_tokens_per_s")
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
    """(validate, its success keys): `validate(params) -> (validation metrics, transcripts.Sample)` runs the
    validation rollout (`train.validation.Validator`, top-p VALIDATION_TOP_P) once for both its metrics and the
    transcripts of its first rows; pure (jit it). (None, []) when neither `train.test_freq` nor
    `logging.samples_every` is on; no success keys without validation (`train.test_freq` <= 0)."""
    if config.train.test_freq <= 0 and config.logging.samples_every <= 0:
        return None, []
    validator = Validator(config, parts.env, parts.tokenizer, parts.model_config, parts.chat_format)

    def validate(params):
        traj, metrics = validator.run(params, parts.env_params, jnp.float32(VALIDATION_TOP_P))
        return metrics, transcripts.select(traj, validator.rollout)

    if config.train.test_freq <= 0:
        return validate, []
    return validate, validation.success_keys(jax.eval_shape(validate, parts.params)[0])


def compile_line(timing: dict[str, float]) -> str | None:
    """`compiled <name> in 12.3 s (traced and lowered in 1.2 s)` of a `Timed` call's first timing, else None."""
    names = [k.removeprefix("timing_s/compile_") for k in timing if k.startswith("timing_s/compile_")]
    return next((f"compiled {n} in {timing[f'timing_s/compile_{n}']:.1f} s (traced and lowered in "
                 f"{timing[f'timing_s/lower_{n}']:.1f} s)" for n in names), None)


def train(config, log: Callable[[str], None] | None = print) -> tuple[object, list[dict]]:
    """Runs `config.train.total_steps` steps (fewer on an early stop). Returns (final TrainState, metrics per step)."""
    config_lib.validate(config)
    compile_cache.enable(config.logging.compilation_cache)
    main = distributed.is_main_process()
    log = log if main else None
    if config.mesh.sweep != 1:
        raise config_lib.ConfigError("mesh.sweep", config.mesh.sweep,
                                     "a single run uses sweep = 1; vectorised sweeps run through ragen_jax.train.sweep")
    mesh = sharding.make_mesh(config)
    parts = build(config)
    train_step = TrainStep(config, parts.env, parts.tokenizer, parts.model_config, parts.chat_format)
    init_key, sft_key, step_key = run_keys(config.train.seed)
    total, test_freq, samples_every = config.train.total_steps, config.train.test_freq, config.logging.samples_every
    batch_size = config.rollout.num_groups * config.rollout.group_size
    validate_fn, success_keys = make_validator(config, parts)
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
        step_fn = Timed(jax.jit(train_step, in_shardings=(state_sharding, replicated, replicated),
                                out_shardings=(state_sharding, replicated), donate_argnums=0), "step")
        validate = None if validate_fn is None else Timed(jax.jit(validate_fn, out_shardings=replicated), "testing")
        keys = summary_keys(config) + tuple(success_keys)
        history = []
        progress = files.progress(int(state.step), "train", log)

        def validate_into(row: dict, step: int, params) -> bool:
            """Validates and writes transcripts when due after `step`, the metrics and timings merged into `row`;
            returns whether it validated."""
            validating = validation.should_validate(step, test_freq, total)
            sampling = transcripts.due(step, samples_every)
            if validate is None or not (validating or sampling):
                return False
            (val, sample), timing = validate(params)
            log_compile(progress, timing)
            row.update(timing)
            if validating:
                row.update(to_floats(val))
            if sampling:
                transcripts.write(writer.directory, step, transcripts.records(jax.device_get(sample), parts.tokenizer))
            return validating

        reason, row = None, {}
        if int(state.step) == 0 and validate_into(row, 0, state.actor):
            writer.write(0, row, force=True)
            progress.write(summary_line(0, row, success_keys))
            reason = stops.after_validation([row[k] for k in success_keys])
        while reason is None and int(state.step) < total:
            (state, metrics), timing = step_fn(state, step_key, hyper)
            log_compile(progress, timing)
            metrics = {**to_floats(metrics), **timing}
            metrics.update(throughput(metrics, config.env.name, batch_size))
            step = int(state.step)
            reason = stops.after_step(metrics)
            validated = validate_into(metrics, step, state.actor)
            if validated:
                reason = reason or stops.after_validation([metrics[k] for k in success_keys])
            history.append(metrics)
            writer.write(step, metrics, force=validated)
            progress.update(metrics, summary_line(step, metrics, keys), validated)
            if checkpointer is not None:
                extra = {"early_stop": stops.to_json(), "metrics": metrics}
                checkpointer.save(step, state, extra, force=reason is not None or step == total)
        if reason is not None:
            progress.write(f"early stop at step {int(state.step)}: {reason} (docs/filtering.md#early-stops)")
    return state, history


def log_compile(progress, timing: dict[str, float]) -> None:
    """Writes `compile_line(timing)` through `progress` (a `train.host.Progress`) on a program's first call."""
    line = compile_line(timing)
    if line is not None:
        progress.write(line)


def _log(log, text: str) -> None:
    if log is not None:
        log(text)

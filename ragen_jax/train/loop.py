"""The host loop around the compiled step: build, warm start or resume, step, log, checkpoint, stop early.

    state, history = train(config)          # config from `ragen_jax.config.load` or a configs/*.py file

Only this loop touches the host: it logs the step's metrics (console, `<logging.dir>/metrics.jsonl`,
TensorBoard), saves checkpoints every `checkpoint.save_freq` steps and at the end, and runs RAGEN's early stops
(spec C.6, `ragen_jax.filtering.early_stop`): `filter.empty_stop_steps` consecutive steps whose filter kept no
group, or a reward-variance collapse (`filter.rv_collapse_window` / `rv_collapse_ratio`); unlike RAGEN, which
stops before that step's actor update, the step has already updated when the loop sees its metrics. The stop
states travel in the checkpoints. The step key is the same every step (the step folds its own counter in), so a
resumed run repeats an uninterrupted one exactly. Not yet here: validation rollouts (`train.test_freq`, so no
low-validation-success stop) and the device mesh (the step runs on one device).
"""
from __future__ import annotations

import time
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
import tqdm

from ragen_jax import config as config_lib
from ragen_jax import filtering
from ragen_jax.train import sft
from ragen_jax.train.build import build
from ragen_jax.train.checkpoint import Checkpointer
from ragen_jax.train.metrics import MetricsWriter, summary_line, to_floats
from ragen_jax.train.step import Hyper, TrainStep

SUMMARY_KEYS = ("success", "episode_reward", "rollout/filter_kept_ratio", "actor/entropy",
                "collapse_first_turn_sample/mi_estimate", "collapse_trajectory_sample/mi_estimate")


def train(config, log: Callable[[str], None] | None = print) -> tuple[object, list[dict]]:
    """Runs `config.train.total_steps` steps (fewer on an early stop). Returns (final TrainState, metrics per step)."""
    config_lib.validate(config, num_devices=1)  # the step is not sharded yet: it runs on the default device
    parts = build(config)
    train_step = TrainStep(config, parts.env, parts.tokenizer, parts.model_config, parts.chat_format)
    key = jax.random.key(config.train.seed)
    init_key, sft_key, step_key = jax.random.split(key, 3)
    c, lg = config.checkpoint, config.logging
    checkpointer = Checkpointer(c.dir, max_to_keep=c.max_to_keep, save_every=c.save_freq) if c.dir else None
    writer = MetricsWriter(lg.dir or None, tensorboard=lg.tensorboard, every=lg.every)
    f = config.filter
    stops = (filtering.empty_stop_init(), filtering.reward_variance_init(f.rv_collapse_window))
    if checkpointer is not None and c.resume and checkpointer.latest_step() is not None:
        abstract = jax.eval_shape(train_step.init, init_key, parts.params)
        state, extra = checkpointer.restore_latest(abstract)
        stops = jax.tree.unflatten(jax.tree.structure(stops), [jnp.asarray(x) for x in extra["early_stop"]])
        writer.truncate_after(int(state.step))
        _log(log, f"resumed from step {int(state.step)} in {c.dir}")
    else:
        params = parts.params
        if config.train.sft_steps > 0:
            params, _ = sft.warm_start(train_step.rollout, parts.tokenizer, params, parts.env_params, sft_key,
                                       config.train.sft_steps, config.train.sft_lr, log=log)
        state = train_step.init(init_key, params)
    hyper = Hyper.from_config(config, parts.env_params)
    step_fn = jax.jit(train_step, donate_argnums=0)
    keys = tuple(f"{config.env.name}/{k}" if "/" not in k else k for k in SUMMARY_KEYS)
    history = []
    bar = tqdm.tqdm(total=config.train.total_steps, initial=int(state.step), desc="train", unit="step",
                    disable=not lg.progress_bar)
    while int(state.step) < config.train.total_steps:
        start = time.perf_counter()
        state, metrics = step_fn(state, step_key, hyper)
        metrics = to_floats(metrics)
        metrics["time/step_s"] = time.perf_counter() - start
        step = int(state.step)
        history.append(metrics)
        writer.write(step, metrics)
        _log(log, summary_line(step, metrics, keys))
        bar.update(1)
        stops, reason = _early_stop(stops, metrics, f)
        if checkpointer is not None:
            extra = {"early_stop": [np.asarray(x).tolist() for x in jax.tree.leaves(stops)], "metrics": metrics}
            checkpointer.save(step, state, extra, force=reason is not None or step == config.train.total_steps)
        if reason is not None:
            _log(log, f"early stop at step {step}: {reason} (spec C.6)")
            break
    bar.close()
    if checkpointer is not None:
        checkpointer.close()
    writer.close()
    return state, history


def _early_stop(stops, metrics: dict, f):
    """Feeds one step to the empty-filter and reward-variance rules: (new states, reason to stop or None)."""
    empty, variance = stops
    empty, stop_empty = filtering.empty_stop_update(empty, metrics["rollout/filter_kept_count"], f.empty_stop_steps)
    stop_variance = False
    if "rollout/in_group_reward_std" in metrics:  # the rule exists for reward filter metrics only
        variance, stop_variance = filtering.reward_variance_update(
            variance, metrics["rollout/in_group_reward_std"], metrics["rollout/filter_kept_count"] > 0,
            f.rv_collapse_ratio)
    reason = None
    if bool(stop_empty):
        reason = f"the filter kept no group for {int(empty.consecutive_empty)} consecutive steps"
    elif bool(stop_variance):
        reason = f"reward-variance collapse (the last {f.rv_collapse_window} in-group reward stds < " \
                 f"{f.rv_collapse_ratio} x their base)"
    return (empty, variance), reason


def _log(log, text: str) -> None:
    if log is not None:
        log(text)

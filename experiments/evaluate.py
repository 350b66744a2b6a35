"""Validation rollouts of a trained run's newest checkpoint, or of a config's initial model (e.g. a saved warm
start), at one or more temperatures.

    ragen-eval --workdir=runs/bandit --temperatures=0,0.5,1 [--config.rollout.val_num_groups=128 ...]
    ragen-eval --config=configs/demo.py --temperatures=0,0.5,1
    .venv/bin/python -m experiments.evaluate --config=configs/bandit.py:tiny \
        --config.model.pretrained_path=DIR --config.rollout.val_num_groups=128

With `--workdir` (a run of experiments/train.py) the config is the run's config.json, with the command line's
`--config.KEY=VALUE` overrides, and the actor is restored from its newest checkpoint. With `--config` it is the model
the config starts RL from (`model.pretrained_path`, else the config's sizes, then the SFT warm start when
`train.sft_steps` > 0). Either runs the training loop's validation rollout (`rollout.val_num_groups` x
`val_group_size` fixed prompts, top-p 1) once per temperature, printing success, format rate and episode reward.
"""
from __future__ import annotations

import argparse
import sys

import jax
import jax.numpy as jnp

from experiments import cli
from experiments.warm_start import starting_model
from ragen_jax import config as config_lib
from ragen_jax.errors import UserInputError
from ragen_jax.train.build import build
from ragen_jax.train.checkpoint import Checkpointer
from ragen_jax.train.loop import VALIDATION_TOP_P, run_keys
from ragen_jax.train.metrics import to_floats
from ragen_jax.train.step import TrainStep
from ragen_jax.train.validation import Validator

SHOWN = ("success", "format_ok_rate", "episode_reward")


def trained_model(config, log=print):
    """(parts, actor params) of the newest checkpoint in `checkpoint.dir`; UserInputError when it holds none."""
    config_lib.validate(config)
    with Checkpointer(config.checkpoint.dir) as checkpointer:
        if checkpointer.latest_step() is None:
            raise UserInputError(f"no checkpoint to restore in {checkpointer.directory}: the run has saved no step yet")
        parts = build(config)
        train_step = TrainStep(config, parts.env, parts.tokenizer, parts.model_config, parts.chat_format)
        abstract = jax.eval_shape(train_step.init, run_keys(config.train.seed)[0], parts.params)
        state, _ = checkpointer.restore_latest(abstract)
    if log:
        log(f"restored step {int(state.step)} from {checkpointer.directory}")
    return parts, state.actor


def evaluate(config, temperatures=(0.5,), log=print, model=None) -> dict[float, dict[str, float]]:
    """{temperature: validation metrics (`val-env/...` floats)} of `model` ((parts, params), e.g. `trained_model`),
    by default the model `config` starts RL from."""
    parts, params = model or starting_model(config, log)
    validator = Validator(config, parts.env, parts.tokenizer, parts.model_config, parts.chat_format)
    out = {}
    for temperature in temperatures:
        validator.temperature = float(temperature)
        run = jax.jit(lambda p: validator(p, parts.env_params, jnp.float32(VALIDATION_TOP_P)))
        out[float(temperature)] = metrics = to_floats(run(params))
        if log:
            shown = [f"{k} {metrics[f'val-env/{config.env.name}/{k}']:.3f}" for k in SHOWN]
            log(f"temperature {temperature:g} | " + " | ".join(shown))
    return out


def temperatures(text: str) -> tuple[float, ...]:
    """`0,0.5,1` -> (0.0, 0.5, 1.0)."""
    try:
        return tuple(float(t) for t in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected comma-separated numbers, e.g. 0,0.5,1") from None


def main(argv: list[str] | None = None) -> None:
    parser = cli.parser(__doc__)
    parser.add_argument("--temperatures", type=temperatures, default=(0.5,), metavar="T1,T2,...",
                        help="validation sampling temperatures (default 0.5)")
    args, config_argv = cli.parse(parser, sys.argv if argv is None else argv)
    if args.workdir is None:
        config = cli.load_config(parser, args, config_argv)
        with cli.one_line_errors(parser):
            evaluate(config, args.temperatures)
        return
    config = cli.load_workdir_config(parser, args, config_argv)
    with cli.one_line_errors(parser):
        evaluate(config, args.temperatures, model=trained_model(config))


if __name__ == "__main__":
    main()

"""Validation rollouts of a config's initial model (e.g. a saved warm start) at one or more temperatures.

    .venv/bin/python experiments/evaluate.py --config=configs/demo.py --temperatures=0,0.5,1
    .venv/bin/python experiments/evaluate.py --config=configs/bandit.py:tiny \
        --config.model.pretrained_path=DIR --config.rollout.val_num_groups=128

Builds the model the config starts RL from (`model.pretrained_path`, else the config's sizes, then the SFT warm
start when `train.sft_steps` > 0) and runs the training loop's validation rollout (`rollout.val_num_groups` x
`val_group_size` fixed prompts, top-p 1) once per temperature, printing success, format rate and episode reward.
"""
from __future__ import annotations

import sys

import jax
import jax.numpy as jnp

from experiments.warm_start import starting_model
from ragen_jax import config as config_lib
from ragen_jax.train.loop import VALIDATION_TOP_P
from ragen_jax.train.metrics import to_floats
from ragen_jax.train.validation import Validator

FLAG = "--temperatures="
SHOWN = ("success", "format_ok_rate", "episode_reward")


def evaluate(config, temperatures=(0.5,), log=print) -> dict[float, dict[str, float]]:
    """{temperature: validation metrics (`val-env/...` floats)} of the model `config` starts RL from."""
    parts, params = starting_model(config, log)
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


def main(argv: list[str]) -> None:
    values = [a[len(FLAG):] for a in argv[1:] if a.startswith(FLAG)]
    try:
        temperatures = tuple(float(t) for t in values[-1].split(",")) if values else (0.5,)
    except ValueError:
        raise SystemExit(f"{FLAG}{values[-1]}: expected comma-separated numbers, e.g. {FLAG}0,0.5,1") from None
    evaluate(config_lib.load([a for a in argv if not a.startswith(FLAG)]), temperatures)


if __name__ == "__main__":
    main(sys.argv)

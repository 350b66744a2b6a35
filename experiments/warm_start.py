"""Warm-start a config's model on environment demonstrations and save it as a HF-style model folder.

    .venv/bin/python experiments/warm_start.py --config=configs/bandit.py:tiny --config.model.pretrained_path= \
        --config.train.sft_steps=1500 --out=OUT

Runs the same SFT warm start a training run does before step 1 (`ragen_jax.train.sft`, with the config's
`train.sft_*` settings and seed), then writes `config.json` + `model.safetensors` (`ragen_jax.models.hf`) to
`--out`. A run starts from it with `--config.model.pretrained_path=OUT --config.train.sft_steps=0`, so a long warm
start is paid once rather than on every run (`configs/demo.py` starts from the shipped Bandit one).
"""
from __future__ import annotations

import sys

from ragen_jax import compile_cache
from ragen_jax import config as config_lib
from ragen_jax.models import hf, transformer
from ragen_jax.train.build import build
from ragen_jax.train.loop import initial_params, run_keys
from ragen_jax.train.step import TrainStep

FLAG = "--out="


def starting_model(config, log=print):
    """(parts, params): the built parts and the parameters a training run with `config` starts RL from (its SFT
    warm start when `train.sft_steps` > 0, with the run's own SFT key)."""
    config_lib.validate(config)
    parts = build(config)
    train_step = TrainStep(config, parts.env, parts.tokenizer, parts.model_config, parts.chat_format)
    return parts, initial_params(config, parts, train_step, run_keys(config.train.seed)[1], log)


def warm_start(config, out: str, log=print) -> str:
    """SFT `config.train.sft_steps` steps from the config's initial model; saves the result to `out`."""
    if config.train.sft_steps <= 0:
        raise config_lib.ConfigError("train.sft_steps", config.train.sft_steps, "a warm start needs at least 1 step")
    compile_cache.enable(config.logging.compilation_cache)
    parts, params = starting_model(config, log)
    hf.save_pretrained(transformer.Model(parts.model_config, params), out)
    if log:
        log(f"wrote {out}")
    return out


def main(argv: list[str]) -> None:
    outs = [a[len(FLAG):] for a in argv[1:] if a.startswith(FLAG)]
    if len(outs) != 1 or not outs[0]:
        raise SystemExit(f"give the output folder once: {FLAG}DIR")
    warm_start(config_lib.load([a for a in argv if not a.startswith(FLAG)]), outs[0])


if __name__ == "__main__":
    main(sys.argv)

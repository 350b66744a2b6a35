"""Validation rollouts of a trained run's checkpoint, or of a config's initial model (e.g. a saved warm start), at
one or more temperatures.

    ragen-eval --workdir=runs/bandit [--step=N] [--num_prompts=128] [--temperatures=0,0.5,1] [--config.KEY=V ...]
    ragen-eval --config=configs/demo.py --temperatures=0,0.5,1
    .venv/bin/python -m experiments.evaluate --config=configs/bandit.py:tiny \
        --config.model.pretrained_path=DIR --config.rollout.val_num_groups=128

With `--workdir` (a run of experiments/train.py) the config is the run's config.json with the command line's
`--config.KEY=VALUE` overrides (another env or split too, e.g. `--config.env.name=bandit_test`), and the actor is
restored from the checkpoint of `--step` (default: the newest). The results land in the workdir:
`eval/step_N.json` holds, per temperature, every validation metric (success, pass@k over `rollout.val_group_size`
samples per prompt, format rate, episode reward, ...) and the collapse diagnostics of the validation batch
(`--no-diagnostics` leaves them out), and `eval/samples/step_N.jsonl` the transcripts of its first trajectories,
each with its temperature. With `--config` it is the model the config starts RL from (`model.pretrained_path`, else
the config's sizes, then the SFT warm start when `train.sft_steps` > 0) and nothing is written.

Either runs the training loop's validation rollout (`--num_prompts` = `rollout.val_num_groups` fixed prompts x
`val_group_size`, the fixed key `rollout.val_seed`, top-p 1), one compiled program for every temperature, and prints
success, format rate and episode reward. The collapse diagnostics score `diagnostics.num_samples` pairs of the one
batch (docs/diagnostics.md) from a fresh state: the MI z-score's marginal-std average starts from this batch alone.
"""
from __future__ import annotations

import argparse
import functools
import json
import os
import sys
from typing import NamedTuple

import jax
import jax.numpy as jnp

from experiments import cli
from ragen_jax import compile_cache
from ragen_jax import config as config_lib
from ragen_jax import distributed
from ragen_jax.diagnostics import cross_logprobs, families
from ragen_jax.errors import UserInputError
from ragen_jax.train import batch as batch_lib
from ragen_jax.train import transcripts
from ragen_jax.train.build import build
from ragen_jax.train.checkpoint import Checkpointer
from ragen_jax.train.loop import VALIDATION_TOP_P, run_keys, starting_model
from ragen_jax.train.metrics_log import to_floats
from ragen_jax.train.step import TrainStep
from ragen_jax.train.validation import Validator

SHOWN = ("success", "format_ok_rate", "episode_reward")
EVAL_DIR = "eval"


class Evaluation(NamedTuple):
    """One temperature's results: metrics (`val-env/...` and, with diagnostics, `collapse_*` floats) and the
    transcripts of the batch's first trajectories (`train.transcripts.records`)."""

    metrics: dict[str, float]
    transcripts: list[dict]


def trained_model(config, step: int | None = None, log=print):
    """(parts, actor params, step) of checkpoint `step` in `checkpoint.dir` (None: the newest); UserInputError when
    the folder holds no checkpoint or not that step."""
    config_lib.validate(config)
    with Checkpointer(config.checkpoint.dir) as checkpointer:
        saved = checkpointer.all_steps()
        if not saved:
            raise UserInputError(f"no checkpoint to restore in {checkpointer.directory}: the run has saved no step yet")
        if step is not None and step not in saved:
            raise UserInputError(f"no checkpoint of step {step} in {checkpointer.directory}: it holds steps "
                                 f"{', '.join(map(str, saved))}")
        parts = build(config)
        train_step = TrainStep(config, parts.env, parts.tokenizer, parts.model_config, parts.chat_format)
        abstract = jax.eval_shape(train_step.init, run_keys(config.train.seed)[0], parts.params)
        state, _ = checkpointer.restore(saved[-1] if step is None else step, abstract)
    if log:
        log(f"restored step {int(state.step)} from {checkpointer.directory}")
    return parts, state.actor, int(state.step)


def evaluation_program(config, parts, diagnostics: bool = True):
    """`run(params, temperature f32[]) -> (metrics, transcripts.Sample)`, jitted: the validation rollout, its
    metrics and, with `diagnostics`, the collapse diagnostics of the batch."""
    validator = Validator(config, parts.env, parts.tokenizer, parts.model_config, parts.chat_format)
    options = families.CollapseOptions.from_config(config, num_groups=config.rollout.val_num_groups)
    d = config.diagnostics

    def run(params, temperature):
        traj, metrics = validator.run(params, parts.env_params, jnp.float32(VALIDATION_TOP_P), temperature)
        if diagnostics:
            score = functools.partial(cross_logprobs.cross_log_probs, validator.rollout.model, params,
                                      temperature=temperature, num_tiers=options.width_tiers)
            collapse, _ = families.collapse_diagnostics(score, batch_lib.reasoning_spans(traj), validator.key(),
                                                        families.init_state(), options, d.std_eps, d.ema_decay)
            metrics.update(collapse)
        return metrics, transcripts.select(traj, validator.rollout)

    return jax.jit(run)


def evaluate(config, temperatures=(0.5,), log=print, model=None, diagnostics: bool = True) -> dict[float, Evaluation]:
    """{temperature: Evaluation} of `model` ((parts, params), e.g. `trained_model(...)[:2]`), by default the model
    `config` starts RL from."""
    compile_cache.enable(config.logging.compilation_cache)  # as a training run: a repeated evaluation loads it
    parts, params = model or starting_model(config, log)
    run = evaluation_program(config, parts, diagnostics)
    out = {}
    for temperature in temperatures:
        metrics, sample = run(params, jnp.float32(temperature))
        rows = [{"temperature": float(temperature), **row}
                for row in transcripts.records(jax.device_get(sample), parts.tokenizer)]
        out[float(temperature)] = Evaluation(to_floats(metrics), rows)
        if log:
            shown = [f"{k} {metrics[f'val-env/{config.env.name}/{k}']:.3f}" for k in SHOWN]
            log(f"temperature {temperature:g} | " + " | ".join(shown))
    return out


def write(workdir: str, step: int, config, results: dict[float, Evaluation]) -> str:
    """Writes `<workdir>/eval/step_<step>.json` and the transcripts `<workdir>/eval/samples/step_<step>.jsonl`;
    returns the json's path."""
    folder = os.path.join(workdir, EVAL_DIR)
    os.makedirs(folder, exist_ok=True)
    summary = {"step": step, "env": config.env.name, "num_prompts": config.rollout.val_num_groups,
               "group_size": config.rollout.val_group_size, "top_p": VALIDATION_TOP_P,
               "temperatures": {f"{t:g}": r.metrics for t, r in results.items()}}
    out = os.path.join(folder, f"step_{step}.json")
    with open(out, "w", encoding="utf-8") as f:
        json.dump(summary, f, indent=1)
    transcripts.write(folder, step, [row for r in results.values() for row in r.transcripts])
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
    parser.add_argument("--step", type=int, metavar="N", help="with --workdir: the checkpoint (default: the newest)")
    parser.add_argument("--num_prompts", type=int, metavar="N",
                        help="fixed validation prompts (rollout.val_num_groups; default: the config's)")
    parser.add_argument("--diagnostics", action=argparse.BooleanOptionalAction, default=True,
                        help="the collapse diagnostics of the validation batch (default on)")
    args, config_argv = cli.parse(parser, sys.argv if argv is None else argv)
    if args.num_prompts is not None:
        config_argv = [*config_argv, f"--config.rollout.val_num_groups={args.num_prompts}"]
    if args.workdir is None:
        if args.step is not None:
            parser.error("--step needs --workdir: the run whose checkpoint to restore")
        config = cli.load_config(parser, args, config_argv)
        with cli.one_line_errors(parser):
            evaluate(config, args.temperatures, diagnostics=args.diagnostics)
        return
    config = cli.load_workdir_config(parser, args, config_argv)
    with cli.one_line_errors(parser):
        parts, params, step = trained_model(config, args.step)
        results = evaluate(config, args.temperatures, model=(parts, params), diagnostics=args.diagnostics)
        if distributed.is_main_process():
            print(f"wrote {write(args.workdir, step, config, results)}")


if __name__ == "__main__":
    main()

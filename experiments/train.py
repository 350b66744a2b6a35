"""Train an agent from a config file with command-line overrides.

    ragen-train --config=configs/bandit.py:tiny --workdir=runs/bandit [--config.filter.value=0.5 ...]
    .venv/bin/python -m experiments.train ...            # the same (or: .venv/bin/python experiments/train.py ...)

Runs `ragen_jax.train.loop.train`: SFT warm start (train.sft_steps), then the compiled RL step
(rollout, collapse diagnostics, SNR-aware filter, update) with console progress, metrics.jsonl,
TensorBoard events and checkpoints as the config says. `--workdir=DIR` keeps all of a run in DIR (config.json,
metrics.jsonl, TensorBoard events, checkpoints/); the same command again resumes there, and a DIR holding another
config's run is refused, naming the keys that differ (`ragen_jax.workdir`). `--distributed` first starts JAX's
multi-host runtime (`ragen_jax.distributed`: TPU pods, SLURM, Open MPI, or the RAGEN_COORDINATOR /
RAGEN_NUM_PROCESSES / RAGEN_PROCESS_ID variables); run the same command on every host. A bad config, model folder,
tokenizer or workdir is refused before anything is written, with one line on stderr naming the file, tensor or
key, and exit code 2 (`ragen_jax.errors.UserInputError`).
"""
from __future__ import annotations

import sys

from experiments import cli
from ragen_jax.train.loop import train


def main(argv: list[str] | None = None) -> None:
    parser = cli.parser(__doc__)
    args, config_argv = cli.parse(parser, sys.argv if argv is None else argv)
    config = cli.load_config(parser, args, config_argv)
    with cli.one_line_errors(parser):
        train(config)


if __name__ == "__main__":
    main()

"""Train an agent from a config file with command-line overrides.

    .venv/bin/python experiments/train.py --config=configs/demo.py --config.filter.value=0.5

Runs `ragen_jax.train.loop.train`: SFT warm start (train.sft_steps), then the compiled RL step
(rollout, collapse diagnostics, SNR-aware filter, update) with console progress, metrics.jsonl,
TensorBoard events and checkpoints as the config says. `--distributed` first starts JAX's multi-host runtime
(`ragen_jax.distributed`: TPU pods, SLURM, Open MPI, or the RAGEN_COORDINATOR / RAGEN_NUM_PROCESSES /
RAGEN_PROCESS_ID variables); run the same command on every host.
"""
from __future__ import annotations

import sys

from ragen_jax import config as config_lib
from ragen_jax import distributed
from ragen_jax.train.loop import train


def main(argv: list[str]) -> None:
    train(config_lib.load(distributed.from_command_line(argv)))


if __name__ == "__main__":
    main(sys.argv)

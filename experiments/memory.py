"""Print a config's device-memory estimate before launching it (shapes only: nothing is allocated).

    .venv/bin/python experiments/memory.py --config=configs/frozen_lake.py --config.model.preset=qwen2.5-0.5b \
        --config.tokenizer.kind=qwen2.5 --devices=8

Prints `ragen_jax.train.memory`'s table: parameters, AdamW states, critic, reference, KV cache at the rollout
geometry, the logits of the scoring pass and of one update micro-batch, in GiB for one copy and per device of the
mesh (`config.mesh` resolved against `--devices`, default this host's `jax.device_count()`), then the resident
total and the estimated peak (a lower bound). The model's shapes come from `model.pretrained_path`'s config.json
(its weights are not read), `model.preset`, or the `model` sizes.
"""
from __future__ import annotations

import sys

import jax

from ragen_jax import config as config_lib
from ragen_jax.train import build, memory

FLAG = "--devices="


def main(argv: list[str]) -> str:
    values = [a[len(FLAG):] for a in argv[1:] if a.startswith(FLAG)]
    try:
        num_devices = int(values[-1]) if values else jax.device_count()
    except ValueError:
        raise SystemExit(f"{FLAG}{values[-1]}: expected a whole number of devices, e.g. {FLAG}8") from None
    config = config_lib.load([a for a in argv if not a.startswith(FLAG)], num_devices)
    model_config = build.build_model_config(config, build.build_tokenizer(config))
    source = config.model.pretrained_path or config.model.preset or "model.* sizes"
    title = f"memory estimate: {source}, algo {config.algo.name}, env {config.env.name}, {num_devices} device(s)"
    table = memory.format_table(memory.estimate(config, model_config, num_devices), title)
    print(table)
    return table


if __name__ == "__main__":
    main(sys.argv)

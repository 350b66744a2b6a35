"""Warm-start a config's model on environment demonstrations and save it as a HF-style model folder, with a record of
how it was made; or remake a saved one from its record and check that it reaches the same held-out metrics.

    .venv/bin/python experiments/warm_start.py --config=configs/bandit.py:tiny --config.model.pretrained_path= \
        --config.train.sft_steps=1500 --out=OUT
    .venv/bin/python experiments/warm_start.py --remake=configs/warm_starts/bandit_tiny --out=OUT

Runs the same SFT warm start a training run does before step 1 (`ragen_jax.train.sft`, with the config's
`train.sft_*` settings and seed), then writes `config.json` + `model.safetensors` (`ragen_jax.models.hf`) to
`--out`. A run starts from it with `--config.model.pretrained_path=OUT --config.train.sft_steps=0`, so a long warm
start is paid once rather than on every run (`configs/demo.py` starts from the shipped Bandit one).

`OUT/warm_start.json` records the command's config arguments, the commit (and whether the tree had uncommitted
changes), the date, and the held-out metrics of the saved model: success and format rate of the config's validation
rollout (`rollout.val_num_groups` fixed prompts at `rollout.val_temperature`) with each one's binomial standard error.
`--remake=FOLDER` reruns FOLDER's recorded command into `--out` on the current commit and compares: a remade metric
agrees when it lies within 1.96 standard errors of a difference of two such estimates; the script exits 1 otherwise.
"""
from __future__ import annotations

import datetime
import json
import math
import os
import sys

from experiments.evaluate import evaluate
from experiments.provenance import git_commit
from ragen_jax import compile_cache
from ragen_jax import config as config_lib
from ragen_jax.models import hf, transformer
from ragen_jax.train.loop import starting_model

OUT_FLAG, REMAKE_FLAG = "--out=", "--remake="
RECORD = "warm_start.json"
HELD_OUT = ("success", "format_ok_rate")
Z95 = 1.96


def standard_error(p: float, n: int) -> float:
    """The binomial standard error of a rate `p` over `n` prompts, with p kept at least 1/n from 0 and 1 (a rate of
    0 or 1 still has noise)."""
    p = min(max(p, 1.0 / n), 1.0 - 1.0 / n)
    return math.sqrt(p * (1.0 - p) / n)


def held_out(config, parts, params, log=print) -> dict:
    """The saved model's held-out metrics: {"temperature", "num_prompts", and per `HELD_OUT` metric its value and
    standard error}."""
    temperature = config.rollout.val_temperature
    metrics = evaluate(config, (temperature,), log, model=(parts, params), diagnostics=False)[temperature].metrics
    n = config.rollout.val_num_groups * config.rollout.val_group_size
    out = {"temperature": temperature, "num_prompts": n}
    for key in HELD_OUT:
        value = metrics[f"val-env/{config.env.name}/{key}"]
        out[key] = {"value": value, "standard_error": standard_error(value, n)}
    return out


def warm_start(config, out: str, log=print, command: list[str] | None = None) -> dict:
    """SFT `config.train.sft_steps` steps from the config's initial model; saves the result and its record (with
    `command`, the config arguments that gave `config`) to `out`. Returns the record."""
    if config.train.sft_steps <= 0:
        raise config_lib.ConfigError("train.sft_steps", config.train.sft_steps, "a warm start needs at least 1 step")
    compile_cache.enable(config.logging.compilation_cache)
    parts, params = starting_model(config, log)
    hf.save_pretrained(transformer.Model(parts.model_config, params), out)
    commit, dirty = git_commit()
    record = {"command": command, "commit": commit, "uncommitted_changes": dirty,
              "made": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
              "held_out": held_out(config, parts, params, log)}
    with open(os.path.join(out, RECORD), "w", encoding="utf-8") as f:
        json.dump(record, f, indent=1)
    if log:
        log(f"wrote {out}")
    return record


def read_record(folder: str) -> dict:
    """FOLDER's warm_start.json; SystemExit naming the file when it is missing or records no command."""
    path = os.path.join(folder, RECORD)
    if not os.path.isfile(path):
        raise SystemExit(f"{path}: no record of how this warm start was made")
    with open(path, encoding="utf-8") as f:
        record = json.load(f)
    if not record.get("command"):
        raise SystemExit(f"{path}: records no command to remake it with")
    return record


def agreement(recorded: dict, remade: dict) -> dict[str, tuple[float, float, float, bool]]:
    """Per held-out metric: (recorded, remade, tolerance, within) with tolerance 1.96 x sqrt(2) x the recorded
    standard error (the noise of a difference of two estimates over the same number of prompts)."""
    out = {}
    for key in HELD_OUT:
        was, now = recorded[key]["value"], remade[key]["value"]
        tolerance = Z95 * math.sqrt(2.0) * recorded[key]["standard_error"]
        out[key] = (was, now, tolerance, abs(now - was) <= tolerance)
    return out


def remake(folder: str, out: str, log=print) -> bool:
    """Reruns FOLDER's recorded command into `out`; logs each held-out metric recorded vs remade; True when all
    agree (`agreement`)."""
    record = read_record(folder)
    config = config_lib.load(["warm_start", *record["command"]])
    remade = warm_start(config, out, log, record["command"])["held_out"]
    results = agreement(record["held_out"], remade)
    for key, (was, now, tolerance, within) in results.items():
        if log:
            log(f"{key}: recorded {was:.3f} ({record['commit'][:7]}), remade {now:.3f}, tolerance {tolerance:.3f}: "
                f"{'agrees' if within else 'DIFFERS'}")
    return all(within for *_, within in results.values())


def main(argv: list[str]) -> None:
    outs = [a[len(OUT_FLAG):] for a in argv[1:] if a.startswith(OUT_FLAG)]
    remakes = [a[len(REMAKE_FLAG):] for a in argv[1:] if a.startswith(REMAKE_FLAG)]
    if len(outs) != 1 or not outs[0]:
        raise SystemExit(f"give the output folder once: {OUT_FLAG}DIR")
    command = [a for a in argv[1:] if not a.startswith((OUT_FLAG, REMAKE_FLAG))]
    if remakes:
        if command or len(remakes) != 1:
            raise SystemExit(f"{REMAKE_FLAG}FOLDER takes its command from FOLDER's {RECORD}: give only it and "
                             f"{OUT_FLAG}DIR")
        sys.exit(0 if remake(remakes[0], outs[0]) else 1)
    warm_start(config_lib.load([argv[0], *command]), outs[0], command=command)


if __name__ == "__main__":
    main(sys.argv)

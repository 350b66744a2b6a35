"""experiments/warm_start.py: the saved folder is exactly the model a run would start RL from (the loop's own warm
start, recomputed here), and a run pointed at it through `model.pretrained_path` builds those parameters."""
from __future__ import annotations

import jax
import numpy as np
import pytest

from configs import base
from experiments import warm_start as warm_start_cli
from experiments.evaluate import evaluate
from ragen_jax import config as config_lib
from ragen_jax.algos import presets
from ragen_jax.train.build import build
from ragen_jax.train.loop import initial_params, run_keys
from ragen_jax.train.step import TrainStep
from tests.tiny import TINY_BATCH, TINY_MODEL

TINY = {"env.name": "bandit", **TINY_BATCH, "rollout.max_turn": 1, "rollout.max_actions_per_turn": 1,
        "rollout.max_actions_per_traj": 1, "rollout.max_model_len": 704, **TINY_MODEL, "model.max_seq_len": 720,
        "train.sft_steps": 2, "train.sft_batch_size": 2, "train.sft_oracle_prob": 0.0, "mesh.data": 1,
        "mesh.fsdp": 1, "rollout.val_num_groups": 8}


def tiny(**overrides):
    return config_lib.apply_overrides(presets.preset_config(base.get_config(), "grpo"), {**TINY, **overrides})


def test_saved_warm_start_is_what_a_run_starts_from_and_its_record_remakes_it(tmp_path, monkeypatch):
    """The folder saved from the command line holds the loop's own warm start (recomputed here); it records its
    command, commit and held-out metrics (equal to an independent evaluation of the saved model), and a remake from
    the record on the same commit agrees (a far-off record is refused: `agreement` below)."""
    monkeypatch.setattr(config_lib, "load", lambda argv: tiny())  # the command's config is the tiny one
    out = str(tmp_path / "warm")
    command = ["--config=configs/bandit.py:tiny", "--config.train.sft_steps=2"]
    warm_start_cli.main(["warm_start.py", *command, f"--out={out}"])

    config = tiny()  # the loop's warm start of the same config, independently
    parts = build(config)
    step = TrainStep(config, parts.env, parts.tokenizer, parts.model_config, parts.chat_format)
    expected = initial_params(config, parts, step, run_keys(config.train.seed)[1], None)
    loaded_config = tiny(**{"model.pretrained_path": out, "train.sft_steps": 0})
    loaded = build(loaded_config)
    assert loaded.model_config == parts.model_config
    moved = False
    for got, want, init in zip(jax.tree.leaves(loaded.params), jax.tree.leaves(expected),
                               jax.tree.leaves(parts.params)):
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
        moved |= not np.array_equal(np.asarray(want), np.asarray(init))
    assert moved  # the two SFT steps changed the model

    record = warm_start_cli.read_record(out)
    assert record["command"] == command and len(record["commit"]) in (40, len("unknown"))
    temperature = loaded_config.rollout.val_temperature
    metrics = evaluate(loaded_config, (temperature,), log=None, model=(loaded, loaded.params), diagnostics=False)
    success = metrics[temperature].metrics["val-env/bandit/success"]
    assert record["held_out"]["success"]["value"] == success and record["held_out"]["num_prompts"] == 8
    assert record["held_out"]["success"]["standard_error"] == warm_start_cli.standard_error(success, 8)
    lines = []
    assert warm_start_cli.remake(out, str(tmp_path / "again"), log=lines.append)
    assert lines[-1].startswith(f"format_ok_rate: recorded {record['held_out']['format_ok_rate']['value']:.3f}")


def test_standard_errors_and_agreement_worked_examples():
    assert warm_start_cli.standard_error(0.5, 64) == 0.0625
    assert warm_start_cli.standard_error(0.0, 4) == warm_start_cli.standard_error(0.25, 4)  # kept 1/n from 0
    recorded = {k: {"value": 0.5, "standard_error": 0.0625} for k in warm_start_cli.HELD_OUT}
    remade = {"success": {"value": 0.6}, "format_ok_rate": {"value": 0.7}}
    result = warm_start_cli.agreement(recorded, remade)  # tolerance 1.96 x sqrt(2) x 0.0625 = 0.173
    assert result["success"][3] and not result["format_ok_rate"][3]


def test_no_steps_and_no_folder_are_refused(tmp_path):
    with pytest.raises(config_lib.ConfigError, match="train.sft_steps"):
        warm_start_cli.warm_start(tiny(**{"train.sft_steps": 0}), str(tmp_path / "w"), log=None)
    with pytest.raises(SystemExit, match="--out=DIR"):
        warm_start_cli.main(["warm_start", "--config=configs/bandit.py:tiny"])
    with pytest.raises(SystemExit, match="no record of how this warm start was made"):
        warm_start_cli.main(["warm_start", f"--remake={tmp_path}", f"--out={tmp_path / 'o'}"])
    with pytest.raises(SystemExit, match="give only it and --out=DIR"):
        warm_start_cli.main(["warm_start", f"--remake={tmp_path}", "--config.train.seed=1", f"--out={tmp_path / 'o'}"])

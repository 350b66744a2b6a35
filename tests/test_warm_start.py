"""experiments/warm_start.py: the saved folder is exactly the model a run would start RL from (the loop's own warm
start, recomputed here), and a run pointed at it through `model.pretrained_path` builds those parameters."""
from __future__ import annotations

import jax
import numpy as np
import pytest

from configs import base
from experiments import warm_start as warm_start_cli
from ragen_jax import config as config_lib
from ragen_jax.algos import presets
from ragen_jax.train.build import build
from ragen_jax.train.loop import initial_params, run_keys
from ragen_jax.train.step import TrainStep
from tests.tiny import TINY_BATCH, TINY_MODEL

TINY = {"env.name": "bandit", **TINY_BATCH, "rollout.max_turn": 1, "rollout.max_actions_per_turn": 1,
        "rollout.max_actions_per_traj": 1, "rollout.max_model_len": 704, **TINY_MODEL, "model.max_seq_len": 720,
        "train.sft_steps": 2, "train.sft_batch_size": 2, "train.sft_oracle_prob": 0.0, "mesh.data": 1,
        "mesh.fsdp": 1}


def tiny(**overrides):
    return config_lib.apply_overrides(presets.preset_config(base.get_config(), "grpo"), {**TINY, **overrides})


def test_saved_warm_start_is_what_a_run_starts_from(tmp_path):
    out = str(tmp_path / "warm")
    warm_start_cli.warm_start(tiny(), out, log=None)

    config = tiny()  # the loop's warm start of the same config, independently
    parts = build(config)
    step = TrainStep(config, parts.env, parts.tokenizer, parts.model_config, parts.chat_format)
    expected = initial_params(config, parts, step, run_keys(config.train.seed)[1], None)

    loaded = build(tiny(**{"model.pretrained_path": out, "train.sft_steps": 0}))
    assert loaded.model_config == parts.model_config
    moved = False
    for got, want, init in zip(jax.tree.leaves(loaded.params), jax.tree.leaves(expected),
                               jax.tree.leaves(parts.params)):
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
        moved |= not np.array_equal(np.asarray(want), np.asarray(init))
    assert moved  # the two SFT steps changed the model


def test_no_steps_and_no_folder_are_refused(tmp_path):
    with pytest.raises(config_lib.ConfigError, match="train.sft_steps"):
        warm_start_cli.warm_start(tiny(**{"train.sft_steps": 0}), str(tmp_path / "w"), log=None)
    with pytest.raises(SystemExit, match="--out=DIR"):
        warm_start_cli.main(["warm_start", "--config=configs/bandit.py:tiny"])

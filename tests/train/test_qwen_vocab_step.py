"""A rollout and a full training step on the Qwen2.5 vocabulary (`tokenizer.kind = "qwen2.5"`, 151,936 embedding
rows) with a tiny random model on the CPU: the ChatML prompt of the Bandit in Qwen's token ids, sampling and scoring
over every row, one GRPO update.

Kept cheap: d_model 16 x 1 layer, 2 groups x 2 rollouts, responses of 8 tokens, collapse diagnostics off (their
chunked scoring is tested in tests/diagnostics/test_cross_logprobs.py and tests/train/test_chunked_scoring.py)."""
from __future__ import annotations

import math

import jax
import numpy as np
import pytest

from configs import base
from ragen_jax import config as config_lib
from ragen_jax.algos import presets
from ragen_jax.train import build as build_lib
from ragen_jax.train.hyper import Hyper
from ragen_jax.train.step import TrainStep

QWEN_ROWS = 151_936
RESPONSE = 8
OVERRIDES = {"env.name": "bandit", "tokenizer.kind": "qwen2.5", "tokenizer.chat_format": "chatml",
             "model.vocab_size": QWEN_ROWS, "model.d_model": 16, "model.num_layers": 1, "model.num_heads": 2,
             "model.num_kv_heads": 1, "model.mlp_dim": 32, "model.tie_embeddings": True,
             "rollout.num_groups": 2, "rollout.group_size": 2, "rollout.max_turn": 1,
             "rollout.max_actions_per_turn": 1, "rollout.max_actions_per_traj": 1, "rollout.response_length": RESPONSE,
             "rollout.max_model_len": 320, "model.max_seq_len": 320, "algo.ppo_mini_batch_size": 2,
             "diagnostics.collapse_every": 0, "optim.actor_lr": 1e-3}


@pytest.fixture(scope="module")
def stepped():
    """(parts, TrainStep, actor before, state after, metrics) of one compiled step from a random model."""
    config = config_lib.apply_overrides(presets.preset_config(base.get_config(), "grpo"), OVERRIDES)
    config_lib.validate(config, num_devices=1)
    parts = build_lib.build(config)
    train_step = TrainStep(config, parts.env, parts.tokenizer, parts.model_config, parts.chat_format)
    state = train_step.init(jax.random.key(0), parts.params)
    before = jax.tree.map(np.asarray, state.actor)
    new_state, metrics = jax.jit(train_step)(state, jax.random.key(1), Hyper.from_config(config, parts.env_params))
    return parts, train_step, before, new_state, {k: float(v) for k, v in metrics.items()}


def test_the_rollout_runs_on_qwen_ids(stepped):
    parts, train_step, before, _, metrics = stepped
    assert parts.tokenizer.vocab_size <= QWEN_ROWS == parts.model_config.vocab_size
    assert before["embed"]["embedding"].shape == (QWEN_ROWS, 16)
    system_ids = list(train_step.rollout.prompts.system_ids)
    assert system_ids[0] == 151644  # <|im_start|> as Qwen2.5's model card numbers it
    assert parts.env.instruction in parts.tokenizer.decode(system_ids)
    # one turn of the Bandit: the ChatML prompt in Qwen tokens plus up to RESPONSE sampled tokens
    assert metrics["bandit/num_turns"] == 1.0
    assert 0 < metrics["response_length/mean"] <= RESPONSE
    assert len(system_ids) < metrics["trajectory_length/mean"] <= 320


def test_every_row_is_scored_and_the_actor_trains(stepped):
    _, _, before, state, metrics = stepped
    # a random tiny model is nearly uniform over all 151,936 rows: entropy ln(151,936) = 11.93 nats
    assert abs(metrics["actor/entropy"] - math.log(QWEN_ROWS)) < 0.05
    assert metrics["actor/num_updates"] == 2.0 and metrics["actor/nonfinite_skips"] == 0.0
    assert np.isfinite(metrics["actor/grad_norm"]) and metrics["actor/grad_norm"] > 0
    after = jax.tree.map(np.asarray, state.actor)
    assert int(state.step) == 1
    assert any(not np.array_equal(a, b) for a, b in zip(jax.tree.leaves(before), jax.tree.leaves(after)))
    assert all(np.isfinite(x).all() for x in jax.tree.leaves(after))

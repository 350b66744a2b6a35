"""The validation batch's faithfulness scorer (ragen_jax/diagnostics/faithfulness.py): the facts it holds are those
of the validation prompts' rendered observations, and made-up reasonings score exactly what a worked count says."""
from __future__ import annotations

import re

import numpy as np
import pytest

from configs import base
from ragen_jax import config as config_lib
from ragen_jax.algos import presets
from ragen_jax.config import ConfigError
from ragen_jax.diagnostics.faithfulness import Faithfulness
from ragen_jax.train.build import build
from ragen_jax.train.loop import make_faithfulness
from ragen_jax.train.transcripts import Sample
from ragen_jax.train.validation import Validator

SMALL = {"env.name": "frozen_lake", "rollout.val_num_groups": 5, "rollout.response_length": 16,
         "rollout.max_model_len": 1024, "model.d_model": 32, "model.num_layers": 1, "model.num_heads": 2,
         "model.num_kv_heads": 1, "model.mlp_dim": 64, "model.max_seq_len": 1040}
WORDS = {-1: ("up", "left"), 0: ("same", "same"), 1: ("down", "right")}


def config_with(**overrides):
    return config_lib.apply_overrides(presets.preset_config(base.get_config(), "grpo"), {**SMALL, **overrides})


def observations(validator, parts) -> list[tuple[tuple[int, int], tuple[int, int]]]:
    """(player, goal) of each validation prompt, read from its decoded first-turn context."""
    tokens, length, _ = validator.rollout.first_prompts(validator.key(), parts.env_params)
    out = []
    for row, n in zip(np.asarray(tokens), np.asarray(length)):
        text = parts.tokenizer.decode(row[:n])
        cells = [tuple(int(x) for x in re.search(label + r": \((\d+), (\d+)\)", text).groups())
                 for label in ("Player", "Goal")]
        out.append(tuple(cells))
    return out


def description(player, goal, goal_shown=None) -> str:
    rows, cols = (WORDS[int(np.sign(goal[i] - player[i]))][i] for i in (0, 1))
    shown = goal_shown or goal
    return (f"Player: ({player[0]}, {player[1]}). Goal: ({shown[0]}, {shown[1]}); "
            f"rows {player[0]} to {goal[0]}: {rows}, cols {player[1]} to {goal[1]}: {cols}.")


def sample_of(tokenizer, reasonings: list[str | None], width: int = 96) -> Sample:
    """A Sample whose row b's first turn has reasoning `reasonings[b]` (None: the turn was not taken)."""
    n = len(reasonings)
    tokens = np.zeros((n, width), np.int32)
    think_len = np.zeros((n, 2), np.int32)
    for b, text in enumerate(reasonings):
        ids = tokenizer.encode(text or "")
        tokens[b, 3:3 + len(ids)] = ids  # the span starts after a few other tokens
        think_len[b, 0] = len(ids)
    zeros = np.zeros((n, 2), np.int32)
    taken = np.array([[text is not None, False] for text in reasonings])
    return Sample(tokens=tokens, length=np.full(n, width), turn_taken=taken, format_ok=taken, response_start=zeros,
                  response_len=zeros, think_start=np.full((n, 2), 3, np.int32), think_len=think_len,
                  turn_reward=zeros.astype(np.float32), success=np.zeros(n, bool),
                  episode_reward=np.zeros(n, np.float32), group_ids=np.arange(n), answer_bytes=np.zeros((n, 2, 1), np.uint8),
                  answer_len=zeros, part_start=np.zeros((n, 2, 1), np.int32), part_end=np.zeros((n, 2, 1), np.int32),
                  num_parts=zeros)


def test_scores_of_made_up_reasonings():
    config = config_with()
    parts = build(config)
    validator = Validator(config, parts.env, parts.tokenizer, parts.model_config, parts.chat_format)
    scorer = Faithfulness(validator, parts.tokenizer, parts.env_params, count=4)
    cells = observations(validator, parts)
    assert [tuple(f.value for f in facts[:2]) for facts in scorer.facts] == [
        (tuple(map(str, p)), tuple(map(str, g))) for p, g in cells[:4]]
    (p0, g0), (p1, g1), (p2, g2), _ = cells[:4]
    wrong_goal = (g1[0], (g1[1] + 1) % 4)
    reasonings = [description(p0, g0),             # every fact: 1
                  description(p1, g1, wrong_goal),  # the goal's cell stated wrongly: 3 of 4
                  f"rows {p2[0]} to 9: up",         # nothing true: 0
                  None]                             # no first turn: 0
    metrics = scorer(sample_of(parts.tokenizer, reasonings + ["Player: (0, 0)"]))  # rows past `count` are not scored
    assert metrics == {"val-faithfulness/frozen_lake": pytest.approx((1 + 0.75) / 4),
                       "val-faithfulness/frozen_lake/player": 0.5, "val-faithfulness/frozen_lake/goal": 0.25,
                       "val-faithfulness/frozen_lake/rows": 0.5, "val-faithfulness/frozen_lake/cols": 0.5}
    with pytest.raises(ValueError, match="fewer than the 4 scored"):
        scorer(sample_of(parts.tokenizer, reasonings[:3]))


def test_config_errors():
    with pytest.raises(ConfigError, match="diagnostics.faithfulness_prompts.*at most"):
        from ragen_jax.config import validate
        validate(config_with(**{"diagnostics.faithfulness_prompts": 6}))
    config = config_with(**{"env.name": "arithmetic", "diagnostics.faithfulness_prompts": 2})
    with pytest.raises(ConfigError, match="lists no facts"):
        make_faithfulness(config, build(config))
    assert make_faithfulness(config_with(**{"diagnostics.faithfulness_prompts": 0}), None) is None

"""Sokoban (docs/environments.md#sokoban), RAGEN-2's main environment: push the box onto its target on a 6 x 6 room.

    experiments/train.py --config=configs/sokoban.py $M           # RAGEN-2's setting (Qwen2.5 from a local folder)
    experiments/train.py --config=configs/sokoban.py:tiny         # CPU: from scratch (does not learn yet, below)

Tiny (6 x 6, one box, 3 turns, q = 0.5) is not yet a setting that learns: it reads coordinates like FrozenLake
(see configs/frozen_lake.py and README "Learning at tiny scale").
"""
from configs import tasks

ACCELERATOR = {}
TINY = {"rollout.max_turn": 3, "rollout.response_length": 48, "rollout.max_model_len": 1408, "model.max_seq_len": 1472,
        "train.sft_steps": 200, "train.sft_oracle_prob": 0.5, "train.total_steps": 40}


def get_config(arg: str | None = None):
    return tasks.get(arg, "sokoban", ACCELERATOR, TINY)

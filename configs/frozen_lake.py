"""FrozenLake (docs/environments.md#frozenlake): reach the goal on a 4 x 4 lake without falling into a hole, over
several turns.

    experiments/train.py --config=configs/frozen_lake.py $M       # RAGEN-2's setting (Qwen2.5 from a local folder)
    experiments/train.py --config=configs/frozen_lake.py:tiny     # CPU: from scratch (does not learn yet, below)

Tiny (4 x 4, 3 turns, q = 0.5) does NOT learn yet: a from-scratch d64 x 2 model does not learn to read the
coordinates within a few hundred warm-start steps (greedy success 0.14 even when every demonstration is the
oracle's), so there is no conditional answer for RL to amplify; README "Learning at tiny scale" has the log.
"""
from configs import tasks

ACCELERATOR = {"env.success_rate": 1.0}
TINY = {"rollout.max_turn": 3, "rollout.response_length": 48, "rollout.max_model_len": 1280, "model.max_seq_len": 1344,
        "train.sft_steps": 200, "train.sft_oracle_prob": 0.5, "train.total_steps": 40}


def get_config(arg: str | None = None):
    return tasks.get(arg, "frozen_lake", ACCELERATOR, TINY)

"""FrozenLake (docs/environments.md#frozenlake): reach the goal on a 4 x 4 lake without falling into a hole, over
several turns.

    experiments/train.py --config=configs/frozen_lake.py $M       # RAGEN-2's setting (Qwen2.5 from a local folder)
    experiments/train.py --config=configs/frozen_lake.py:tiny     # CPU: from scratch (does not learn yet, below)

Tiny is a curriculum rung, not the full task: the goal one move from the start (`env.kwargs.goal_distance` 1),
one turn, q = 0.5, 2000 warm-start steps (about 18 min on 2 cores; `experiments/warm_start.py` saves them). The
warm start learns the move only partly (validation success 0.41 greedy, 0.33 at temperature 0.5, where a random
move gives about 0.25), and RL does not yet raise it: README "Learning at tiny scale" has the log.
"""
from configs import tasks

ACCELERATOR = {"env.success_rate": 1.0}
TINY = {"env.kwargs": {"goal_distance": 1}, "rollout.max_turn": 1, "rollout.response_length": 56,
        "rollout.max_model_len": 768, "model.max_seq_len": 832,
        "train.sft_steps": 2000, "train.sft_oracle_prob": 0.5, "train.total_steps": 40}


def get_config(arg: str | None = None):
    return tasks.get(arg, "frozen_lake", ACCELERATOR, TINY)

"""FrozenLake (docs/environments.md#frozenlake): reach the goal on a 4 x 4 lake without falling into a hole, over
several turns.

    experiments/train.py --config=configs/frozen_lake.py $M       # RAGEN-2's setting (Qwen2.5 from a local folder)
    experiments/train.py --config=configs/frozen_lake.py:tiny     # CPU: the first rung, from a shipped warm start

Tiny is a curriculum rung, not the full task: the goal one move from the start (`env.kwargs.goal_distance` 1), one
turn, one move. It starts from the shipped warm start `configs/warm_starts/frozen_lake_tiny` (the d64 x 2 model
after 1500 SFT steps with the oracle's move, q = 1, then 150 with uniformly random moves, q = 0): its reasoning
restates the coordinates and says on which side of the player the goal lies on each axis ("rows 1 to 2: down, cols
3 to 3: same"), but its move is a coin flip (probability of the right move 0.27 on held-out demonstrations, 0.25 is
chance). What RL has to learn is to act on its own reasoning. It trains 80 steps with a KL loss to the warm start
(`low_var_kl`, 0.5), which keeps the reasoning true to the input, and no filter. experiments/results/README.md has
the log and the per-seed results. Remade by the two commands below (1650 SFT steps at about 0.36 s each on 2 free CPU cores; not
run as written here: the shipped one was made by a probe loop with the same settings and other demonstration keys,
so a remake is equivalent, not bit-identical):

    .venv/bin/python experiments/warm_start.py --config=configs/frozen_lake.py:tiny --config.model.pretrained_path= \\
        --config.train.sft_steps=1500 --config.train.sft_oracle_prob=1.0 --out=/tmp/frozen_lake_q1
    .venv/bin/python experiments/warm_start.py --config=configs/frozen_lake.py:tiny \\
        --config.model.pretrained_path=/tmp/frozen_lake_q1 --config.train.sft_steps=150 --out=OUT
"""
import os

from configs import tasks

WARM_START = os.path.join(os.path.dirname(os.path.abspath(__file__)), "warm_starts", "frozen_lake_tiny")
ACCELERATOR = {"env.success_rate": 1.0}
TINY = {"env.kwargs": {"goal_distance": 1}, "rollout.max_turn": 1, "rollout.max_actions_per_turn": 1,
        "rollout.max_actions_per_traj": 1, "rollout.response_length": 56, "rollout.max_model_len": 768,
        "model.max_seq_len": 832, "model.pretrained_path": WARM_START, "train.sft_steps": 0,
        "train.sft_oracle_prob": 0.0, "train.total_steps": 80,
        # the setting in which every seed 0-4 meets +0.25 (experiments/results): a KL loss to the warm start, no filter
        "algo.use_kl_loss": True, "algo.kl_loss_type": "low_var_kl", "algo.kl_loss_coef": 0.5, "filter.value": 1.0}


def get_config(arg: str | None = None):
    return tasks.get(arg, "frozen_lake", ACCELERATOR, TINY)

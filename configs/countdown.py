"""Countdown (docs/environments.md), single turn: one arithmetic expression that uses every number once and hits the
target.

    experiments/train.py --config=configs/countdown.py $M         # RAGEN-2's setting (Qwen2.5 from a local folder)
    experiments/train.py --config=configs/countdown.py:tiny       # CPU: from scratch

Tiny (q = 0.5, 200 warm-start steps, 40 GRPO steps) does not learn the task: validation success 0.0 from step 0 to
40, while RL raises the format rate 0.77 -> 1.00 (experiments/results/README.md).
"""
from configs import tasks

ACCELERATOR = {"rollout.max_turn": 1, "rollout.max_actions_per_turn": 1}
TINY = {"rollout.max_turn": 1, "rollout.max_actions_per_turn": 1, "rollout.max_actions_per_traj": 1,
        "rollout.response_length": 48, "rollout.max_model_len": 448, "model.max_seq_len": 512,
        "train.sft_steps": 200, "train.sft_oracle_prob": 0.5, "train.total_steps": 40}


def get_config(arg: str | None = None):
    return tasks.get(arg, "countdown", ACCELERATOR, TINY)

"""Two-armed Bandit (docs/environments.md#bandit), single turn: pick the high-risk arm of a profession pair.

    experiments/train.py --config=configs/bandit.py $M        # RAGEN-2's setting (Qwen2.5 from a local folder)
    experiments/train.py --config=configs/bandit.py:tiny      # CPU: from a shipped warm start, learns in minutes
    experiments/train.py --config=configs/bandit.py:smol      # CPU: SmolLM2-135M-Instruct (configs/tasks.py)

Tiny starts from the shipped warm start `configs/warm_starts/bandit_tiny`: the d64 x 2 model after 1500 SFT steps
on demonstrations that pick one of the two names uniformly (q = 0), so the answer format is learned and the arm is
a coin flip (validation success 0.391). The high arm always pays 1.0 (RAGEN: 1.0 with probability 0.25), so the
reward says which arm is right on every pull: the first rung of "does RL learn". In 40 GRPO steps with the paper
filter every seed 0-4 rises +0.28 to +0.47 (experiments/results/README.md). The warm start is remade by (33 min
on 2 CPU cores):

    .venv/bin/python experiments/warm_start.py --config=configs/bandit.py:tiny --config.model.pretrained_path= \\
        --config.train.sft_steps=1500 --out=configs/warm_starts/bandit_tiny
"""
import os

from configs import tasks

WARM_START = os.path.join(os.path.dirname(os.path.abspath(__file__)), "warm_starts", "bandit_tiny")

ACCELERATOR = {"rollout.max_turn": 1, "rollout.max_actions_per_turn": 1, "rollout.response_length": 500,
               "rollout.val_num_groups": 256}
# one turn, one pull, the high arm always paying 1.0: the CPU settings' task
TASK = {"rollout.max_turn": 1, "rollout.max_actions_per_turn": 1, "rollout.max_actions_per_traj": 1,
        "env.kwargs": {"hi_prob": 1.0}}
TINY = {**TASK, "rollout.response_length": 48, "rollout.max_model_len": 736, "model.max_seq_len": 800,
        "model.pretrained_path": WARM_START, "train.sft_steps": 0, "train.sft_oracle_prob": 0.0,
        "train.total_steps": 40}
# SmolLM2's tokens of the Bandit prompt take ~175 positions, at most 296: rows of 448 hold it and a 128-token answer
SMOL = {**TASK, "rollout.max_model_len": 448, "model.max_seq_len": 576, "train.total_steps": 40}


def get_config(arg: str | None = None):
    return tasks.get(arg, "bandit", ACCELERATOR, TINY, SMOL)

"""Two-armed Bandit (docs/environments.md#bandit), single turn: pick the high-risk arm of a profession pair.

    experiments/train.py --config=configs/bandit.py $M        # RAGEN-2's setting (Qwen2.5 from a local folder)
    experiments/train.py --config=configs/bandit.py:tiny      # CPU: from scratch, learns in minutes

Tiny: the warm start picks one of the two names uniformly (q = 0, success about 0.5), and the high arm always
pays 1.0 (RAGEN: 1.0 with probability 0.25), so the reward says which arm is right on every pull: the first
rung of "does RL learn", where GRPO must reach nearly 100%.
"""
from configs import tasks

ACCELERATOR = {"rollout.max_turn": 1, "rollout.max_actions_per_turn": 1, "rollout.response_length": 500,
               "rollout.val_num_groups": 256}
TINY = {"rollout.max_turn": 1, "rollout.max_actions_per_turn": 1, "rollout.max_actions_per_traj": 1,
        "rollout.response_length": 48, "rollout.max_model_len": 736, "model.max_seq_len": 800,
        "env.kwargs": {"hi_prob": 1.0}, "train.sft_steps": 400, "train.sft_oracle_prob": 0.0,
        "train.total_steps": 40}


def get_config(arg: str | None = None):
    return tasks.get(arg, "bandit", ACCELERATOR, TINY)

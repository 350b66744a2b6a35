"""Sokoban (docs/environments.md#sokoban), RAGEN-2's main environment: push the box onto its target on a 6 x 6 room.

    experiments/train.py --config=configs/sokoban.py $M           # RAGEN-2's setting (Qwen2.5 from a local folder)
    experiments/train.py --config=configs/sokoban.py:tiny         # CPU: the first rung, from a shipped warm start
    experiments/sweep.py --config=configs/sokoban.py:buckets,ppo ...   # CPU: gradient buckets (a study)

Tiny is a curriculum rung, not the full task, built as FrozenLake's (configs/frozen_lake.py): the box one push from
its target with the player right behind it (`env.kwargs.push_distance` 1), one turn, one move. Its warm start's
reasoning restates the coordinates and says on which side of the player the box lies on each axis ("rows 2 to 3:
down, cols 1 to 1: same"), which names the push, but its move is a coin flip; RL has to learn to act on its own
reasoning. It trains 80 steps with FrozenLake's best setting, a KL loss to the warm start (`low_var_kl`,
coefficient 0.5), which keeps that reasoning true to the input while the move is learned, and no filter.
experiments/results/README.md has the per-seed results (each of seeds 0-4: 0.312 ->
0.73-0.84). The warm start is remade by the two commands below (1650 SFT steps):

    .venv/bin/python experiments/warm_start.py --config=configs/sokoban.py:tiny --config.model.pretrained_path= \\
        --config.train.sft_steps=1500 --config.train.sft_oracle_prob=1.0 --out=/tmp/sokoban_q1
    .venv/bin/python experiments/warm_start.py --config=configs/sokoban.py:tiny \\
        --config.model.pretrained_path=/tmp/sokoban_q1 --config.train.sft_steps=150 --out=OUT
"""
import os

from configs import tasks
from ragen_jax import config as config_lib
from ragen_jax.algos import presets

WARM_START = os.path.join(os.path.dirname(os.path.abspath(__file__)), "warm_starts", "sokoban_tiny")
ACCELERATOR = {}
TINY = {"env.kwargs": {"push_distance": 1}, "rollout.max_turn": 1, "rollout.max_actions_per_turn": 1,
        "rollout.max_actions_per_traj": 1, "rollout.response_length": 56, "rollout.max_model_len": 768,
        "model.max_seq_len": 832, "model.pretrained_path": WARM_START, "train.sft_steps": 0,
        "train.sft_oracle_prob": 0.0, "train.total_steps": 80,
        # the setting in which every seed 0-4 meets +0.15 (experiments/results): a KL loss to the warm start, no filter
        "algo.use_kl_loss": True, "algo.kl_loss_type": "low_var_kl", "algo.kl_loss_coef": 0.5, "filter.value": 1.0}


# Gradient buckets (experiments/studies/gradient_buckets): the tiny rung with advantages that keep the reward's scale
# (PPO with GAE, or Dr.GRPO) and a separate unfiltered analysis batch of 48 groups x 8 every 5 steps, split into 6
# reward-variance buckets; a solved room pays about 11 more than a failed one, so a group's reward std spans 0 to 5.5.
BUCKETS = {"diagnostics.grad_analysis_every": 5, "diagnostics.grad_analysis_num_groups": 48,
           "diagnostics.grad_analysis_num_buckets": 6, "diagnostics.grad_analysis_bucket_mode": "quantile",
           "train.total_steps": 40, "rollout.val_num_groups": 256, "optim.critic_lr": 5e-3}
BUCKET_ALGORITHMS = ("ppo", "drgrpo")


def buckets(algorithm: str):
    """The gradient-bucket setting with `algorithm` (PPO with GAE, or Dr.GRPO), the tiny rung's KL loss kept."""
    if algorithm not in BUCKET_ALGORITHMS:
        raise ValueError(f"configs/sokoban.py:buckets,{algorithm}: use buckets,ppo or buckets,drgrpo")
    config = presets.preset_config(tasks.tiny("sokoban", TINY), algorithm)
    return config_lib.apply_overrides(config, {**TINY, **BUCKETS})


def get_config(arg: str | None = None):
    name, _, algorithm = (arg or "").partition(",")
    if name == "buckets":
        return buckets(algorithm or "ppo")
    return tasks.get(arg, "sokoban", ACCELERATOR, TINY)

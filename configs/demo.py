"""The `make demo` run: a from-scratch tiny agent on the Bandit that visibly learns, on a laptop CPU in minutes.

`configs/bandit.py:tiny` with fewer steps: a warm start that teaches the answer format with uniformly random arm
choices (`train.sft_oracle_prob = 0`, so about half the valid answers pick the high-risk arm), then GRPO with
RAGEN-2's paper filter (softmax top-p 0.9 of the reward-variance mass, zero-variance groups allowed) and the
collapse diagnostics every step; validation on 64 fixed prompts before training and every 5 steps. Metrics go to
runs/demo/metrics.jsonl (+ TensorBoard), checkpoints to runs/demo/ckpt.

    .venv/bin/python experiments/train.py --config=configs/demo.py [--config.train.total_steps=40 ...]
"""
from configs import bandit
from ragen_jax.algos import presets


def get_config():
    return presets.apply_overrides(bandit.get_config("tiny"), {
        "train.total_steps": 20, "train.test_freq": 5,
        "checkpoint.dir": "runs/demo/ckpt", "checkpoint.save_freq": 10, "checkpoint.resume": False,
        "logging.dir": "runs/demo", "logging.progress_bar": False,
    })

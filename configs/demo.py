"""The `make demo` run: a tiny agent on the Bandit that visibly learns, on a laptop CPU in minutes.

`configs/bandit.py:tiny`, which starts from the shipped warm start `configs/warm_starts/bandit_tiny` (the d64 x 2
model after 1500 SFT steps on demonstrations with uniformly random arm choices, q = 0: the answer format is learned, the
arm is a coin flip), then 40 GRPO steps with RAGEN-2's paper filter (softmax top-p 0.9 of the reward-variance
mass, zero-variance groups allowed) and the collapse diagnostics every step; validation on 64 fixed prompts before
training and every 5 steps, a checkpoint every 10. `make demo` runs it with `--workdir=runs/demo` (config.json,
metrics.jsonl, TensorBoard events, checkpoints/ and report.png there; the same command again resumes). The warm
start is remade as configs/bandit.py says.

    ragen-train --config=configs/demo.py --workdir=runs/demo [--config.train.total_steps=60 ...]
"""
from configs import bandit
from ragen_jax import config as config_lib


def get_config():
    return config_lib.apply_overrides(bandit.get_config("tiny"), {
        "train.total_steps": 40, "train.test_freq": 5, "checkpoint.save_freq": 10, "logging.progress_bar": False,
    })

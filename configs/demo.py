"""The `make demo` run: a from-scratch tiny agent on FrozenLake, on a laptop CPU in a few minutes.

SFT warm start from the env's oracles (format + a first move), then GRPO steps with SNR-aware filtering
(RAGEN-2's paper filter: top-p 0.9 of the reward-variance mass, zero-variance groups dropped) and the collapse
diagnostics every step; validation on 16 fixed prompts before training and every 5 steps. Metrics go to
runs/demo/metrics.jsonl (+ TensorBoard), checkpoints to runs/demo/ckpt.

    .venv/bin/python experiments/train.py --config=configs/demo.py [--config.train.total_steps=20 ...]
"""
from configs import base
from ragen_jax.algos import presets


def get_config():
    config = presets.preset_config(base.get_config(), "grpo", filter="paper")
    return presets.apply_overrides(config, {
        "env.name": "frozen_lake",
        "model.d_model": 64, "model.num_layers": 2, "model.num_heads": 4, "model.num_kv_heads": 2,
        "model.mlp_dim": 256, "model.max_seq_len": 1280,
        "rollout.num_groups": 4, "rollout.group_size": 4, "rollout.max_turn": 2, "rollout.response_length": 80,
        "rollout.max_model_len": 1152,
        "algo.ppo_mini_batch_size": 8,
        "optim.actor_lr": 1e-4,
        "diagnostics.num_samples": 16,
        "rollout.val_num_groups": 16, "train.test_freq": 5,
        "train.total_steps": 10, "train.sft_steps": 150, "train.sft_lr": 3e-3,
        "checkpoint.dir": "runs/demo/ckpt", "checkpoint.save_freq": 2, "checkpoint.resume": False,
        "logging.dir": "runs/demo", "logging.progress_bar": False,
    })

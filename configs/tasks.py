"""Shared by the task configs (`configs/bandit.py`, `frozen_lake.py`, `sokoban.py`, `countdown.py`).

`accelerator(env, overrides)` is RAGEN-2's main-table setting for one environment (PPO, the paper's softmax
top-p 0.9 filter, 8 x 16 rollouts, 400 steps, Qwen2.5 from a local folder: pass `--config.model.pretrained_path`
and `--config.tokenizer.path`); `tiny(env, overrides)` is a CPU setting: a from-scratch decoder, the built-in
tokenizer, a weak warm start (`train.sft_oracle_prob` < 1) and GRPO with the same filter, sized so that a run
finishes on 2 CPU cores in minutes.
"""
from __future__ import annotations

from typing import Any, Mapping

from configs import base, paper
from ragen_jax import config as config_lib
from ragen_jax.algos import presets

TINY_MODEL = {"model.d_model": 64, "model.num_layers": 2, "model.num_heads": 4, "model.num_kv_heads": 2,
              "model.mlp_dim": 256}
TINY = {
    **TINY_MODEL,
    "rollout.num_groups": 8, "rollout.group_size": 8, "algo.ppo_mini_batch_size": 16,
    "optim.actor_lr": 5e-4, "optim.warmup_steps": 0,
    "diagnostics.num_samples": 16,
    "rollout.val_num_groups": 64, "rollout.val_group_size": 1, "train.test_freq": 10,
    "train.sft_lr": 3e-3, "train.sft_batch_size": 16,
    "checkpoint.resume": False, "logging.progress_bar": False,
}


def accelerator(env: str, overrides: Mapping[str, Any] = ()):
    """RAGEN-2's main-table PPO + filter setting on `env` with task-specific `overrides` (a locked ConfigDict)."""
    return config_lib.apply_overrides(paper.get_config(f"main_table,ppo,filter,{env}"), dict(overrides))


def tiny(env: str, overrides: Mapping[str, Any] = ()):
    """The CPU setting on `env` (see the module doc) with task-specific `overrides` (a locked ConfigDict)."""
    config = presets.preset_config(base.get_config(), "grpo", filter="paper")
    return config_lib.apply_overrides(config, {**TINY, "env.name": env, **dict(overrides)})


def get(arg: str | None, env: str, accelerator_overrides: Mapping[str, Any], tiny_overrides: Mapping[str, Any]):
    """`get_config(arg)` of a task file: None / "" for the accelerator setting, "tiny" for the CPU one."""
    if not arg:
        return accelerator(env, accelerator_overrides)
    if arg == "tiny":
        return tiny(env, tiny_overrides)
    raise ValueError(f"configs/{env}.py:{arg}: unknown setting {arg!r}; use configs/{env}.py or configs/{env}.py:tiny")

"""Shared by the task configs (`configs/bandit.py`, `frozen_lake.py`, `sokoban.py`, `countdown.py`).

`accelerator(env, overrides)` is RAGEN-2's main-table setting for one environment (PPO, the paper's softmax
top-p 0.9 filter, 8 x 16 rollouts, 400 steps, Qwen2.5 from a local folder: pass `--config.model.pretrained_path`
and `--config.tokenizer.path`); `tiny(env, overrides)` is a CPU setting: a from-scratch decoder, the built-in
tokenizer, a weak warm start (`train.sft_oracle_prob` < 1) and GRPO with the same filter, sized so that a run
finishes on 2 CPU cores in minutes; `smol(env, overrides)` is the same CPU setting with a real pretrained policy,
SmolLM2-135M-Instruct from the GGUF file `make install` installs (its own tokenizer and ChatML), 4 x 4 rollouts of
up to 128 new tokens.
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


# SmolLM2-135M-Instruct (models/presets.py) with its file's tokenizer and chat template; a batch small enough for a
# 135M step on 2 CPU cores. Sampling at temperature 0.7: at 1.0 the quantised 135M model's samples are largely not
# English (experiments/results/smollm2_bandit). The warm start keeps the model's own sampled text and adds the closing.
SMOL = {
    "model.preset": "smollm2-135m-instruct", "tokenizer.kind": "gguf", "tokenizer.chat_format": "auto",
    "rollout.temperature": 0.7,
    "rollout.response_length": 128,  # rows (rollout.max_model_len, model.max_seq_len): each task's prompt sets them
    "rollout.num_groups": 4, "rollout.group_size": 4, "algo.ppo_mini_batch_size": 16, "algo.ppo_micro_batch_size": 4,
    "optim.actor_lr": 1e-5, "optim.warmup_steps": 0,  # the warm start's SFT rate, which moved the closing in 20 steps
    "diagnostics.num_samples": 16, "diagnostics.collapse_every": 5,
    "rollout.val_num_groups": 64, "rollout.val_group_size": 1, "train.test_freq": 5,
    "train.sft_steps": 20, "train.sft_lr": 1e-5, "train.sft_oracle_prob": 0.0, "train.sft_reasoning": "own",
    "train.sft_batch_size": 16, "train.sft_micro_batch_size": 4,
    "logging.progress_bar": False,
}


def accelerator(env: str, overrides: Mapping[str, Any] = ()):
    """RAGEN-2's main-table PPO + filter setting on `env` with task-specific `overrides` (a locked ConfigDict)."""
    return config_lib.apply_overrides(paper.get_config(f"main_table,ppo,filter,{env}"), dict(overrides))


def tiny(env: str, overrides: Mapping[str, Any] = ()):
    """The CPU setting on `env` (see the module doc) with task-specific `overrides` (a locked ConfigDict)."""
    config = presets.preset_config(base.get_config(), "grpo", filter="paper")
    return config_lib.apply_overrides(config, {**TINY, "env.name": env, **dict(overrides)})


def smol(env: str, overrides: Mapping[str, Any] = ()):
    """The CPU setting on `env` with SmolLM2-135M-Instruct (see the module doc) and task-specific `overrides`."""
    config = presets.preset_config(base.get_config(), "grpo", filter="paper")
    return config_lib.apply_overrides(config, {**SMOL, "env.name": env, **dict(overrides)})


def get(arg: str | None, env: str, accelerator_overrides: Mapping[str, Any], tiny_overrides: Mapping[str, Any],
        smol_overrides: Mapping[str, Any] | None = None):
    """`get_config(arg)` of a task file: None / "" for the accelerator setting, "tiny" for the CPU one, "smol" for the
    CPU one with SmolLM2 (where the task file gives `smol_overrides`)."""
    if not arg:
        return accelerator(env, accelerator_overrides)
    if arg == "tiny":
        return tiny(env, tiny_overrides)
    if arg == "smol" and smol_overrides is not None:
        return smol(env, smol_overrides)
    settings = ("", ":tiny", ":smol") if smol_overrides is not None else ("", ":tiny")
    raise ValueError(f"configs/{env}.py:{arg}: unknown setting {arg!r}; use "
                     f"{' or '.join(f'configs/{env}.py{s}' for s in settings)}")

"""Everything a run needs, built once on the host from a validated config.

    parts = build(config)
    parts.tokenizer, parts.chat_format, parts.env, parts.env_params, parts.model_config, parts.params

The env receives the rollout's action budget and thinking mode, `env.kwargs` as constructor overrides, and
`env.success_rate` when its params have that field (FrozenLake's slip probability). The model is loaded from
`model.pretrained_path` (HF safetensors) or built from the `model` sizes with `model.init_seed`.
"""
from __future__ import annotations

import dataclasses
import os
from typing import Any

import jax
import jax.numpy as jnp

import environments
from ragen_jax.config import ConfigError
from ragen_jax.models import chat as chat_lib
from ragen_jax.models import hf, transformer
from ragen_jax.models import tokenizer as tok_lib
from ragen_jax.models.config import ModelConfig


@dataclasses.dataclass(frozen=True)
class Parts:
    tokenizer: tok_lib.Tokenizer
    chat_format: chat_lib.ChatFormat
    env: Any
    env_params: Any
    model_config: ModelConfig
    params: Any


def build_tokenizer(config) -> tok_lib.Tokenizer:
    return tok_lib.make(config.tokenizer.kind, config.tokenizer.path)


def build_env(config, tokenizer):
    """(env, env_params) of `config.env` with the rollout's action budget and thinking mode."""
    r = config.rollout
    overrides = dict(config.env.kwargs.to_dict(), max_actions_per_turn=r.max_actions_per_turn,
                     max_actions_per_traj=r.max_actions_per_traj, enable_think=r.enable_think)
    env, params = environments.make(config.env.name, tokenizer, **overrides)
    if hasattr(params, "success_rate"):
        params = params.replace(success_rate=jnp.float32(config.env.success_rate))
    return env, params


def existing_folder(key: str, path: str) -> str:
    """The absolute path (`~` expanded) of config `key`'s folder `path`; ConfigError naming the key if there is none."""
    resolved = os.path.abspath(os.path.expanduser(path))
    if not os.path.isdir(resolved):
        raise ConfigError(key, path, f"no such folder: {resolved}")
    return resolved


def build_model(config, tokenizer) -> tuple[ModelConfig, Any]:
    m = config.model
    if m.pretrained_path:
        model = hf.load_pretrained(existing_folder("model.pretrained_path", m.pretrained_path), m.compute_dtype)
        if model.config.vocab_size < tokenizer.vocab_size:
            raise ValueError(f"model.pretrained_path {m.pretrained_path!r} has vocab_size {model.config.vocab_size} "
                             f"< the tokenizer's {tokenizer.vocab_size}")
        return model.config, model.params
    model_config = ModelConfig.from_config(m, tokenizer.vocab_size)
    return model_config, jax.jit(transformer.init_params, static_argnums=0)(model_config, jax.random.key(m.init_seed))


def build(config) -> Parts:
    tokenizer = build_tokenizer(config)
    chat_format = chat_lib.get(config.tokenizer.chat_format)
    env, env_params = build_env(config, tokenizer)
    model_config, params = build_model(config, tokenizer)
    return Parts(tokenizer, chat_format, env, env_params, model_config, params)

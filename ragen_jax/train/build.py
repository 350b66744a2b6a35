"""Everything a run needs, built once on the host from a validated config.

    parts = build(config)
    parts.tokenizer, parts.chat_format, parts.env, parts.env_params, parts.model_config, parts.params

The env receives the rollout's action budget and thinking mode, `env.kwargs` as constructor overrides, and
`env.success_rate` when its params have that field (FrozenLake's slip probability). The model is loaded from
`model.pretrained_path` (HF safetensors) or built with `model.init_seed` from the shapes of `model.preset` or the
`model` sizes (`build_model_config`).
"""
from __future__ import annotations

import dataclasses
import os
from typing import Any

import jax
import jax.numpy as jnp

import environments
from configs import base
from ragen_jax.config import ConfigError
from ragen_jax.models import chat as chat_lib
from ragen_jax.models import hf, presets, transformer
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


def build_model_config(config, tokenizer) -> ModelConfig:
    """The policy's ModelConfig, no weights built: `model.pretrained_path`'s config.json, else the shapes of
    `model.preset` (ragen_jax/models/presets.py), else the `model` sizes.

    A preset and explicit sizes never silently disagree: each key of `presets.ARCHITECTURE_KEYS` must be left at
    its `configs/base.py` default (which counts as unset, so setting a key explicitly to that default cannot be
    told apart) or equal the preset's value; any other value is a ConfigError naming the key. `model.max_seq_len`
    left at its default becomes the preset's max positions (32,768); set, it may only narrow them.
    `model.compute_dtype` and `model.init_seed` apply to a preset as to any model.
    Raises ValueError when the model's vocabulary is smaller than the tokenizer's.
    """
    m = config.model
    if m.pretrained_path:
        model_config = hf.read_config(existing_folder("model.pretrained_path", m.pretrained_path), m.compute_dtype)
    elif m.preset:
        model_config = _preset_config(m)
    else:
        return ModelConfig.from_config(m, tokenizer.vocab_size)
    if model_config.vocab_size < tokenizer.vocab_size:
        source = f"model.pretrained_path {m.pretrained_path!r}" if m.pretrained_path else f"model.preset {m.preset!r}"
        raise ValueError(f"{source} has vocab_size {model_config.vocab_size} < the tokenizer's {tokenizer.vocab_size}")
    return model_config


def _preset_config(m) -> ModelConfig:
    model_config = presets.preset(m.preset, m.compute_dtype)
    defaults = base.get_config().model
    for key in presets.ARCHITECTURE_KEYS:
        value, fixed = m[key], getattr(model_config, key)
        if value != defaults[key] and value != fixed:
            raise ConfigError(f"model.{key}", value, f"model.preset = {m.preset!r} has {key} = {fixed!r}: leave it "
                                                     f"at its default ({defaults[key]!r}) or set the preset's value")
    if m.max_seq_len == defaults.max_seq_len:
        return model_config
    if m.max_seq_len > model_config.max_seq_len:
        raise ConfigError("model.max_seq_len", m.max_seq_len,
                          f"model.preset = {m.preset!r} has {model_config.max_seq_len} positions at most")
    return dataclasses.replace(model_config, max_seq_len=m.max_seq_len)


def build_model(config, tokenizer) -> tuple[ModelConfig, Any]:
    """(ModelConfig, float32 params): `model.pretrained_path`'s weights, else random ones (`model.init_seed`)
    of the shapes `build_model_config` gives."""
    m = config.model
    model_config = build_model_config(config, tokenizer)
    if m.pretrained_path:
        model = hf.load_pretrained(existing_folder("model.pretrained_path", m.pretrained_path), m.compute_dtype)
        return model.config, model.params
    return model_config, jax.jit(transformer.init_params, static_argnums=0)(model_config, jax.random.key(m.init_seed))


def build(config) -> Parts:
    tokenizer = build_tokenizer(config)
    chat_format = chat_lib.get(config.tokenizer.chat_format)
    env, env_params = build_env(config, tokenizer)
    model_config, params = build_model(config, tokenizer)
    return Parts(tokenizer, chat_format, env, env_params, model_config, params)

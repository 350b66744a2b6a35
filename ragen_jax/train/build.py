"""Everything a run needs, built once on the host from a validated config.

    parts = build(config)
    parts.tokenizer, parts.chat_format, parts.env, parts.env_params, parts.model_config, parts.params

The env receives the rollout's action budget and thinking mode, `env.kwargs` as constructor overrides, and
`env.success_rate` when its params have that field (FrozenLake's slip probability). The model is loaded from
`model.pretrained_path` (HF safetensors, or a GGUF file: `models.gguf`) or a shipped `model.preset`'s file, or built
with `model.init_seed` from the shapes of a shape `model.preset` or the `model` sizes (`build_model_config`).
`check_inputs(config)` reads the files a config names and checks them against each other without building the
model, so the entry points refuse bad input (a `ragen_jax.errors.UserInputError` naming the file, tensor or key)
before they write anything.
"""
from __future__ import annotations

import dataclasses
import os
from typing import Any

import jax
import jax.numpy as jnp

import environments
from ragen_jax import defaults as config_defaults
from ragen_jax.config import AUTO_CHAT_FORMAT, ConfigError, check_choice
from ragen_jax.errors import UserInputError, reraised
from ragen_jax.models import chat as chat_lib
from ragen_jax.models import gguf, hf, lm, presets
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
    """The tokenizer of `config.tokenizer`; `tokenizer.path` (kind json) is resolved and must exist (ConfigError)."""
    t = config.tokenizer
    if t.kind == "gguf":
        return tok_lib.make(t.kind, gguf_tokenizer_source(config))
    return tok_lib.make(t.kind, existing_path("tokenizer.path", t.path) if t.kind == "json" else t.path)


def gguf_tokenizer_source(config) -> str:
    """The GGUF file of `tokenizer.kind = "gguf"`: `tokenizer.path`, else a shipped `model.preset`'s file (also when
    `model.pretrained_path` holds weights trained from it), else the model's own GGUF file (`pretrained_source`);
    ConfigError naming `tokenizer.path` when none is a `.gguf` file."""
    shipped = config.model.preset in presets.SHIPPED
    path = config.tokenizer.path or (presets.shipped_path(config.model.preset) if shipped else pretrained_source(config))
    if not path.endswith(gguf.SUFFIX):
        raise ConfigError("tokenizer.path", config.tokenizer.path, "tokenizer.kind='gguf' reads a .gguf file: "
                          "set tokenizer.path, or load the model from one (model.pretrained_path or a shipped "
                          "model.preset)")
    return existing_path("tokenizer.path", path)


def build_chat_format(config, tokenizer: tok_lib.Tokenizer) -> chat_lib.ChatFormat:
    """`config.tokenizer.chat_format` ("auto": the GGUF file's chat template, `gguf.chat_format`), checked against
    `tokenizer`: TokenizerError naming the tokenizer and the first of the format's markers it lacks as a single token,
    or an end of turn other than its eos."""
    if config.tokenizer.chat_format == AUTO_CHAT_FORMAT:
        chat_format = gguf.chat_format(gguf.read_gguf(gguf_tokenizer_source(config)))
    else:
        chat_format = chat_lib.get(config.tokenizer.chat_format)
    try:
        chat_format.check_tokenizer(tokenizer)
    except (KeyError, ValueError) as error:  # KeyError: a marker that is no single token; ValueError: another eos
        source = config.tokenizer.path if config.tokenizer.kind == "json" else f"the {config.tokenizer.kind} tokenizer"
        raise tok_lib.TokenizerError(f"{source} does not fit tokenizer.chat_format = {chat_format.name!r}: "
                                     f"{error.args[0]}") from None
    return chat_format


def build_env(config, tokenizer):
    """(env, env_params) of `config.env` with the rollout's action budget and thinking mode."""
    r = config.rollout
    check_env_name(config)
    overrides = dict(config.env.kwargs.to_dict(), max_actions_per_turn=r.max_actions_per_turn,
                     max_actions_per_traj=r.max_actions_per_traj, enable_think=r.enable_think)
    with reraised(UserInputError, "config.env.kwargs", TypeError):  # a constructor argument the env lacks
        env, params = environments.make(config.env.name, tokenizer, **overrides)
    if hasattr(params, "success_rate"):
        params = params.replace(success_rate=jnp.float32(config.env.success_rate))
    return env, params


def check_env_name(config) -> None:
    """ConfigError naming `env.name` unless it is a registered environment."""
    check_choice("env.name", config.env.name, environments.registered())


def existing_path(key: str, path: str, folder: bool = False) -> str:
    """The absolute path (`~` expanded) of config `key`'s `path`; ConfigError naming the key if nothing is there
    (with `folder`: no folder)."""
    resolved = os.path.abspath(os.path.expanduser(path))
    if not (os.path.isdir(resolved) if folder else os.path.exists(resolved)):
        raise ConfigError(key, path, f"no such {'folder' if folder else 'file or folder'}: {resolved}")
    return resolved


def build_model_config(config, tokenizer) -> ModelConfig:
    """The policy's ModelConfig, no weights built: the checkpoint's config (`pretrained_source`: config.json or GGUF
    metadata; for a shipped `model.preset`, its file's), else the shapes of a shape `model.preset`
    (ragen_jax/models/presets.py), else the `model` sizes.

    A preset and explicit sizes never silently disagree: each key of `presets.ARCHITECTURE_KEYS` must be left at
    its `ragen_jax/defaults.py` default (which counts as unset, so setting a key explicitly to that default cannot be
    told apart) or equal the preset's value; any other value is a ConfigError naming the key. `model.max_seq_len`
    left at its default becomes the preset's max positions (32,768 for Qwen2.5, 8,192 for SmolLM2); set, it may only
    narrow them. `model.compute_dtype` and `model.init_seed` apply to a preset as to any model.
    Raises UserInputError when the model's vocabulary is smaller than the tokenizer's.
    """
    m = config.model
    path = pretrained_source(config)
    if path:
        model_config = (gguf.read_gguf(path, m.compute_dtype).config if path.endswith(gguf.SUFFIX)
                        else hf.read_config(path, m.compute_dtype))
    elif not m.preset:
        with reraised(UserInputError, "model sizes", ValueError):  # sizes that do not fit together, e.g. heads
            return ModelConfig.from_config(m, tokenizer.vocab_size)
    if m.preset:
        if m.pretrained_path:  # weights trained from a shipped preset (the only pairing `config.validate` allows)
            _check_checkpoint_is_preset(m, model_config, gguf.read_gguf(presets.shipped_path(m.preset)).config)
        model_config = _agreeing_with_preset(m, model_config if path else presets.preset(m.preset, m.compute_dtype))
    if model_config.vocab_size < tokenizer.vocab_size:
        source = f"model.preset {m.preset!r}" if m.preset else f"model.pretrained_path {m.pretrained_path!r}"
        raise UserInputError(f"{source} has vocab_size {model_config.vocab_size} < the tokenizer's {tokenizer.vocab_size}")
    return model_config


def _check_checkpoint_is_preset(m, checkpoint: ModelConfig, preset_config: ModelConfig) -> None:
    """ConfigError naming `model.pretrained_path` when its architecture differs from `m.preset`'s."""
    for key in presets.ARCHITECTURE_KEYS:
        if getattr(checkpoint, key) != getattr(preset_config, key):
            raise ConfigError("model.pretrained_path", m.pretrained_path,
                              f"has {key} = {getattr(checkpoint, key)!r} but model.preset = {m.preset!r} has "
                              f"{getattr(preset_config, key)!r}: leave model.preset empty or load a checkpoint of it")


def _agreeing_with_preset(m, model_config: ModelConfig) -> ModelConfig:
    """`model_config` of preset `m.preset` after checking the explicit `m` sizes against it, max_seq_len narrowed."""
    defaults = config_defaults.get_config().model
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
    """(ModelConfig of `build_model_config`, float32 params): the weights of `pretrained_source` (a HF checkpoint of
    the transformer architecture, `models.hf`, or a GGUF file, `models.gguf`), else random ones (`model.init_seed`)
    initialised by the `model.arch` architecture (`models.lm.make`)."""
    m = config.model
    model_config = build_model_config(config, tokenizer)
    path = pretrained_source(config)
    if path:
        load = gguf.load_gguf if path.endswith(gguf.SUFFIX) else hf.load_pretrained
        return model_config, load(path, m.compute_dtype).params
    return model_config, jax.jit(lm.make(m.arch, model_config).init_params)(jax.random.key(m.init_seed))


def pretrained_source(config) -> str:
    """Where the policy's weights come from: `model.pretrained_path` resolved (a HF checkpoint folder or a `.gguf`
    file; ConfigError naming the key when it is neither), else the installed file of a shipped `model.preset`
    (`presets.SHIPPED`); "" for random weights. So a warm start saved from a shipped model (experiments/warm_start.py)
    loads with the preset kept and `model.pretrained_path` set to its folder."""
    m = config.model
    if m.pretrained_path:
        return existing_path("model.pretrained_path", m.pretrained_path,
                             folder=not m.pretrained_path.endswith(gguf.SUFFIX))
    return presets.shipped_path(m.preset) if m.preset in presets.SHIPPED else ""


def check_inputs(config) -> None:
    """Reads and cross-checks what `config` names, building no model: the tokenizer and its chat format, the env
    name, the model's shapes against the tokenizer, and `model.pretrained_path`'s config, files, tensor names, shapes
    and dtypes (`hf.check_pretrained`, `gguf.read_gguf`). Raises UserInputError naming the first bad file, tensor or
    key."""
    tokenizer = build_tokenizer(config)
    build_chat_format(config, tokenizer)
    check_env_name(config)
    build_model_config(config, tokenizer)
    path, dtype = pretrained_source(config), config.model.compute_dtype
    if path:
        if path.endswith(gguf.SUFFIX):
            gguf.read_gguf(path, dtype)
        else:
            hf.check_pretrained(path, dtype)


def build(config) -> Parts:
    """The `Parts` of a validated config."""
    tokenizer = build_tokenizer(config)
    chat_format = build_chat_format(config, tokenizer)
    env, env_params = build_env(config, tokenizer)
    model_config, params = build_model(config, tokenizer)
    return Parts(tokenizer, chat_format, env, env_params, model_config, params)

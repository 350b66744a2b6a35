"""Environment registry: `make(name, tokenizer, **overrides) -> (env, params)`, `registered()`.

Each environment module calls `register(name, EnvClass, **defaults)` at import. `make` splits the
overrides: keys that are fields of the factory's `Params` dataclass (traced values, e.g. `success_rate`)
replace those params; every other key is a static constructor argument (size, capacities, ...).
Env modules are imported lazily on the first `make`/`registered` call, from `ENV_MODULES`; a listed
module that does not exist (yet) is skipped, any other import error propagates.

To add an environment: write `environments/<name>.py` ending in `register("<name>", YourEnv)` (the
subclass contract is in `environments/base.py`) and add `"environments.<name>"` to `ENV_MODULES` below.
The tokenizer is the caller's (`ragen_jax.models.tokenizer.builtin()` for the built-in vocabulary):
`environments` imports nothing from `ragen_jax`.
"""
from __future__ import annotations

import dataclasses
import importlib
from typing import Any, Callable

import jax.numpy as jnp

from environments.pieces import Tokenizer

ENV_MODULES = (
    "environments.frozen_lake",
    "environments.bandit",
    "environments.gymnax_adapter",
    "environments.sokoban",
    "environments.countdown",
    "environments.arithmetic",
)

_REGISTRY: dict[str, tuple[Callable[..., Any], dict[str, Any]]] = {}
_loaded = False


def register(name: str, factory: Callable[..., Any], **defaults: Any) -> None:
    """Register `factory(tokenizer, **kwargs) -> TextEnv` under `name` with default kwargs."""
    if name in _REGISTRY and _REGISTRY[name] != (factory, defaults):
        raise ValueError(f"environment {name!r} is already registered")
    _REGISTRY[name] = (factory, defaults)


def _load_modules() -> None:
    global _loaded
    if _loaded:
        return
    for module in ENV_MODULES:
        try:
            importlib.import_module(module)
        except ModuleNotFoundError as err:
            if err.name != module:
                raise
    _loaded = True


def registered() -> tuple[str, ...]:
    """Names accepted by `make`, sorted."""
    _load_modules()
    return tuple(sorted(_REGISTRY))


def make(name: str, tokenizer: Tokenizer, **overrides: Any):
    """Build a registered environment: returns `(env, params)`.

    tokenizer: what the env renders and parses with (`pieces.Tokenizer`). overrides: params fields or
    constructor kwargs.
    """
    _load_modules()
    if name not in _REGISTRY:
        raise ValueError(f"unknown environment {name!r}; registered: {', '.join(sorted(_REGISTRY))}")
    factory, defaults = _REGISTRY[name]
    kwargs = {**defaults, **overrides}
    params_cls = getattr(factory, "Params", None)
    param_fields = {f.name for f in dataclasses.fields(params_cls)} if params_cls is not None else set()
    param_kwargs = {k: kwargs.pop(k) for k in list(kwargs) if k in param_fields}
    try:
        env = factory(tokenizer, **kwargs)
    except TypeError as err:
        raise TypeError(f"environment {name!r}: bad constructor arguments {sorted(kwargs)}: {err}") from err
    # overrides take the dtype of the default (a Python float would otherwise stay a weak-typed scalar)
    param_kwargs = {k: jnp.asarray(v, jnp.asarray(getattr(env.default_params, k)).dtype) for k, v in param_kwargs.items()}
    params = env.default_params.replace(**param_kwargs) if param_kwargs else env.default_params
    return env, params

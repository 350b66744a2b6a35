"""Helpers shared by the environment tests: response batches, host-side row access, compiled env functions.

They exist to keep the tests fast without changing what they check. Almost all of the time of these tests
is XLA compilation, so:
* every compiled function here is built once per env object (or once per session) and called with the same
  shapes by every test that uses it;
* rows of batched results are read from one host copy (indexing a device array row by row dispatches a
  small program per access, and slices of varying length compile a new one per length);
* `jit` compiles with `FAST_COMPILE`: XLA CPU's elemental IR emitters instead of its newer fusion emitters,
  and LLVM optimisation level 0. Both only change how the optimised HLO becomes machine code, i.e. how
  fast a program runs, not what it computes (which is what these tests check). An env step then compiles
  several times faster and runs several times slower, which small test batches afford. Programs the library
  jits itself (e.g. `render_text`) and other test modules keep the defaults, so the default code path stays
  covered.
"""
from __future__ import annotations

import functools
from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

import environments
from environments import arithmetic, countdown
from environments.datasets import instance_index

FAST_COMPILE = {"xla_cpu_use_fusion_emitters": False, "xla_backend_optimization_level": 0}
# LLVM O1: a longer compile than O0 for a much faster program; pays off for a step doing much work per row
# (Countdown's expression evaluator) over thousands of rows.
FAST_RUN = {**FAST_COMPILE, "xla_backend_optimization_level": 1}


def jit(fn: Callable, options: dict = FAST_COMPILE, **kwargs) -> Callable:
    """`jax.jit` with the test compiler options (see the module docstring)."""
    return jax.jit(fn, compiler_options=options, **kwargs)


def encode(tokenizer, texts, width: int, fill: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Token ids of `texts` padded with `fill` to `width`: (tokens i32[N, width], lengths i32[N]), numpy.

    A text longer than `width` tokens is an error: a test must not silently cut its responses.
    """
    tokens = np.full((len(texts), width), fill, np.int32)
    lengths = np.zeros(len(texts), np.int32)
    for i, text in enumerate(texts):
        ids = tokenizer.encode(text)
        if len(ids) > width:
            raise ValueError(f"test text takes {len(ids)} tokens, more than the width {width}: {text!r}")
        tokens[i, : len(ids)], lengths[i] = ids, len(ids)
    return tokens, lengths


def random_responses(rng: np.random.Generator, tokenizer, batch: int, width: int) -> tuple[np.ndarray, np.ndarray]:
    """Garbage responses: ids in [-3, vocab + 3) i32[batch, width] and lengths in [-2, width + 3) i32[batch]
    (both deliberately out of range at times)."""
    tokens = rng.integers(-3, tokenizer.vocab_size + 3, (batch, width)).astype(np.int32)
    lengths = rng.integers(-2, width + 3, batch).astype(np.int32)
    return tokens, lengths


def take(tree, i):
    """Row `i` of a batched pytree, with numpy leaves (jax keeps the host copy of each leaf after the first
    read, so reading many rows costs one transfer per leaf)."""
    return jax.tree.map(lambda x: np.asarray(x)[i], tree)


def obs_text(tokenizer, obs, i: int | None = None) -> str:
    """Decoded text of observation row `i` of a batched `Observation` (the observation itself when `i` is
    None); asserts that every token after `length` is padding."""
    tokens, length = np.asarray(obs.tokens), np.asarray(obs.length)
    if i is not None:
        tokens, length = tokens[i], length[i]
    assert (tokens[length:] == tokenizer.pad_id).all(), tokens
    return tokenizer.decode(tokens[:length])


def assert_no_action_no_change(state, new, reward, info) -> np.ndarray:
    """Rows that executed no action keep every state leaf and get no reward; returns that row mask."""
    unchanged = np.asarray(info["num_actions"]) == 0
    for a, b in zip(jax.tree.leaves(state), jax.tree.leaves(new)):
        np.testing.assert_array_equal(np.asarray(a)[unchanged], np.asarray(b)[unchanged])
    np.testing.assert_array_equal(np.asarray(reward)[unchanged], 0.0)
    return unchanged


def strong_types(tree):
    """The same values without weak types. gymnax puts Python scalars into its states, so a state fresh
    from reset and one after a step would otherwise be two signatures, and every step compiles twice."""
    return jax.tree.map(lambda x: jax.lax.convert_element_type(x, x.dtype), tree)


@functools.cache
def make_env(name: str, tokenizer, **overrides):
    """`environments.make`, once per (name, tokenizer, overrides) for the session. Envs outlive module
    fixtures, which pytest sets up again when it regroups tests by the session-scoped `tokenizer`
    parameter, so `batched(env)` stays the same compiled pair."""
    return environments.make(name, tokenizer, **overrides)


class EnvFns(NamedTuple):
    """reset(keys [B], params) -> (obs, state); step(keys [B], state, tokens i32[B, R], lengths i32[B],
    params) -> (obs, state, reward, done, info): the env's own functions over a leading batch axis."""

    reset: Callable
    step: Callable


@functools.cache
def batched(env, fast_run: bool = False) -> EnvFns:
    """`env.reset` and `env.step` vmapped over a leading batch axis (params shared) and jitted, built once
    per env object, so every test of a module reuses the compiled programs for a given batch shape.
    `fast_run` compiles the step with `FAST_RUN`."""

    def reset(keys, params):
        obs, state = jax.vmap(env.reset, (0, None))(keys, params)
        return obs, strong_types(state)

    def step(keys, state, tokens, lengths, params):
        obs, new, reward, done, info = jax.vmap(env.step, (0, 0, 0, 0, None))(keys, state, tokens, lengths, params)
        return obs, strong_types(new), reward, done, info

    return EnvFns(jit(reset), jit(step, FAST_RUN if fast_run else FAST_COMPILE))


@jit
def key_seeds(keys):
    """u32[B] the first 32 random bits of each key, the documented instance seed of a dataset draw."""
    return jax.vmap(lambda k: jax.random.bits(k, (), jnp.uint32))(keys)


@functools.partial(jit, static_argnums=1)
def instance_indices(keys, size: int):
    """`datasets.instance_index(key, size)` over a batch of keys."""
    return jax.vmap(instance_index, (0, None))(keys, size)


@functools.cache
def countdown_sampler(operators: str, max_target: int) -> Callable:
    """`countdown.sample_instance` with these options over a batch of keys -> (nums, count, target),
    compiled once per option set for the session (test_countdown and test_datasets share it)."""
    return jit(jax.vmap(lambda k: countdown.sample_instance(k, operators=operators, max_target=max_target)))


@jit
def sample_problems(keys):
    """`arithmetic.sample_problem` over a batch of keys (test_arithmetic and test_datasets share it)."""
    return jax.vmap(arithmetic.sample_problem)(keys)

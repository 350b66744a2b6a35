"""Helpers shared by the environment tests: response batches, host-side row access, compiled env functions.

They exist to keep the tests fast without changing what they check. Almost all of the time of these tests
is XLA compilation, so:
* every compiled function here is built once per env object (or once per session) and called with the same
  shapes by every test that uses it;
* rows of batched results are read from one host copy (indexing a device array row by row dispatches a
  small program per access, and slices of varying length compile a new one per length);
* `jit` compiles at LLVM optimisation level 0 (`FAST_COMPILE`): the tests check what a program computes,
  which that level does not change (it acts after every HLO pass), and an env step then compiles in
  about half the CPU time. Running is slower, which tiny test batches do not notice.
"""
from __future__ import annotations

import functools
from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

FAST_COMPILE = {"xla_backend_optimization_level": 0}


def jit(fn: Callable, **kwargs) -> Callable:
    """`jax.jit` with the test compiler options (see the module docstring)."""
    return jax.jit(fn, compiler_options=FAST_COMPILE, **kwargs)


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


def _strong(tree):
    """The same values without weak types. gymnax puts Python scalars into its states, so a state fresh
    from reset and one after a step would otherwise be two signatures, and every step compiles twice."""
    return jax.tree.map(lambda x: jax.lax.convert_element_type(x, x.dtype), tree)


class EnvFns(NamedTuple):
    """reset(keys [B], params) -> (obs, state); step(keys [B], state, tokens i32[B, R], lengths i32[B],
    params) -> (obs, state, reward, done, info): the env's own functions over a leading batch axis."""

    reset: Callable
    step: Callable


@functools.cache
def batched(env) -> EnvFns:
    """`env.reset` and `env.step` vmapped over a leading batch axis (params shared) and jitted, built once
    per env object, so every test of a module reuses the compiled programs for a given batch shape."""

    def reset(keys, params):
        obs, state = jax.vmap(env.reset, (0, None))(keys, params)
        return obs, _strong(state)

    def step(keys, state, tokens, lengths, params):
        obs, new, reward, done, info = jax.vmap(env.step, (0, 0, 0, 0, None))(keys, state, tokens, lengths, params)
        return obs, _strong(new), reward, done, info

    return EnvFns(jit(reset), jit(step))


@jit
def key_seeds(keys):
    """u32[B] the first 32 random bits of each key, the documented instance seed of a dataset draw."""
    return jax.vmap(lambda k: jax.random.bits(k, (), jnp.uint32))(keys)

"""The generic gymnax adapter against gymnax itself (same keys, same transitions) and a Python render."""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import environments
from environments.gymnax_adapter import GymnaxText
from tests.environments.helpers import (
    assert_no_action_no_change, batched, encode, jit, make_env, obs_text, random_responses, strong_types, take,
)

B, R, TURNS = 32, 32, 4
ENVS = ("gymnax:FrozenLake-misc", "gymnax:Catch-bsuite", "gymnax:BernoulliBandit-misc")


def reference_text(env, obs):
    """The adapter's text written out with Python's formatting."""
    if env.render_mode == "grid":
        rows = ["".join(env.symbols.get(float(v), "?") for v in row) for row in np.asarray(obs)]
        return "Observation:\n" + "\n".join(rows)
    fmt = (lambda v: str(int(v))) if env.integer_obs else (lambda v: f"{float(v):.{env.decimals}f}")
    return "Observation: " + " ".join(fmt(v) for v in np.asarray(obs).reshape(-1))


def adapted(env_id, tokenizer):
    """(env, params, step, reset) of `env_id` with one action per turn, built once for the session."""
    env, params = make_env(env_id, tokenizer, max_actions_per_turn=1, max_actions_per_traj=100)
    reset, step = batched(env)
    return env, params, step, reset


@functools.cache
def gymnax_turn(env, params):
    """gymnax's side of one adapter turn over the batch, compiled once per env: action k of a turn gets
    split(step_key, max_actions_per_turn)[k]; episodes over before the turn keep their old gymnax state."""
    g = env.gymnax_env

    def turn(keys, g_state, g_obs, actions, over):
        action_keys = jax.vmap(lambda k: jax.random.split(k, env.max_actions_per_turn)[0])(keys)
        obs, new, reward, term, _ = jax.vmap(g.step_env, in_axes=(0, 0, 0, None))(action_keys, g_state, actions, params)
        g_over = term | jax.vmap(g.is_truncated, in_axes=(0, None))(new, params)
        keep = lambda a, b: jnp.where(over.reshape((-1,) + (1,) * (a.ndim - 1)), a, b)
        return obs, reward, g_over, keep(g_obs, obs), strong_types(jax.tree.map(keep, g_state, new))

    return jit(turn)


@pytest.mark.parametrize("env_id", ENVS)
def test_transitions_and_text_match_gymnax(env_id, builtin_tokenizer):
    """Action k of a turn uses split(step_key, max_actions_per_turn)[k]; gymnax gets the same key."""
    env, params, step, reset = adapted(env_id, builtin_tokenizer)
    g = env.gymnax_env
    reset_keys = jax.random.split(jax.random.key(0), B)
    obs, state = reset(reset_keys, params)
    g_reset = jit(lambda k, p: strong_types(jax.vmap(g.reset_env, in_axes=(0, None))(k, p)))
    g_obs, g_state = g_reset(reset_keys, params)
    g_turn = gymnax_turn(env, params)
    actions = np.random.default_rng(0).integers(0, len(env.action_words), (TURNS, B)).astype(np.int32)
    over = np.zeros(B, bool)
    for t in range(TURNS):
        texts = env.render_texts(state)
        assert texts[0] == env.render_text(take(state, 0))
        for i in range(B):
            assert texts[i] == reference_text(env, np.asarray(g_obs)[i])
            assert obs_text(builtin_tokenizer, obs, i) == texts[i]
        keys = jax.random.split(jax.random.key(t + 1), B)
        tokens, lengths = encode(builtin_tokenizer, [f"<think>.</think><answer>{env.action_words[a]}</answer>"
                                                     for a in actions[t]], R)
        obs, state, reward, done, info = step(keys, state, tokens, lengths, params)
        g_obs_new, g_reward, g_over, g_obs, g_state = jax.device_get(g_turn(keys, g_state, g_obs, actions[t], over))
        live = ~over  # finished episodes stay put in the adapter
        np.testing.assert_array_equal(np.asarray(reward)[live], np.asarray(g_reward, np.float32)[live])
        np.testing.assert_array_equal(np.asarray(state.env.obs)[live], g_obs_new[live])
        np.testing.assert_array_equal(np.asarray(info["terminated"])[live], g_over[live])
        over |= g_over


def test_number_format_matches_python(builtin_tokenizer):
    env = GymnaxText(builtin_tokenizer, "BernoulliBandit-misc", decimals=3, int_digits=3)
    values = np.concatenate([np.arange(-400, 401) / 8, [0.0, -0.0, 999.999, 12.0625]]).astype(np.float32)
    pieces = np.asarray(jit(jax.vmap(env._number_pieces))(values))
    for v, p in zip(values, pieces):
        assert env.pieces.text(p) == f" {float(v):.3f}"


def test_render_decodes_with_bpe(bpe_tokenizer):
    env, params = environments.make("gymnax:Catch-bsuite", bpe_tokenizer)
    obs, state = jit(env.reset)(jax.random.key(2), params)
    assert obs_text(bpe_tokenizer, obs) == env.render_text(state)


def test_catch_oracle_always_catches(builtin_tokenizer):
    env, params, step, reset = adapted("gymnax:Catch-bsuite", builtin_tokenizer)
    _, state = reset(jax.random.split(jax.random.key(4), B), params)
    rng = np.random.default_rng(0)
    for turn in range(env.gymnax_env.rows - 1):
        answers = [a[1] if a else "x" for a in env.oracles(state, rng)]
        tokens, lengths = encode(builtin_tokenizer, [f"<think>.</think><answer>{a}</answer>" for a in answers], R)
        state = step(jax.random.split(jax.random.key(turn), B), state, tokens, lengths, params)[1]
    assert np.asarray(state.done).all() and np.asarray(state.env.won).all()


def test_frozen_lake_and_bandit_oracles(builtin_tokenizer):
    """Oracle answers follow a shortest hole-free path (checked on gymnax's map) / name the best arm."""
    env, params, _, reset = adapted("gymnax:FrozenLake-misc", builtin_tokenizer)
    state = take(reset(jax.random.split(jax.random.key(0), B), params)[1], 0)
    _, answer = env.oracle(state, np.random.default_rng(0), max_actions=8)
    desc = np.asarray(env.gymnax_env.desc).reshape(-1)
    pos, moves = 0, {"Left": (0, -1), "Down": (1, 0), "Right": (0, 1), "Up": (-1, 0)}
    for word in answer.split(" || "):
        r, c = divmod(pos, 4)
        dr, dc = moves[word]
        assert 0 <= r + dr < 4 and 0 <= c + dc < 4
        pos = (r + dr) * 4 + c + dc
        assert desc[pos] != 2  # never a hole
    assert desc[pos] == 3 and len(answer.split(" || ")) == 6  # the goal, in the fewest moves
    env, params, _, reset = adapted("gymnax:BernoulliBandit-misc", builtin_tokenizer)
    states = reset(jax.random.split(jax.random.key(1), B), params)[1]
    for i in range(4):
        state = take(states, i)
        best = int(np.argmax(state.env.inner.reward_probs))
        assert env.oracle(state, np.random.default_rng(0), max_actions=2)[1] == f"Arm{best} || Arm{best}"


@pytest.mark.parametrize("env_id", ENVS)
@settings(max_examples=15, deadline=None)
@given(seed=st.integers(0, 2**31 - 1))
def test_random_tokens_never_crash_or_corrupt(env_id, builtin_tokenizer, seed):
    env, params, step, reset = adapted(env_id, builtin_tokenizer)
    rng = np.random.default_rng(seed)
    _, state = reset(jax.random.split(jax.random.key(seed), B), params)
    tokens, lengths = random_responses(rng, builtin_tokenizer, B, R)
    _, new, reward, _, info = step(jax.random.split(jax.random.key(1), B), state, tokens, lengths, params)
    assert_no_action_no_change(state, new, reward, info)

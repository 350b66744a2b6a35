"""The generic gymnax adapter against gymnax itself (same keys, same transitions) and a Python render."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import environments
from environments.gymnax_adapter import GymnaxText

B, R, TURNS = 32, 32, 4
ENVS = ("gymnax:FrozenLake-misc", "gymnax:Catch-bsuite", "gymnax:BernoulliBandit-misc")


def reference_text(env, obs):
    """The adapter's text written out with Python's formatting."""
    if env.render_mode == "grid":
        rows = ["".join(env.symbols.get(float(v), "?") for v in row) for row in np.asarray(obs)]
        return "Observation:\n" + "\n".join(rows)
    fmt = (lambda v: str(int(v))) if env.integer_obs else (lambda v: f"{float(v):.{env.decimals}f}")
    return "Observation: " + " ".join(fmt(v) for v in np.asarray(obs).reshape(-1))


@pytest.fixture(scope="module", params=ENVS)
def adapted(request, builtin_tokenizer):
    env, params = environments.make(request.param, builtin_tokenizer, max_actions_per_turn=1,
                                    max_actions_per_traj=100)
    step = jax.jit(jax.vmap(env.step, in_axes=(0, 0, 0, 0, None)))
    reset = jax.jit(jax.vmap(env.reset, in_axes=(0, None)))
    return env, params, step, reset


def responses(tokenizer, answers):
    tokens = np.zeros((len(answers), R), np.int32)
    lengths = np.zeros(len(answers), np.int32)
    for i, a in enumerate(answers):
        ids = tokenizer.encode(f"<think>.</think><answer>{a}</answer>")
        tokens[i, : len(ids)], lengths[i] = ids, len(ids)
    return jnp.asarray(tokens), jnp.asarray(lengths)


def test_transitions_and_text_match_gymnax(adapted, builtin_tokenizer):
    """Action k of a turn uses split(step_key, max_actions_per_turn)[k]; gymnax gets the same key."""
    env, params, step, reset = adapted
    g = env.gymnax_env
    reset_keys = jax.random.split(jax.random.key(0), B)
    obs, state = reset(reset_keys, params)
    g_obs, g_state = jax.vmap(g.reset_env, in_axes=(0, None))(reset_keys, params)
    g_step = jax.jit(jax.vmap(g.step_env, in_axes=(0, 0, 0, None)))
    actions = np.random.default_rng(0).integers(0, len(env.action_words), (TURNS, B))
    over = np.zeros(B, bool)
    for t in range(TURNS):
        texts = env.render_texts(state)
        assert texts[0] == env.render_text(jax.tree.map(lambda x: x[0], state))
        for i in range(B):
            assert texts[i] == reference_text(env, g_obs[i])
            assert builtin_tokenizer.decode(np.asarray(obs.tokens[i, : obs.length[i]])) == texts[i]
        keys = jax.random.split(jax.random.key(t + 1), B)
        tokens, lengths = responses(builtin_tokenizer, [env.action_words[a] for a in actions[t]])
        obs, state, reward, done, info = step(keys, state, tokens, lengths, params)
        action_keys = jax.vmap(lambda k: jax.random.split(k, env.max_actions_per_turn)[0])(keys)
        g_obs_new, g_state_new, g_reward, g_term, _ = g_step(action_keys, g_state, jnp.asarray(actions[t]), params)
        live = ~over  # finished episodes stay put in the adapter
        np.testing.assert_array_equal(np.asarray(reward)[live], np.asarray(g_reward, np.float32)[live])
        np.testing.assert_array_equal(np.asarray(state.env.obs)[live], np.asarray(g_obs_new)[live])
        g_over = np.asarray(g_term | jax.vmap(g.is_truncated, in_axes=(0, None))(g_state_new, params))
        np.testing.assert_array_equal(np.asarray(info["terminated"])[live], g_over[live])
        frozen = jnp.asarray(over)  # finished before this turn: keep the old gymnax state
        over |= g_over
        g_obs = jnp.where(frozen.reshape((B,) + (1,) * (g_obs.ndim - 1)), g_obs, g_obs_new)
        g_state = jax.tree.map(lambda a, b: jnp.where(frozen.reshape((B,) + (1,) * (a.ndim - 1)), a, b),
                               g_state, g_state_new)


def test_number_format_matches_python(builtin_tokenizer):
    env = GymnaxText(builtin_tokenizer, "BernoulliBandit-misc", decimals=3, int_digits=3)
    values = np.concatenate([np.arange(-400, 401) / 8, [0.0, -0.0, 999.999, 12.0625]]).astype(np.float32)
    pieces = np.asarray(jax.jit(jax.vmap(env._number_pieces))(jnp.asarray(values)))
    for v, p in zip(values, pieces):
        assert env.pieces.text(p) == f" {float(v):.3f}"


def test_render_decodes_with_bpe(bpe_tokenizer):
    env, params = environments.make("gymnax:Catch-bsuite", bpe_tokenizer)
    obs, state = jax.jit(env.reset)(jax.random.key(2), params)
    assert bpe_tokenizer.decode(np.asarray(obs.tokens[: obs.length])) == env.render_text(state)


@pytest.mark.parametrize("adapted", ["gymnax:Catch-bsuite"], indirect=True)
def test_catch_oracle_always_catches(adapted, builtin_tokenizer):
    env, params, step, reset = adapted
    _, state = reset(jax.random.split(jax.random.key(4), B), params)
    rng = np.random.default_rng(0)
    for turn in range(env.gymnax_env.rows - 1):
        answers = [a[1] if a else "x" for a in env.oracles(state, rng)]
        state = step(jax.random.split(jax.random.key(turn), B), state, *responses(builtin_tokenizer, answers), params)[1]
    assert np.asarray(state.done).all() and np.asarray(state.env.won).all()


def test_frozen_lake_and_bandit_oracles(builtin_tokenizer):
    """Oracle answers follow a shortest hole-free path (checked on gymnax's map) / name the best arm."""
    env, params = environments.make("gymnax:FrozenLake-misc", builtin_tokenizer, max_actions_per_turn=8)
    state = jax.jit(env.reset)(jax.random.key(0), params)[1]
    _, answer = env.oracle(state, np.random.default_rng(0))
    desc = np.asarray(env.gymnax_env.desc).reshape(-1)
    pos, moves = 0, {"Left": (0, -1), "Down": (1, 0), "Right": (0, 1), "Up": (-1, 0)}
    for word in answer.split(" || "):
        r, c = divmod(pos, 4)
        dr, dc = moves[word]
        assert 0 <= r + dr < 4 and 0 <= c + dc < 4
        pos = (r + dr) * 4 + c + dc
        assert desc[pos] != 2  # never a hole
    assert desc[pos] == 3 and len(answer.split(" || ")) == 6  # the goal, in the fewest moves
    env, params = environments.make("gymnax:BernoulliBandit-misc", builtin_tokenizer)
    state = jax.jit(env.reset)(jax.random.key(1), params)[1]
    best = int(np.argmax(np.asarray(state.env.inner.reward_probs)))
    assert env.oracle(state, np.random.default_rng(0))[1] == f"Arm{best} || Arm{best}"


@settings(max_examples=15, deadline=None)
@given(seed=st.integers(0, 2**31 - 1))
def test_random_tokens_never_crash_or_corrupt(adapted, builtin_tokenizer, seed):
    env, params, step, reset = adapted
    rng = np.random.default_rng(seed)
    _, state = reset(jax.random.split(jax.random.key(seed), B), params)
    tokens = rng.integers(-3, builtin_tokenizer.vocab_size + 3, (B, R)).astype(np.int32)
    lengths = rng.integers(-2, R + 3, B).astype(np.int32)
    _, new, reward, _, info = step(jax.random.split(jax.random.key(1), B), state, jnp.asarray(tokens),
                                   jnp.asarray(lengths), params)
    unchanged = np.asarray(info["num_actions"]) == 0
    for a, b in zip(jax.tree.leaves(state), jax.tree.leaves(new)):
        np.testing.assert_array_equal(np.asarray(a)[unchanged], np.asarray(b)[unchanged])
    np.testing.assert_array_equal(np.asarray(reward)[unchanged], 0.0)

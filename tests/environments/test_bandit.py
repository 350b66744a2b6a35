"""Bandit (docs/environments.md#bandit; RAGEN's per-instance seeding not copied): prompts from the reset key only,
payout distribution, validity."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import environments
from environments.bandit import ARM_PAIRS
from tests.environments.helpers import (
    assert_no_action_no_change, batched, encode, make_env, obs_text, random_responses, take,
)

B, R = 1024, 48


def reference_prompt(a, b):
    return (
        "You are playing a bandit game. Goal: maximize your total reward by choosing which arm to pull.\n"
        f"Game rules:\n1. There are 2 arms, named {a} and {b}.\n"
        "2. Each arm has its own reward distribution, related to its name.\n"
        "3. Think about the symbolic meaning of each arm's name to guess how its rewards behave.\n"
        "4. Based on the names, which arm is more likely to give higher rewards on average? "
        f"Choose between {a} and {b}, and answer like <answer> {a} </answer> or <answer> {b} </answer>.\n"
    )


@pytest.fixture(scope="module")
def bandit(builtin_tokenizer):
    env, params = make_env("bandit", builtin_tokenizer)
    reset, step = batched(env)
    return env, params, step, reset


def responses(tokenizer, answers):
    return encode(tokenizer, [f"<think>hmm</think><answer> {a} </answer>" for a in answers], R)


def shown_names(env, s):
    """The arm names in the order the prompt of one unbatched state shows them."""
    lo, hi = env.pairs[int(s.env.pair)]
    return (hi, lo) if bool(s.env.hi_first) else (lo, hi)


def test_same_key_same_prompt_and_uniform_draws(bandit, builtin_tokenizer):
    env, params, _, reset = bandit
    keys = jax.random.split(jax.random.key(0), B // 16)
    group_keys = jnp.repeat(keys, 16)  # 16 members per group share the reset key
    obs, state = reset(group_keys, params)
    tokens = np.asarray(obs.tokens).reshape(B // 16, 16, -1)
    assert (tokens == tokens[:, :1]).all()
    pairs = np.bincount(np.asarray(state.env.pair)[::16], minlength=12)
    assert pairs.min() > 0 and set(np.flatnonzero(pairs)) == set(range(12))
    assert 0.35 < np.asarray(state.env.hi_first).mean() < 0.65


def test_render_matches_the_prompt(tokenizer):
    env, params = make_env("bandit_test", tokenizer)
    obs, state = batched(env).reset(jax.random.split(jax.random.key(1), 16), params)
    for i in range(16):
        one = take(state, i)
        text = env.render_text(one)
        assert text == reference_prompt(*shown_names(env, one))
        assert obs_text(tokenizer, obs, i) == text
    assert set(env.action_words) == {n for pair in ARM_PAIRS["test"] for n in pair}
    assert not set(env.action_words) & {n for pair in ARM_PAIRS["train"] for n in pair}


def test_payouts_and_success(bandit, builtin_tokenizer):
    env, params, step, reset = bandit
    _, state = reset(jnp.repeat(jax.random.split(jax.random.key(2), 1), B), params)  # one prompt for all
    lo, hi = env.pairs[int(state.env.pair[0])]
    other = env.pairs[(int(state.env.pair[0]) + 1) % len(env.pairs)][1]
    answers = [hi.upper() if i % 2 else lo.lower() for i in range(B - 8)] + [other] * 4 + ["Left"] * 4
    tokens, lengths = responses(builtin_tokenizer, answers)
    obs, new, reward, done, info = step(jax.random.split(jax.random.key(3), B), state, tokens, lengths, params)
    reward, success = np.asarray(reward), np.asarray(info["success"])
    high = np.arange(B - 8) % 2 == 1
    np.testing.assert_allclose(reward[: B - 8][~high], 0.1, rtol=1e-6)
    hits = reward[: B - 8][high]
    assert set(np.unique(hits)) <= {0.0, 1.0}
    n = high.sum()
    assert abs(hits.mean() - 0.25) <= 4.5 * np.sqrt(0.25 * 0.75 / n)
    np.testing.assert_array_equal(success[: B - 8], high)
    assert np.asarray(done)[: B - 8].all() and np.asarray(info["format_ok"])[: B - 8].all()
    # a name from another pair or a non-name: invalid, nothing happens
    assert not np.asarray(info["format_ok"])[B - 8 :].any() and not np.asarray(done)[B - 8 :].any()
    np.testing.assert_array_equal(np.asarray(new.env.pulled)[B - 8 :], -1)
    for i in (0, 1):
        name, pay = (hi, "1.0" if reward[i] == 1.0 else "0.0") if i % 2 else (lo, "0.1")
        assert env.render_text(take(new, i)) == f"{name}: {pay} points"
        assert obs_text(builtin_tokenizer, obs, i) == f"{name}: {pay} points"
    # a sweep value of the traced params, no recompile
    params2 = params.replace(hi_prob=jnp.float32(1.0))
    reward2 = np.asarray(step(jax.random.split(jax.random.key(4), B), state, tokens, lengths, params2)[2])
    np.testing.assert_array_equal(reward2[: B - 8][high], 1.0)


def test_oracle_picks_the_high_risk_arm(bandit, builtin_tokenizer):
    env, params, step, reset = bandit
    _, state = reset(jax.random.split(jax.random.key(5), B), params)
    rng = np.random.default_rng(0)
    answers = []
    for i in range(B):
        one = take(state, i)
        reasoning, answer = env.oracle(one, rng)
        assert all(name in reasoning for name in shown_names(env, one))
        answers.append(answer)
    info = step(jax.random.split(jax.random.key(6), B), state, *responses(builtin_tokenizer, answers), params)[4]
    assert np.asarray(info["success"]).all()


@settings(max_examples=20, deadline=None)
@given(seed=st.integers(0, 2**31 - 1))
def test_random_tokens_never_crash_or_corrupt(bandit, builtin_tokenizer, seed):
    env, params, step, reset = bandit
    rng = np.random.default_rng(seed)
    _, state = reset(jax.random.split(jax.random.key(seed), B), params)
    tokens, lengths = random_responses(rng, builtin_tokenizer, B, R)
    _, new, reward, _, info = step(jax.random.split(jax.random.key(1), B), state, tokens, lengths, params)
    assert_no_action_no_change(state, new, reward, info)

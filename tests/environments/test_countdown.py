"""Countdown: generated instances are solvable (brute force), rewards follow RAGEN's Python rules."""
import functools
import itertools
import re
from fractions import Fraction

import jax
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import environments
from environments.countdown import Countdown
from tests.environments.helpers import (
    batched, countdown_sampler, encode, instance_indices, key_seeds, make_env, obs_text, random_responses, take,
)

R = 256  # response tokens
B = 16  # envs per call (one compiled step for the module)


def all_values(nums, ops):
    """Every value of an expression using each of `nums` once (any order and bracketing)."""
    return _values(tuple(sorted(nums)), ops)


@functools.lru_cache(maxsize=None)
def _values(multiset, ops):
    if len(multiset) == 1:
        return frozenset({Fraction(multiset[0])})
    out = set()
    idx = range(len(multiset))
    for k in range(1, len(multiset)):
        for left in itertools.combinations(idx, k):
            right = tuple(multiset[i] for i in idx if i not in left)
            for a in _values(tuple(multiset[i] for i in left), ops):
                for b in _values(right, ops):
                    out |= {a + b} if "+" in ops else set()
                    out |= {a - b} if "-" in ops else set()
                    out |= {a * b} if "*" in ops else set()
                    out |= {a / b} if "/" in ops and b != 0 else set()
    return frozenset(out)


def ragen_reward(answer, nums, target):
    """RAGEN's CountdownEnv.compute_reward (check_format + check_correctness with eval)."""
    try:
        if sorted(int(n) for n in re.findall(r"\d+", answer)) != sorted(nums):
            return 0.0
    except ValueError:
        return 0.0
    try:
        return 1.0 if abs(eval(answer, {"__builtins__": None}, {}) - target) < 1e-5 else 0.1
    except Exception:
        return 0.1


@pytest.mark.parametrize("operators,max_target", [("+-", 999), ("+-*/", 100)])
def test_generated_instances_are_solvable(operators, max_target):
    sample = countdown_sampler(operators, max_target)
    nums, count, target = jax.device_get(sample(jax.random.split(jax.random.key(7), 100)))
    assert set(count.tolist()) == {3, 4}
    for row, c, t in zip(nums, count, target):
        given_nums = row[:c].tolist()
        assert (row[c:] == 0).all() and all(1 <= v <= 99 for v in given_nums)
        assert 1 <= t <= max_target
        assert Fraction(int(t)) in all_values(given_nums, operators), (given_nums, t)
        if operators == "+-":  # RAGEN's data filter: some +/- sign pattern hits the target
            assert any(sum(s * v for s, v in zip(signs, given_nums)) == t
                       for signs in itertools.product([1, -1], repeat=len(given_nums)))


@pytest.fixture(scope="module")
def env_fns(builtin_tokenizer):
    env, params = make_env("countdown", builtin_tokenizer)
    return env, params, *batched(env)


def test_render_and_oracle_answers(env_fns, builtin_tokenizer):
    env, params, reset, step = env_fns
    n = 16
    obs, state = reset(jax.random.split(jax.random.key(3), n), params)
    rng = np.random.default_rng(0)
    texts = []
    for i in range(n):
        s = take(state, i)
        c = int(s.env.count)
        want = f"Target: {int(s.env.target)}, nums: {s.env.nums[:c].tolist()}"
        assert env.render_text(s) == want
        assert obs_text(builtin_tokenizer, obs, i) == want
        reasoning, answer = env.oracle(s, rng)
        assert str(int(s.env.target)) in reasoning
        assert ragen_reward(answer, s.env.nums[:c].tolist(), int(s.env.target)) == 1.0
        texts.append(f"<think>{reasoning}</think><answer>{answer}</answer>")
    keys = jax.random.split(jax.random.key(4), n)
    obs, new, reward, done, info = step(keys, state, *encode(builtin_tokenizer, texts, R), params)
    np.testing.assert_array_equal(reward, 1.0)
    assert done.all() and info["success"].all() and info["format_ok"].all()
    assert env.render_text(take(new, 0)) == "Your answer get 1.0 points."


def test_rewards_match_ragen_rules(env_fns, builtin_tokenizer):
    env, params, reset, step = env_fns
    nums, target = [25, 4, 17], 83
    answers = ["25 * 4 - 17", "(25*4)-17 ", "25 + 4 + 17", "25 * 4 - 17 +", "25 * (4 - 17", "25 * 4",
               "25 * 4 - 17 - 0", "25 * 4 - 71", "4 * 25 - 17 = 83", "x", "25*4--17", "(25 - 17) / 4 * 0 + 83"]
    want = [ragen_reward(a, nums, target) for a in answers]
    assert want == [1.0, 1.0, 0.1, 0.1, 0.1, 0.0, 0.0, 0.0, 0.0, 0.0, 0.1, 0.0]
    answers += answers[: B - len(answers)]
    want = [ragen_reward(a, nums, target) for a in answers]
    _, state = reset(jax.random.split(jax.random.key(0), B), params)
    k = B
    state = state.replace(env=state.env.replace(
        nums=np.tile(np.asarray(nums + [0], np.int32), (k, 1)), count=np.full((k,), 3, np.int32),
        target=np.full((k,), target, np.int32)))
    texts = [f"<think>ok</think><answer>{a}</answer>" for a in answers]
    keys = jax.random.split(jax.random.key(1), k)
    _, new, reward, done, info = step(keys, state, *encode(builtin_tokenizer, texts, R), params)
    np.testing.assert_allclose(reward, want)
    np.testing.assert_array_equal(info["success"], np.array(want) == 1.0)
    assert done.all() and info["action_is_valid"].all()
    assert env.render_text(take(new, 2)) == "Your answer get 0.1 points."
    assert env.render_text(take(new, 5)) == "Your answer get 0 points."
    # no <answer>: no action, no reward, the state is unchanged and the episode goes on
    _, same, reward, done, info = step(jax.random.split(jax.random.key(1), k), state,
                                       *encode(builtin_tokenizer, ["25 * 4 - 17"] * k, R), params)
    assert not reward.any() and not done.any() and not info["format_ok"].any()
    assert jax.tree.all(jax.tree.map(lambda a, b: bool((a == b).all()), same, state))


@settings(max_examples=10, deadline=None)
@given(st.integers(0, 2**32 - 1))
def test_random_response_tokens_never_crash(env_fns, builtin_tokenizer, seed):
    env, params, reset, step = env_fns
    rng = np.random.default_rng(seed)
    _, state = reset(jax.random.split(jax.random.key(seed), B), params)
    tokens, lengths = random_responses(rng, builtin_tokenizer, B, R)
    tokens[: B // 2, :8] = encode(builtin_tokenizer, ["<think>x</think><answer>"], 8)[0]  # half open an answer
    _, new, reward, done, info = step(jax.random.split(jax.random.key(6), B), state, tokens, lengths, params)
    assert set(np.asarray(reward).tolist()) <= {0.0, 0.1, 1.0}
    np.testing.assert_array_equal(new.env.nums, state.env.nums)
    np.testing.assert_array_equal(new.env.target, state.env.target)


def test_bpe_render_and_dataset_instances(bpe_tokenizer):
    nums = np.array([[3, 5, 8, 0], [10, 20, 30, 40], [7, 7, 2, 0]], np.int32)
    instances = {"nums": nums, "count": np.array([3, 4, 3]), "target": np.array([16, 100, 0])}
    env, params = environments.make("countdown", bpe_tokenizer, instances=instances)
    keys = jax.random.split(jax.random.key(11), 12)
    obs, state = batched(env).reset(keys, params)
    seeds = np.asarray(key_seeds(keys))
    np.testing.assert_array_equal(instance_indices(keys, 3), seeds % 3)
    for i, j in enumerate(seeds % 3):
        c = int(instances["count"][j])
        want = f"Target: {instances['target'][j]}, nums: {nums[j, :c].tolist()}"
        assert env.render_text(take(state, i)) == want
        assert obs_text(bpe_tokenizer, obs, i) == want
    with pytest.raises(ValueError, match="count"):
        Countdown(bpe_tokenizer, instances={**instances, "count": np.array([3, 5, 3])})

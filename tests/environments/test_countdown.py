"""Countdown: generated instances are solvable (brute force), rewards follow RAGEN's Python rules."""
import functools
import itertools
import re
from fractions import Fraction

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import environments
from environments.countdown import Countdown, sample_instance
from environments.datasets import instance_index

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
    sample = jax.jit(jax.vmap(lambda k: sample_instance(k, operators=operators, max_target=max_target)))
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
    env, params = environments.make("countdown", builtin_tokenizer)
    reset = jax.jit(jax.vmap(env.reset, (0, None)))
    step = jax.jit(jax.vmap(env.step, (0, 0, 0, 0, None)))
    return env, params, reset, step


def encode(tokenizer, texts):
    tokens = np.zeros((len(texts), R), np.int32)
    lengths = np.zeros(len(texts), np.int32)
    for i, text in enumerate(texts):
        ids = tokenizer.encode(text)[:R]
        tokens[i, : len(ids)], lengths[i] = ids, len(ids)
    return jnp.asarray(tokens), jnp.asarray(lengths)


def unbatch(tree, i):
    return jax.tree.map(lambda x: x[i], tree)


def test_render_and_oracle_answers(env_fns, builtin_tokenizer):
    env, params, reset, step = env_fns
    n = 16
    obs, state = reset(jax.random.split(jax.random.key(3), n), params)
    rng = np.random.default_rng(0)
    texts = []
    for i in range(n):
        s = unbatch(state, i)
        c = int(s.env.count)
        want = f"Target: {int(s.env.target)}, nums: {s.env.nums[:c].tolist()}"
        assert env.render_text(s) == want
        assert builtin_tokenizer.decode(np.asarray(obs.tokens[i, : obs.length[i]])) == want
        reasoning, answer = env.oracle(s, rng)
        assert str(int(s.env.target)) in reasoning
        assert ragen_reward(answer, s.env.nums[:c].tolist(), int(s.env.target)) == 1.0
        texts.append(f"<think>{reasoning}</think><answer>{answer}</answer>")
    keys = jax.random.split(jax.random.key(4), n)
    obs, new, reward, done, info = step(keys, state, *encode(builtin_tokenizer, texts), params)
    np.testing.assert_array_equal(reward, 1.0)
    assert done.all() and info["success"].all() and info["format_ok"].all()
    assert env.render_text(unbatch(new, 0)) == "Your answer get 1.0 points."


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
        nums=jnp.tile(jnp.asarray(nums + [0], jnp.int32), (k, 1)), count=jnp.full((k,), 3, jnp.int32),
        target=jnp.full((k,), target, jnp.int32)))
    texts = [f"<think>ok</think><answer>{a}</answer>" for a in answers]
    keys = jax.random.split(jax.random.key(1), k)
    _, new, reward, done, info = step(keys, state, *encode(builtin_tokenizer, texts), params)
    np.testing.assert_allclose(reward, want)
    np.testing.assert_array_equal(info["success"], np.array(want) == 1.0)
    assert done.all() and info["action_is_valid"].all()
    assert env.render_text(unbatch(new, 2)) == "Your answer get 0.1 points."
    assert env.render_text(unbatch(new, 5)) == "Your answer get 0 points."
    # no <answer>: no action, no reward, the state is unchanged and the episode goes on
    _, same, reward, done, info = step(jax.random.split(jax.random.key(1), k), state,
                                       *encode(builtin_tokenizer, ["25 * 4 - 17"] * k), params)
    assert not reward.any() and not done.any() and not info["format_ok"].any()
    assert jax.tree.all(jax.tree.map(lambda a, b: bool((a == b).all()), same, state))


@settings(max_examples=10, deadline=None)
@given(st.integers(0, 2**32 - 1))
def test_random_response_tokens_never_crash(env_fns, builtin_tokenizer, seed):
    env, params, reset, step = env_fns
    rng = np.random.default_rng(seed)
    _, state = reset(jax.random.split(jax.random.key(seed), B), params)
    tokens = rng.integers(-3, builtin_tokenizer.vocab_size + 3, (B, R))
    prefix = encode(builtin_tokenizer, ["<think>x</think><answer>"] * B)[0][:, :8]
    tokens[: B // 2, :8] = np.asarray(prefix[: B // 2])  # half of them open an answer
    lengths = rng.integers(-2, R + 3, B)
    _, new, reward, done, info = step(jax.random.split(jax.random.key(6), B), state,
                                      jnp.asarray(tokens, jnp.int32), jnp.asarray(lengths, jnp.int32), params)
    assert set(np.asarray(reward).tolist()) <= {0.0, 0.1, 1.0}
    np.testing.assert_array_equal(new.env.nums, state.env.nums)
    np.testing.assert_array_equal(new.env.target, state.env.target)


def test_bpe_render_and_dataset_instances(bpe_tokenizer):
    nums = np.array([[3, 5, 8, 0], [10, 20, 30, 40], [7, 7, 2, 0]], np.int32)
    instances = {"nums": nums, "count": np.array([3, 4, 3]), "target": np.array([16, 100, 0])}
    env, params = environments.make("countdown", bpe_tokenizer, instances=instances)
    keys = jax.random.split(jax.random.key(11), 12)
    obs, state = jax.jit(jax.vmap(env.reset, (0, None)))(keys, params)
    seeds = np.asarray(jax.vmap(lambda k: jax.random.bits(k, (), jnp.uint32))(keys))
    np.testing.assert_array_equal(jax.vmap(instance_index, (0, None))(keys, 3), seeds % 3)
    for i, j in enumerate(seeds % 3):
        c = int(instances["count"][j])
        want = f"Target: {instances['target'][j]}, nums: {nums[j, :c].tolist()}"
        assert env.render_text(unbatch(state, i)) == want
        assert bpe_tokenizer.decode(np.asarray(obs.tokens[i, : obs.length[i]])) == want
    with pytest.raises(ValueError, match="count"):
        Countdown(bpe_tokenizer, instances={**instances, "count": np.array([3, 5, 3])})

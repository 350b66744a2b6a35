"""Arithmetic: generated answers vs a Python reference read from the rendered text; scoring rules."""
import re

import jax
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import environments
from environments.arithmetic import ITEMS, NAMES, TEMPLATES, problem_text
from tests.environments.helpers import (
    batched, encode, instance_indices, jit, key_seeds, make_env, obs_text, random_responses, sample_problems, take,
)

R = 256
B = 16


def reference_answer(text):
    """The answer of a rendered problem, computed from its text alone."""
    if text.startswith("What is "):
        return int(eval(text[len("What is "):-1]))  # exact: divisions are exact by construction
    n = [int(v) for v in re.findall(r"\d+", text)]
    rules = [
        (r"has \d+ boxes with \d+ .* gives away", lambda a, b, c: a * b - c),
        (r"buys \d+ packs .* among \d+ friends", lambda a, b, c: a * b // c if a * b % c == 0 else None),
        (r"had \d+ .*bought \d+ more and then lost", lambda a, b, c: a + b - c),
        (r"A shelf has \d+ rows .* adds \d+ more", lambda a, b, c: a * (b + c)),
        (r"saves \d+ dollars every week for \d+ weeks and then spends", lambda a, b, c: a * b - c),
        (r"reads \d+ pages a day for \d+ days. The book has", lambda a, b, c: c - a * b),
        (r"There are \d+ .* takes half of them and then puts \d+ back",
         lambda a, b: a // 2 + b if a % 2 == 0 else None),
        (r"has \d+ small .* and \d+ times as many large", lambda a, b: a + a * b),
    ]
    hits = [f for pattern, f in rules if re.search(pattern, text)]
    assert len(hits) == 1, text
    return hits[0](*n)


def test_generated_answers_match_the_text():
    template, numbers, name, item, answer = jax.device_get(sample_problems(jax.random.split(jax.random.key(0), 600)))
    assert set(template.tolist()) == set(range(len(TEMPLATES)))
    assert set(name.tolist()) == set(range(len(NAMES))) and set(item.tolist()) == set(range(len(ITEMS)))
    for t, nums, nm, it, ans in zip(template, numbers, name, item, answer):
        text = problem_text(t, nums, nm, it)
        assert all(0 <= int(v) <= 999 for v in re.findall(r"\d+", text)), text
        assert ans >= 0 and reference_answer(text) == ans, text


@pytest.fixture(scope="module")
def env_fns(builtin_tokenizer):
    env, params = make_env("arithmetic", builtin_tokenizer)
    return env, params, *batched(env)


def test_render_oracle_and_scoring(env_fns, builtin_tokenizer):
    env, params, reset, step = env_fns
    obs, state = reset(jax.random.split(jax.random.key(1), B), params)
    rng = np.random.default_rng(0)
    texts, golds = [], []
    for i in range(B):
        s = take(state, i)
        text = env.render_text(s)
        assert text == problem_text(s.env.template, s.env.numbers, s.env.name, s.env.item)
        assert obs_text(builtin_tokenizer, obs, i) == text
        reasoning, answer = env.oracle(s, rng)
        assert answer == str(reference_answer(text)) and answer in reasoning
        golds.append(int(answer))
        texts.append(f"<think>{reasoning}</think><answer>{answer}</answer>")
    keys = jax.random.split(jax.random.key(2), B)
    obs, new, reward, done, info = step(keys, state, *encode(builtin_tokenizer, texts, R), params)
    np.testing.assert_array_equal(reward, 1.0)
    assert done.all() and info["success"].all()
    assert env.render_text(take(new, 0)) == "Correct!"
    # variants: sign and spaces are fine, anything else around the number is not
    def variant(i, g):
        return [f" +{g} ", f"0{g}", f"{g + 1}", f"{g}.", f"{g} apples", f"-{g + 1}", "", f"{g}||{g + 1}"][i % 8]

    texts = [f"<think>x</think><answer>{variant(i, g)}</answer>" for i, g in enumerate(golds)]
    _, new, reward, done, info = step(keys, state, *encode(builtin_tokenizer, texts, R), params)
    want = [1.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 1.0] * 2
    np.testing.assert_array_equal(reward, want)
    np.testing.assert_array_equal(info["format_ok"], [i % 8 != 6 for i in range(B)])  # empty answer: no action
    np.testing.assert_array_equal(done, [i % 8 != 6 for i in range(B)])  # one attempt (RAGEN's budget)
    assert env.render_text(take(new, 2)) == "Incorrect. Please think again."


def test_second_attempt_earns_half(env_fns, builtin_tokenizer):
    env, params, reset, step = env_fns
    _, state = reset(jax.random.split(jax.random.key(3), B), params)
    state = state.replace(actions_left=np.full((B,), 2, np.int32))  # a budget of two attempts
    gold = np.asarray(state.env.answer)
    keys = jax.random.split(jax.random.key(0), B)
    wrong = encode(builtin_tokenizer, [f"<think>x</think><answer>{g + 1}</answer>" for g in gold], R)
    right = encode(builtin_tokenizer, [f"<think>x</think><answer>{g}</answer>" for g in gold], R)
    obs, state, r1, d1, _ = step(keys, state, *wrong, params)
    assert obs_text(builtin_tokenizer, obs, 0) == "Incorrect. Please think again."
    _, state, r2, d2, info = step(keys, state, *right, params)
    assert not r1.any() and not d1.any()
    assert (np.asarray(r2) == 0.5).all() and d2.all() and info["success"].all()


@settings(max_examples=10, deadline=None)
@given(st.integers(0, 2**32 - 1))
def test_random_response_tokens_never_crash(env_fns, builtin_tokenizer, seed):
    env, params, reset, step = env_fns
    rng = np.random.default_rng(seed)
    _, state = reset(jax.random.split(jax.random.key(seed), B), params)
    tokens, lengths = random_responses(rng, builtin_tokenizer, B, R)
    tokens[: B // 2, :8] = encode(builtin_tokenizer, ["<think>x</think><answer>"], 8)[0]  # half open an answer
    _, new, reward, done, info = step(jax.random.split(jax.random.key(6), B), state, tokens, lengths, params)
    assert set(np.asarray(reward).tolist()) <= {0.0, 1.0}
    np.testing.assert_array_equal(new.env.answer, state.env.answer)
    np.testing.assert_array_equal(new.env.numbers, state.env.numbers)


def test_dataset_problems(bpe_tokenizer):
    problems = {
        "question": ["What is 2 + 2?", "Simplify 6/8.", "A train has 1,200 seats; 200 are empty. How many are taken?"],
        "answer": ["4", "\\frac{3}{4}", "1,000"],
    }
    env, params = environments.make("arithmetic", bpe_tokenizer, problems=problems)
    reset, step = batched(env)
    keys = jax.random.split(jax.random.key(5), 12)
    obs, state = reset(keys, params)
    seeds = np.asarray(key_seeds(keys))
    np.testing.assert_array_equal(instance_indices(keys, 3), seeds % 3)
    for i, j in enumerate(seeds % 3):
        assert env.render_text(take(state, i)) == problems["question"][j]
        assert obs_text(bpe_tokenizer, obs, i) == problems["question"][j]
    # answers per problem: RAGEN's normalized string match, plus integer parsing for integer golds
    cases = {0: ["4", " +4", "four", "4.0"], 1: ["\\FRAC{3}{4}", "\\frac{3} {4}", "0.75", "3/4"],
             2: ["1,000", "1000", " 1 000 ", "100"]}
    want = {0: [1, 1, 0, 0], 1: [1, 1, 0, 0], 2: [1, 1, 1, 0]}
    rows = [(j, a, w) for j in cases for a, w in zip(cases[j], want[j])]
    first = {int(j): i for i, j in reversed(list(enumerate(seeds % 3)))}
    idx = np.array([first[j] for j, _, _ in rows])
    texts = [f"<think>x</think><answer>{a}</answer>" for _, a, _ in rows]
    keys = jax.random.split(jax.random.key(0), len(rows))
    _, _, reward, _, _ = step(keys, take(state, idx), *encode(bpe_tokenizer, texts, R), params)
    np.testing.assert_array_equal(reward, [w for _, _, w in rows])
    assert env.oracle(take(state, 0), np.random.default_rng(0))[1] == problems["answer"][int(seeds[0] % 3)]


def test_bpe_render_of_generated_problems(env_fns, bpe_tokenizer):
    """Generated problems (the module's reset) rendered by an env with the BPE tokenizer."""
    _, params, reset, _ = env_fns
    env, _ = environments.make("arithmetic", bpe_tokenizer)
    state = reset(jax.random.split(jax.random.key(8), B), params)[1]
    obs = jit(jax.vmap(env.render))(state.env)
    for i in range(B):
        s = take(state, i)
        text = problem_text(s.env.template, s.env.numbers, s.env.name, s.env.item)
        assert env.render_text(s) == text
        assert obs_text(bpe_tokenizer, obs, i) == text

"""Warm-start demonstrations of the task envs (`TextEnv.demonstrations`): the reasoning restates the observation,
every demonstrated answer is well formed and valid when the env parses and steps it, and q = 1 answers are the
oracle's (single-turn envs succeed at once), q = 0 ones right only by chance."""
from __future__ import annotations

import re

import jax
import numpy as np
import pytest

from ragen_jax.models.tokenizer import builtin
from ragen_jax.train.demonstrations import response_text
from tests.environments.helpers import batched, encode, make_env

BATCH = 32
# env -> a regex over the observation text whose groups must all appear in the reasoning
RESTATED = {"bandit": r"named (\w+) and (\w+)\.", "frozen_lake": r"Player: (\(\d, \d\))",
            "sokoban": r"Player(?: on target)?: (\(\d, \d\))", "countdown": r"Target: (\d+)"}


@pytest.mark.parametrize("name", sorted(RESTATED))
def test_demonstrations_restate_the_input_and_answer_validly(name):
    tokenizer = builtin()
    env, params = make_env(name, tokenizer)
    fns = batched(env)
    keys = jax.random.split(jax.random.key(0), BATCH)
    _, state = fns.reset(keys, params)
    observations = env.render_texts(state)
    prefill = "<think>"
    for q in (1.0, 0.0):
        demos = env.demonstrations(state, np.random.default_rng(1), q)
        for text, (reasoning, _) in zip(observations, demos):
            for part in re.search(RESTATED[name], text).groups():
                assert part in reasoning, (name, reasoning, text)
        tokens, lengths = encode(tokenizer, [prefill + response_text(r, a, True) for r, a in demos], 160)
        _, new, _, _, info = fns.step(keys, state, tokens, lengths, params)
        assert np.asarray(info["format_ok"]).all(), (name, q)
        success = np.asarray(info["success"]).mean()
        if q == 1.0 and name in ("bandit", "countdown"):
            assert success == 1.0
        if q == 0.0:
            assert success < 0.75, (name, success)


def test_a_state_without_an_oracle_answer_gets_a_random_one():
    env, params = make_env("frozen_lake", builtin())
    _, state = batched(env).reset(jax.random.split(jax.random.key(0), 8), params)
    rows = np.flatnonzero(np.asarray(state.env.holes).any(axis=1))  # maps with a hole
    state = jax.tree.map(lambda x: np.asarray(x)[rows], state)
    stuck = state.replace(env=state.env.replace(pos=np.argmax(state.env.holes, axis=1)))  # the player in a hole
    with pytest.raises(ValueError):
        env.oracle(jax.tree.map(lambda x: x[0], stuck), np.random.default_rng(0))
    demos = env.demonstrations(stuck, np.random.default_rng(0), oracle_prob=1.0)
    assert len(rows) >= 2 and all(d is not None and set(d[1].split(" || ")) <= set(env.action_words) for d in demos)

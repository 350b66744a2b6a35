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


# env (and its kwargs) -> the observation's label of the cell the reasoning's axis tail is about
TAIL_TARGET = {("frozen_lake", ()): "Goal", ("sokoban", (("push_distance", 1),)): "Boxes"}
CELL = r": \((\d), (\d)\)"


@pytest.mark.parametrize("name,kwargs", sorted(TAIL_TARGET))
def test_reasoning_tail_says_where_the_cell_lies_on_each_axis(name, kwargs):
    """The grid envs' reasoning ends "rows a to b: down, cols c to d: same." from the player to the goal (FrozenLake) or
    the box (Sokoban), checked against the coordinates of the observation text; in one-push Sokoban rooms the
    side named is the push that solves the room."""
    tokenizer = builtin()
    env, params = make_env(name, tokenizer, **dict(kwargs))
    _, state = batched(env).reset(jax.random.split(jax.random.key(2), BATCH), params)
    sides = {(-1, 0): "Up", (1, 0): "Down", (0, -1): "Left", (0, 1): "Right"}
    words = {-1: ("up", "left"), 0: ("same", "same"), 1: ("down", "right")}
    for text, (reasoning, answer) in zip(env.render_texts(state), env.demonstrations(state, np.random.default_rng(3), 1.0)):
        player = [int(x) for x in re.search("Player" + CELL, text).groups()]
        cell = [int(x) for x in re.search(TAIL_TARGET[name, kwargs] + CELL, text).groups()]
        sign = np.sign(np.subtract(cell, player)).tolist()
        expected = (f"rows {player[0]} to {cell[0]}: {words[sign[0]][0]}, "
                    f"cols {player[1]} to {cell[1]}: {words[sign[1]][1]}.")
        assert reasoning.endswith(expected), (reasoning, text)
        if kwargs:
            assert answer == sides[tuple(sign)]

"""The faithfulness score (environments/faithfulness.py): worked examples, every env's own description scoring 1
with both of its templates, the cells' facts read from the rendered observation, and another state's description
scoring exactly the share of facts the two states have in common."""
from __future__ import annotations

import re

import jax
import numpy as np
import pytest

from environments import faithfulness
from environments.faithfulness import Fact, restated, score
from ragen_jax.models.tokenizer import builtin
from tests.environments.helpers import batched, make_env

BATCH = 24
ENVS = ("bandit", "countdown", "frozen_lake", "sokoban")


def frozen_lake_facts(player, goal):
    rows = ("down" if goal[0] > player[0] else "up" if goal[0] < player[0] else "same")
    cols = ("right" if goal[1] > player[1] else "left" if goal[1] < player[1] else "same")
    return (Fact("player", r"Player: \((\d+), (\d+)\)", tuple(map(str, player))),
            Fact("goal", r"Goal: \((\d+), (\d+)\)", tuple(map(str, goal))),
            Fact("rows", r"rows (\d+) to (\d+): (\w+)", (str(player[0]), str(goal[0]), rows)),
            Fact("cols", r"cols (\d+) to (\d+): (\w+)", (str(player[1]), str(goal[1]), cols)))


def test_worked_examples():
    facts = frozen_lake_facts((1, 2), (3, 2))
    assert restated(facts, "Player: (1, 2). Goal: (3, 2); rows 1 to 3: down, cols 2 to 2: same.").all()
    wrong_goal = "Player: (1, 2). Goal: (3, 3); rows 1 to 3: down, cols 2 to 3: right."
    assert restated(facts, wrong_goal).tolist() == [True, False, True, False]
    assert score(facts, wrong_goal) == 0.5
    assert score(facts, "") == 0.0
    assert score(facts, "I think I should go down.") == 0.0
    # only the first statement of a fact counts
    assert restated(facts, "Player: (0, 0). Player: (1, 2).").tolist() == [False, False, False, False]
    assert np.isnan(score((), "anything"))


def test_cell_fact_and_tail_facts_match_the_helpers():
    from environments import axis_words

    player, goal = (0, 3), (2, 1)
    built = (faithfulness.cell_fact("Player", player), faithfulness.cell_fact("Goal", goal),
             *axis_words.tail_facts(player, goal))
    assert built == frozen_lake_facts(player, goal)


def states_of(name, seed):
    env, params = make_env(name, builtin())
    _, state = batched(env).reset(jax.random.split(jax.random.key(seed), BATCH), params)
    return env, state, [s for s in env._host_rows(state)]


@pytest.mark.parametrize("name", ENVS)
def test_every_description_restates_all_of_its_facts(name):
    env, _, rows = states_of(name, 0)
    rng = np.random.default_rng(0)
    for s in rows:
        facts = env.facts(s)
        assert len(facts) >= 1 and len({f.name for f in facts}) == len(facts)
        for _ in range(4):  # the envs draw one of two templates
            description = env.describe(s, rng)
            assert restated(facts, description).all(), (name, description, facts)


@pytest.mark.parametrize("name,labels", [("frozen_lake", ("Player", "Goal")), ("sokoban", ("Player",))])
def test_grid_cells_are_those_of_the_observation(name, labels):
    env, state, rows = states_of(name, 1)
    for text, s in zip(env.render_texts(state), rows):
        facts = {f.name: f for f in env.facts(s)}
        for label in labels:
            cell = re.search(label + r"(?: on target)?: \((\d+), (\d+)\)", text).groups()
            assert facts[label.lower()].value == cell, (text, facts)


@pytest.mark.parametrize("name", ENVS)
def test_another_states_description_scores_the_shared_facts(name):
    env, _, rows = states_of(name, 2)
    rng = np.random.default_rng(1)
    differing = 0
    for a, b in zip(rows, rows[1:]):
        facts_a, facts_b = env.facts(a), env.facts(b)
        shared = np.mean([fa.value == fb.value for fa, fb in zip(facts_a, facts_b)])
        assert score(facts_a, env.describe(b, rng)) == pytest.approx(shared)
        differing += shared < 1
    assert differing >= BATCH // 2, name

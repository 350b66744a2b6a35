"""Faithfulness of a reasoning to its observation: the share of the observation's facts that the reasoning restates
correctly (template collapse, experiments/studies: reasoning that stays fluent and diverse while it stops saying
what the input is).

An env lists the facts of a state with `TextEnv.facts(s) -> tuple[Fact, ...]`: each names one thing its
`describe(s)` restates, a regular expression whose groups capture how a reasoning states it, and the groups the
true state gives. A fact counts as restated when the expression's first match in the reasoning has exactly those
groups; a fact the reasoning does not state, or states wrongly, counts as not restated. So `describe(s)`'s own text
scores 1, a reasoning that names another state's facts scores the share the two states have in common, and a
reasoning that states nothing scores 0.

    facts = env.facts(s)                       # e.g. FrozenLake: player, goal, rows, cols
    restated(facts, "Player: (1, 2). ...")     # bool[len(facts)]
    score(facts, reasoning)                    # float in [0, 1]
"""
from __future__ import annotations

import re
from typing import NamedTuple, Sequence

import numpy as np


class Fact(NamedTuple):
    """One fact of an observation. name: a short label ("player"); pattern: a regex whose groups capture how a
    reasoning states the fact (r"Player: \\((\\d+), (\\d+)\\)"); value: the groups the true fact gives
    (("1", "2"))."""

    name: str
    pattern: str
    value: tuple[str, ...]


def restated(facts: Sequence[Fact], reasoning: str) -> np.ndarray:
    """bool[len(facts)]: whether `reasoning`'s first statement of each fact (the first match of its pattern) is true."""
    out = np.zeros(len(facts), bool)
    for i, fact in enumerate(facts):
        match = re.search(fact.pattern, reasoning)
        out[i] = match is not None and match.groups() == tuple(fact.value)
    return out


def score(facts: Sequence[Fact], reasoning: str) -> float:
    """The share of `facts` that `reasoning` restates correctly (`restated`); nan for a state without facts."""
    return float(restated(facts, reasoning).mean()) if facts else float("nan")


def cell_fact(label: str, cell: tuple[int, int]) -> Fact:
    """A grid cell stated with its observation label, "Player: (1, 2)" (name: the label in lower case)."""
    return Fact(label.lower(), re.escape(label) + r": \((\d+), (\d+)\)", (str(cell[0]), str(cell[1])))

"""Fuzzing every registered environment's in-graph parse + step with 10,000 hostile responses each.

Responses mix well-formed answers with too many actions, tag soup (nested, repeated, unclosed `<think>` /
`<answer>`), over-long answers and plain random ids (special tokens and ids outside the vocabulary
included), with EOS spliced in at random places, random ids overwriting some positions, random filler after
`length` and out-of-range lengths. Tags and words come both as the tokenizer encodes them and spelled one
byte per token: a model can emit either. `TURNS` turns are stepped on the same batch, so budgets run out and
finished episodes keep being stepped. After every turn the env's state invariants and the base's turn contract
are checked, with sockets blocked.
"""
from __future__ import annotations

import random
import zlib

import jax
import numpy as np
import pytest

import environments
from environments.arithmetic import Arithmetic
from environments.bandit import Bandit
from environments.countdown import Countdown
from environments.frozen_lake import FrozenLake
from environments.gymnax_adapter import GymnaxText
from environments.parsing import SPECIAL_STRINGS
from environments.sokoban import dynamics
from environments.sokoban.env import Sokoban
from tests.environments.helpers import assert_no_action_no_change, batched, make_env, take
from tests.guards import no_network

ROWS, TURNS, R = 2000, 5, 48  # ROWS * TURNS = 10,000 responses per env; R response tokens
RESETS = 100  # distinct reset instances, tiled to ROWS rows
BUDGET = dict(max_actions_per_turn=2, max_actions_per_traj=3)  # small, so budgets run out within TURNS
SEPARATORS = ("||", " || ", "|", " | ", "||||", ",", "")
GARBAGE = (" ", "\n", "\t", "x", "I think", "Up Down", "42", "-7", "3 + 4", "((", ")", "*", "/", "=", "√", "×",
           "é", "\x00", "answer", "think", "<", ">", "</", "<answer", "answer>", "< answer >", "<Answer>", "</ANSWER>")


class Fuzzer:
    """Builds batches of hostile responses (see the module docstring). Scalar draws use `random.Random`,
    which is far cheaper per call than a numpy Generator (10,000 responses take ~40 draws each)."""

    def __init__(self, tokenizer, seed: int):
        self.tok, self.rng, self.np_rng = tokenizer, random.Random(seed), np.random.default_rng(seed)
        self.tags = [*SPECIAL_STRINGS, *tokenizer.special_tokens]
        # the tokens of the most bytes: an answer of them overflows the answer and response byte buffers
        by_size = sorted(range(tokenizer.vocab_size), key=lambda i: len(tokenizer.token_bytes(i)))
        self.long_ids = by_size[-16:]
        self._ids: dict[tuple[str, bool], list[int]] = {}

    def ids(self, text: str) -> list[int]:
        spelled = self.rng.random() < 0.3
        if (text, spelled) not in self._ids:
            self._ids[text, spelled] = ([i for ch in text for i in self.tok.encode(ch)] if spelled
                                        else self.tok.encode(text))
        return self._ids[text, spelled]

    def word(self, answers: list[str]) -> str:
        w = self.rng.choice(answers)
        return self.rng.choice((w, w, w.lower(), w.upper(), f"  {w}\t"))

    def random_id(self) -> int:
        return self.rng.randrange(-3, self.tok.vocab_size + 3)

    def well_formed(self, answers) -> list[int]:
        """<think>..</think><answer>a || b ..</answer> with 0-6 actions (more than a turn allows), maybe more after."""
        parts = [self.word(answers) for _ in range(self.rng.randrange(7))]
        texts = ["<think>", self.rng.choice(GARBAGE), "</think>", self.rng.choice(("", " ", "\n")), "<answer>",
                 self.rng.choice(SEPARATORS[:4]).join(parts), "</answer>"]
        if self.rng.random() < 0.3:
            texts.append(self.rng.choice(GARBAGE + ("<answer>", "</answer>", "<think>")))
        return [t for text in texts for t in self.ids(text)]

    def tag_soup(self, answers) -> list[int]:
        """1-30 pieces drawn from tags, words, separators and garbage: nested, repeated and unclosed tags."""
        pool = (self.tags, answers, SEPARATORS, GARBAGE)
        return [t for _ in range(self.rng.randrange(1, 31)) for t in self.ids(self.rng.choice(self.rng.choice(pool)))]

    def over_long(self, answers) -> list[int]:
        """An answer of 10-60 actions or of the longest tokens: longer than the answer buffer, often unclosed."""
        head = self.ids("<think>x</think><answer>")
        if self.rng.random() < 0.5:
            body = self.ids(" || ".join(self.word(answers) for _ in range(self.rng.randrange(10, 61))))
        else:
            body = self.rng.choices(self.long_ids, k=self.rng.randrange(10, 61))
        return head + body + self.ids(self.rng.choice(("</answer>", "")))

    def batch(self, answers: list[list[str]], width: int) -> tuple[np.ndarray, np.ndarray]:
        """(tokens i32[rows, width], lengths i32[rows]); row i's plausible answers are answers[i]."""
        rows = len(answers)
        tokens = self.np_rng.integers(-3, self.tok.vocab_size + 3, (rows, width)).astype(np.int32)  # kept: random ids
        lengths = np.full(rows, width, np.int32)
        for i in range(rows):
            kind = self.rng.random()
            if kind < 0.25:
                ids = tokens[i].tolist()
            else:
                maker = self.well_formed if kind < 0.6 else self.tag_soup if kind < 0.85 else self.over_long
                ids = maker(answers[i])
            if self.rng.random() < 0.3:
                ids.insert(self.rng.randrange(len(ids) + 1), self.tok.eos_id)
            if ids and self.rng.random() < 0.2:
                for _ in range(self.rng.randrange(1, 4)):
                    ids[self.rng.randrange(len(ids))] = self.random_id()
            ids = ids[:width]
            tokens[i, : len(ids)] = ids  # the rest stays random filler: only `length` tokens may count
            lengths[i] = len(ids) if self.rng.random() < 0.9 else self.rng.randrange(-2, width + 3)
        return tokens, lengths


# ---------------------------------------------------------------------------------------- plausible answers
def plausible_answers(env, state, rng) -> list[list[str]]:
    """Per row, answers that can be right: the action words (Bandit: the row's two arms, valid, and two
    others), every number once (Countdown), the gold number in a few spellings and a wrong one (Arithmetic)."""
    rows = np.asarray(state.done).shape[0]
    if isinstance(env, Bandit):
        return [[*env.pairs[p], *env.pairs[p - 1]] for p in np.asarray(state.env.pair)]
    if isinstance(env, Countdown):
        return [[env.random_answer(take(state.env, i), rng)] for i in range(rows)]
    if isinstance(env, Arithmetic):
        gold = np.asarray(state.env.answer)
        return [[str(a), f"+{a}", f"0{a}", " ".join(str(a)), str(a + 1)] for a in gold]
    return [list(env.action_words)] * rows


# ---------------------------------------------------------------------------------------- invariants
def check_turn(env, old, new, obs, reward, done, info):
    """The base's turn contract (environments/base.py) on host copies of one batched turn."""
    n = info["num_actions"]
    assert reward.dtype == np.float32 and np.isfinite(reward).all()
    assert ((n >= 0) & (n <= env.max_actions_per_turn)).all()
    assert (info["num_valid_actions"] <= env.max_actions_per_turn).all()
    np.testing.assert_array_equal(new.actions_left, old.actions_left - n)  # the budget pays for executed actions
    assert (new.actions_left >= 0).all() and new.done[new.actions_left == 0].all()
    np.testing.assert_array_equal(done, new.done)
    assert new.done[old.done].all() and (n[old.done] == 0).all()  # done is sticky: nothing runs after the end
    assert_no_action_no_change(old, new, reward, info)
    assert ((obs.length > 0) & (obs.length <= env.obs_capacity)).all()
    inside = np.arange(obs.tokens.shape[1]) < obs.length[:, None]
    assert (obs.tokens[~inside] == env.tokenizer.pad_id).all()
    assert ((obs.tokens >= 0) & (obs.tokens < env.tokenizer.vocab_size)).all()


def check_sokoban(env, old, new, reward, done, info):
    np.testing.assert_array_equal(new.room.fixed, old.room.fixed)  # walls and targets never move
    fixed = new.room.fixed.reshape(len(done), -1)
    boxes, player = new.room.boxes, new.room.player
    cells = env.height * env.width
    assert ((boxes >= 0) & (boxes < cells)).all() and ((player >= 0) & (player < cells)).all()
    assert (np.take_along_axis(fixed, boxes, 1) != dynamics.WALL).all()
    assert (np.take_along_axis(fixed, player[:, None], 1) != dynamics.WALL).all()
    assert (np.diff(np.sort(boxes, 1), axis=1) != 0).all() and (boxes != player[:, None]).all()  # box count kept
    np.testing.assert_array_equal(new.num_env_steps, old.num_env_steps + info["num_actions"])
    # per action: the step penalty, +-1 for a box on / off a target, +10 once solved
    n = info["num_actions"]
    assert (reward >= -1.1 * n - 1e-5).all() and (reward <= 10.9 * n + 1e-5).all()


def check_frozen_lake(env, old, new, reward, done, info):
    for field in ("holes", "start", "goal"):
        np.testing.assert_array_equal(getattr(new, field), getattr(old, field))
    n, size = info["num_actions"], env.size
    assert ((new.pos >= 0) & (new.pos < size * size)).all()
    moved = np.abs(new.pos // size - old.pos // size) + np.abs(new.pos % size - old.pos % size)
    assert (moved <= n).all()  # one tile per executed action at most
    np.testing.assert_array_equal(reward, ((new.pos == new.goal) & (n > 0)).astype(np.float32))
    in_hole = np.take_along_axis(new.holes, new.pos[:, None], 1)[:, 0]
    assert done[in_hole | (new.pos == new.goal)].all()


def check_bandit(env, old, new, reward, done, info):
    np.testing.assert_array_equal(new.pair, old.pair)
    np.testing.assert_array_equal(new.hi_first, old.hi_first)
    assert np.isin(new.pulled, (-1, 0, 1)).all() and ((old.pulled == -1) | (new.pulled == old.pulled)).all()
    assert done[new.pulled >= 0].all()  # one pull ends the episode
    assert np.isin(reward, np.float32([0.0, 0.1, 1.0])).all() and (new.pulled[reward > 0] >= 0).all()


def check_countdown(env, old, new, reward, done, info):
    for field in ("nums", "count", "target"):
        np.testing.assert_array_equal(getattr(new, field), getattr(old, field))
    assert np.isin(new.outcome, (-1, 0, 1, 2)).all() and done[new.outcome >= 0].all()
    answered = info["num_actions"] > 0
    np.testing.assert_array_equal(reward[answered], np.float32(env.rewards)[new.outcome[answered]])


def check_arithmetic(env, old, new, reward, done, info):
    for field in ("template", "numbers", "name", "item", "index", "answer", "answer_is_int"):
        np.testing.assert_array_equal(getattr(new, field), getattr(old, field))
    np.testing.assert_array_equal(new.attempts, old.attempts + info["num_actions"])
    solved_now = new.solved & ~old.solved
    assert (new.solved >= old.solved).all() and done[new.solved].all()
    np.testing.assert_array_equal(reward, np.where(solved_now, 0.5 ** old.attempts, 0.0).astype(np.float32))


def check_gymnax(env, old, new, reward, done, info):
    np.testing.assert_array_equal(new.inner.time, old.inner.time + info["num_actions"])
    space = env.gymnax_env.observation_space(env.default_params)
    assert np.isfinite(new.obs).all() and bool(np.all(space.contains(new.obs)))
    assert done[new.over].all() and new.over[new.won].all()
    np.testing.assert_array_equal(info["success"], new.won)


CHECKS = {Sokoban: check_sokoban, FrozenLake: check_frozen_lake, Bandit: check_bandit, Countdown: check_countdown,
          Arithmetic: check_arithmetic, GymnaxText: check_gymnax}


@pytest.mark.parametrize("name", environments.registered())
def test_hostile_responses_keep_every_invariant(name, builtin_tokenizer):
    env, params = make_env(name, builtin_tokenizer, **BUDGET)
    check_env = CHECKS[type(env)]  # a newly registered env class needs its invariants here
    fns = batched(env, fast_run=isinstance(env, Countdown))  # its evaluator makes the step 10x dearer per row
    seed = zlib.crc32(name.encode())
    fuzzer, rng = Fuzzer(builtin_tokenizer, seed), np.random.default_rng(seed)
    _, state = fns.reset(jax.random.split(jax.random.key(0), RESETS), params)
    state = jax.tree.map(lambda x: np.resize(np.asarray(x), (ROWS, *x.shape[1:])), state)
    executed = stepped_after_done = 0
    with no_network():
        for turn in range(TURNS):
            tokens, lengths = fuzzer.batch(plausible_answers(env, state, rng), R)
            keys = jax.random.split(jax.random.key(turn + 1), ROWS)
            obs, new, reward, done, info = jax.device_get(fns.step(keys, state, tokens, lengths, params))
            check_turn(env, state, new, obs, reward, done, info)
            check_env(env, state.env, new.env, reward, done, info)
            executed += int((info["num_actions"] > 0).sum())
            stepped_after_done += int(state.done.sum())
            state = new
    # the fuzzer reached the interesting paths: actions ran, episodes ended and were stepped again
    assert executed > ROWS // 20 and stepped_after_done > ROWS // 20, (executed, stepped_after_done)

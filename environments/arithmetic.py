"""Arithmetic (our stand-in for MetaMathQA, docs/environments.md#arithmetic): multi-step word and arithmetic problems.

Problems are generated IN JAX from the reset key: a template (8 word problems such as "Tom has 3 boxes
with 7 apples in each box. Tom gives away 4 apples. How many apples does Tom have now?" and 4 plain
multi-step expressions such as "What is (12 + 7) * 3 - 5?"), a name, an item and numbers sampled
so that the single answer is a non-negative integer (divisions exact by construction). The text is
rendered in-graph from a pieces table (template fragments, numbers 0..999, names, items).

Alternatively `problems=` takes a dataset of question/answer texts (e.g. MetaMathQA or GSM8K through
`environments.datasets.math_jsonl`, or generated problems from `environments.datasets.generated`):
each question is one piece of the table (tokenized once, as the tokenizer would), and instance
`instance_index(key, size)` = seed mod size is drawn.

Scoring follows RAGEN's MetamathQA env: the answer (first `||`-part of `<answer>`) is correct when,
with whitespace removed and lower-cased, it equals the gold answer string; additionally, when the gold
answer is an integer, any answer that parses as that integer once whitespace is removed
(`[+|-]digits`, e.g. "+18", "018" or "1 000") is correct. Case folding in the graph is ASCII only.
Reward 1 / 2^(previous attempts) when correct, else 0; a correct answer ends the episode; the next
observation is "Correct!" or "Incorrect. Please think again.". Any non-empty answer is a valid
action. `max_actions_per_traj` defaults to 1 (RAGEN: one attempt per trajectory).
"""
from __future__ import annotations

import re
import string
from typing import Callable, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from environments import registry
from environments.base import TextEnv
from environments.datasets import instance_index
from environments.expression import parse_integer
from environments.pieces import PieceTable

NAMES = ("Tom", "Anna", "Ben", "Maria", "Sam", "Lena", "Omar", "Mia", "Ravi", "Yuki")
ITEMS = ("apples", "books", "pencils", "stickers", "marbles", "cookies", "cards", "shells")
MAX_NUMBER = 999  # every number in a generated problem text is in [0, MAX_NUMBER]
SLOTS = "abcd"
_WHITESPACE = tuple(ord(c) for c in " \t\n\r\x0b\x0c")
INSTRUCTION = (
    "You are solving math problems. Read the problem, reason step by step, and give only the final "
    "answer, for example <answer>42</answer>."
)
CORRECT, INCORRECT = "Correct!", "Incorrect. Please think again."


def _pick(r, low, high):
    """An integer in [low, high] (traced bounds allowed) from a raw draw r in [0, 2^20)."""
    return low + r % (high - low + 1)


class Template(NamedTuple):
    """text: format string over {name} {item} {a} {b} {c} {d}; sample: raw i32[4] -> numbers i32[4];
    answer: numbers -> i32[] (JAX); steps: host list of numbers -> [(expression, value)], last = answer."""

    text: str
    sample: Callable
    answer: Callable
    steps: Callable


def _boxes(r):
    a, b = _pick(r[0], 2, 9), _pick(r[1], 2, 12)
    return jnp.stack([a, b, _pick(r[2], 1, a * b), 0])


def _share(r):
    c, b = _pick(r[0], 2, 6), _pick(r[1], 2, 10)
    return jnp.stack([c * _pick(r[2], 1, 5), b, c, 0])


def _buy_lose(r):
    a, b = _pick(r[0], 5, 60), _pick(r[1], 2, 40)
    return jnp.stack([a, b, _pick(r[2], 1, a + b), 0])


def _shelf(r):
    return jnp.stack([_pick(r[0], 2, 8), _pick(r[1], 2, 15), _pick(r[2], 1, 9), 0])


def _save(r):
    a, b = _pick(r[0], 3, 25), _pick(r[1], 2, 12)
    return jnp.stack([a, b, _pick(r[2], 1, a * b), 0])


def _pages(r):
    a, b = _pick(r[0], 5, 30), _pick(r[1], 2, 9)
    return jnp.stack([a, b, a * b + _pick(r[2], 0, 150), 0])


def _half(r):
    k = _pick(r[0], 3, 40)
    return jnp.stack([2 * k, _pick(r[1], 1, k), 0, 0])


def _times(r):
    return jnp.stack([_pick(r[0], 2, 20), _pick(r[1], 2, 9), 0, 0])


def _sum_product(r):
    return jnp.stack([_pick(r[0], 1, 99), _pick(r[1], 2, 12), _pick(r[2], 2, 12), 0])


def _group(r):
    a, b, c = _pick(r[0], 1, 30), _pick(r[1], 1, 30), _pick(r[2], 2, 9)
    return jnp.stack([a, b, c, _pick(r[3], 1, (a + b) * c)])


def _products(r):
    a, b = _pick(r[0], 2, 15), _pick(r[1], 2, 15)
    return jnp.stack([a, b, _pick(r[2], 1, a), _pick(r[3], 1, b)])


def _divide(r):
    a, b, d = _pick(r[0], 2, 12), _pick(r[1], 2, 12), _pick(r[2], 2, 9)
    return jnp.stack([a, b, (d - (a * b) % d) % d + d * _pick(r[3], 0, 3), d])


TEMPLATES = (
    Template("{name} has {a} boxes with {b} {item} in each box. {name} gives away {c} {item}. "
             "How many {item} does {name} have now?", _boxes, lambda n: n[0] * n[1] - n[2],
             lambda a, b, c, d: [(f"{a} * {b}", a * b), (f"{a * b} - {c}", a * b - c)]),
    Template("{name} buys {a} packs of {item} with {b} {item} in each pack and shares them equally "
             "among {c} friends. How many {item} does each friend get?", _share, lambda n: n[0] * n[1] // n[2],
             lambda a, b, c, d: [(f"{a} * {b}", a * b), (f"{a * b} / {c}", a * b // c)]),
    Template("{name} had {a} {item}, bought {b} more and then lost {c}. How many {item} does {name} "
             "have now?", _buy_lose, lambda n: n[0] + n[1] - n[2],
             lambda a, b, c, d: [(f"{a} + {b}", a + b), (f"{a + b} - {c}", a + b - c)]),
    Template("A shelf has {a} rows with {b} {item} in each row. {name} adds {c} more {item} to every "
             "row. How many {item} are on the shelf now?", _shelf, lambda n: n[0] * (n[1] + n[2]),
             lambda a, b, c, d: [(f"{b} + {c}", b + c), (f"{a} * {b + c}", a * (b + c))]),
    Template("{name} saves {a} dollars every week for {b} weeks and then spends {c} dollars. How many "
             "dollars does {name} have left?", _save, lambda n: n[0] * n[1] - n[2],
             lambda a, b, c, d: [(f"{a} * {b}", a * b), (f"{a * b} - {c}", a * b - c)]),
    Template("{name} reads {a} pages a day for {b} days. The book has {c} pages. How many pages are "
             "left to read?", _pages, lambda n: n[2] - n[0] * n[1],
             lambda a, b, c, d: [(f"{a} * {b}", a * b), (f"{c} - {a * b}", c - a * b)]),
    Template("There are {a} {item} in a basket. {name} takes half of them and then puts {b} back. "
             "How many {item} are in the basket now?", _half, lambda n: n[0] // 2 + n[1],
             lambda a, b, c, d: [(f"{a} / 2", a // 2), (f"{a // 2} + {b}", a // 2 + b)]),
    Template("{name} has {a} small {item} and {b} times as many large {item}. How many {item} does "
             "{name} have in total?", _times, lambda n: n[0] + n[0] * n[1],
             lambda a, b, c, d: [(f"{a} * {b}", a * b), (f"{a} + {a * b}", a + a * b)]),
    Template("What is {a} + {b} * {c}?", _sum_product, lambda n: n[0] + n[1] * n[2],
             lambda a, b, c, d: [(f"{b} * {c}", b * c), (f"{a} + {b * c}", a + b * c)]),
    Template("What is ({a} + {b}) * {c} - {d}?", _group, lambda n: (n[0] + n[1]) * n[2] - n[3],
             lambda a, b, c, d: [(f"{a} + {b}", a + b), (f"{a + b} * {c}", (a + b) * c),
                                 (f"{(a + b) * c} - {d}", (a + b) * c - d)]),
    Template("What is {a} * {b} - {c} * {d}?", _products, lambda n: n[0] * n[1] - n[2] * n[3],
             lambda a, b, c, d: [(f"{a} * {b}", a * b), (f"{c} * {d}", c * d), (f"{a * b} - {c * d}", a * b - c * d)]),
    Template("What is ({a} * {b} + {c}) / {d}?", _divide, lambda n: (n[0] * n[1] + n[2]) // n[3],
             lambda a, b, c, d: [(f"{a} * {b}", a * b), (f"{a * b} + {c}", a * b + c),
                                 (f"{a * b + c} / {d}", (a * b + c) // d)]),
)

_REASONING = (
    "{steps}. So the answer is {answer}.",
    "First {first}. Then {rest}. The answer is {answer}.",
    "Step by step: {steps}. That gives {answer}.",
    "We compute {steps}, which leaves {answer}.",
)


def sample_problem(key):
    """A generated problem: (template i32[], numbers i32[4], name i32[], item i32[], answer i32[])."""
    raw = jax.random.randint(key, (7,), 0, 2**20)
    template = raw[0] % len(TEMPLATES)
    numbers = jax.lax.switch(template, [t.sample for t in TEMPLATES], raw[3:]).astype(jnp.int32)
    answer = jax.lax.switch(template, [t.answer for t in TEMPLATES], numbers).astype(jnp.int32)
    return template.astype(jnp.int32), numbers, raw[1] % len(NAMES), raw[2] % len(ITEMS), answer


def problem_text(template: int, numbers: Sequence[int], name: int, item: int) -> str:
    """Host text of a generated problem (what the pieces renderer produces)."""
    values = dict(zip(SLOTS, (int(v) for v in numbers)))
    return TEMPLATES[int(template)].text.format(name=NAMES[int(name)], item=ITEMS[int(item)], **values)


def explain(template: int, numbers: Sequence[int], rng: np.random.Generator) -> tuple[str, str]:
    """Host (reasoning, answer) of a generated problem: its steps in one of several paraphrases."""
    steps = TEMPLATES[int(template)].steps(*(int(v) for v in numbers))
    said = [f"{e} = {v}" for e, v in steps]
    answer = steps[-1][1]
    reasoning = str(rng.choice(_REASONING)).format(
        steps=", then ".join(said), first=said[0], rest=", then ".join(said[1:]), answer=answer)
    return reasoning, str(answer)


def normalize_answer(text: str) -> str:
    """RAGEN's normalisation of answers: whitespace removed, lower-cased."""
    return re.sub(r"\s+", "", text.lower())


def _integer_or_none(text: str) -> int | None:
    """The integer a gold answer stands for ("1,000" counts as 1000), or None."""
    t = normalize_answer(text)
    if re.fullmatch(r"-?\d{1,3}(,\d{3})+", t):
        t = t.replace(",", "")
    return int(t) if re.fullmatch(r"[+-]?\d{1,9}", t) else None


@struct.dataclass
class ArithmeticState:
    """template: i32[] (-1 for a dataset problem); numbers: i32[4]; name, item: i32[];
    index: i32[] dataset row (-1 when generated); answer: i32[] gold integer, valid when answer_is_int;
    attempts: i32[] answers given so far; solved: bool[]."""

    template: jnp.ndarray
    numbers: jnp.ndarray
    name: jnp.ndarray
    item: jnp.ndarray
    index: jnp.ndarray
    answer: jnp.ndarray
    answer_is_int: jnp.ndarray
    attempts: jnp.ndarray
    solved: jnp.ndarray


@struct.dataclass
class ArithmeticParams:
    """Arithmetic has no traced parameters."""


class Arithmetic(TextEnv):
    """Generated or dataset math problems with one answer (see the module docstring).

    Static options: problems (optional mapping with lists `question`, `answer` and optionally
    `solution` texts), plus the TextEnv options.
    """

    Params = ArithmeticParams
    default_params = ArithmeticParams()

    def __init__(self, tokenizer, problems=None, max_actions_per_traj: int = 1, **kwargs):
        feedback = [CORRECT, INCORRECT]
        if problems is None:
            self.problems = None
            fragments, patterns = _template_patterns()
            numbers = [str(v) for v in range(MAX_NUMBER + 1)]
            pieces = PieceTable(tokenizer, feedback + fragments + numbers + list(NAMES) + list(ITEMS))
            width = max(len(p) for p in patterns)
            table = np.zeros((len(patterns), width), np.int32)
            for t, pattern in enumerate(patterns):  # >= 0: a fragment's piece; < 0: dynamic slot -1 - code
                table[t, : len(pattern)] = [pieces.index(p) if isinstance(p, str) else -1 - p for p in pattern]
            self._patterns = jnp.asarray(table)
            self._dynamic = tuple(jnp.asarray(pieces.indices(t)) for t in (numbers, NAMES, ITEMS))
            lens = {k: pieces.max_len(v) for k, v in zip(("n", "name", "item"), (numbers, NAMES, ITEMS))}
            dyn_len = [lens["n"]] * len(SLOTS) + [lens["name"], lens["item"]]
            question = max(sum(pieces.token_len(p) if isinstance(p, str) else dyn_len[p] for p in pattern)
                           for pattern in patterns)
        else:
            self.problems = _problem_table(problems)
            pieces = PieceTable(tokenizer, feedback + self.problems["question"])
            self._question_piece = jnp.asarray(pieces.indices(self.problems["question"]))
            question = pieces.max_len(self.problems["question"])
        self._feedback = jnp.asarray(pieces.indices(feedback))
        capacity = max(question, pieces.max_len(feedback))
        super().__init__(tokenizer, pieces=pieces, action_words=(), obs_capacity=capacity, instruction=INSTRUCTION,
                         max_actions_per_traj=max_actions_per_traj, **kwargs)

    # ------------------------------------------------------------------ TextEnv hooks
    def init_state(self, key, params):
        zero = jnp.int32(0)
        if self.problems is None:
            template, numbers, name, item, answer = sample_problem(key)
            index, is_int = jnp.int32(-1), jnp.bool_(True)
        else:
            index = instance_index(key, len(self.problems["question"]))
            template, numbers, name, item = jnp.int32(-1), jnp.zeros((len(SLOTS),), jnp.int32), zero, zero
            answer, is_int = self.problems["int_answer"][index], self.problems["is_int"][index]
        return ArithmeticState(template=template, numbers=numbers, name=name, item=item, index=index,
                               answer=answer, answer_is_int=is_int, attempts=zero, solved=jnp.bool_(False))

    def observation_pieces(self, s):
        if self.problems is None:
            numbers, names, items = self._dynamic
            dynamic = jnp.concatenate(
                [numbers[jnp.clip(s.numbers, 0, MAX_NUMBER)], names[s.name][None], items[s.item][None]])
            pattern = self._patterns[jnp.maximum(s.template, 0)]
            question = jnp.where(pattern >= 0, pattern, dynamic[jnp.clip(-1 - pattern, 0, dynamic.shape[0] - 1)])
        else:
            question = self._question_piece[jnp.maximum(s.index, 0)][None]
        feedback = jnp.zeros_like(question).at[0].set(self._feedback[jnp.where(s.solved, 0, 1)])
        return jnp.where(s.attempts > 0, feedback, question)

    def success(self, s):
        return s.solved

    def apply_answer(self, key, s, text, text_len, params):
        got, got_len = _normalize_bytes(text, text_len, text.shape[0])
        value, is_number = parse_integer(got, got_len)
        correct = s.answer_is_int & is_number & (value == s.answer)
        if self.problems is not None:
            gold = self.problems["gold_bytes"][jnp.maximum(s.index, 0)]
            gold_len = self.problems["gold_len"][jnp.maximum(s.index, 0)]
            width = min(gold.shape[0], got.shape[0])
            correct |= (got_len == gold_len) & jnp.all(got[:width] == gold[:width])
        reward = jnp.where(correct, 1.0 / 2.0 ** s.attempts.astype(jnp.float32), 0.0)
        new = s.replace(attempts=s.attempts + 1, solved=correct)
        return new, reward, correct, jnp.bool_(True), correct

    def oracle_answer(self, s, rng: np.random.Generator, max_actions: int) -> tuple[str, str]:
        if self.problems is not None:
            i = int(s.index)
            return self.problems["solution"][i], self.problems["answer"][i]
        reasoning, answer = explain(int(s.template), s.numbers, rng)
        if answer != str(int(s.answer)):
            raise ValueError(f"template {int(s.template)}: host steps give {answer}, the env {int(s.answer)}")
        return reasoning, answer


def _template_patterns():
    """Split every template into fragments (str) and dynamic slots (int: a b c d name item -> 0..5)."""
    slot_of = {**{k: i for i, k in enumerate(SLOTS)}, "name": len(SLOTS), "item": len(SLOTS) + 1}
    fragments, patterns = [], []
    for t in TEMPLATES:
        pattern = []
        for literal, field, _, _ in string.Formatter().parse(t.text):
            if literal:
                pattern.append(literal)
                fragments.append(literal)
            if field is not None:
                pattern.append(slot_of[field])
        patterns.append(pattern)
    return fragments, patterns


def _normalize_bytes(text, length, capacity):
    """In-graph `normalize_answer` on bytes: (u8[capacity], length i32[]) of the non-whitespace
    bytes of text[:length], ASCII lower-cased."""
    pos = jnp.arange(text.shape[0])
    ws = jnp.zeros(text.shape, bool)
    for w in _WHITESPACE:
        ws |= text == w
    keep = (pos < length) & ~ws
    target = jnp.where(keep, jnp.cumsum(keep) - 1, capacity)
    lower = jnp.where((text >= ord("A")) & (text <= ord("Z")), text + 32, text).astype(jnp.uint8)
    return jnp.zeros((capacity,), jnp.uint8).at[target].set(lower, mode="drop"), keep.sum().astype(jnp.int32)


def _problem_table(problems) -> dict:
    """Host lists plus device arrays of a question/answer dataset (gold answers normalized)."""
    questions, answers = list(problems.get("question", [])), list(problems.get("answer", []))
    if not questions or len(questions) != len(answers):
        raise ValueError(f"problems need equally long non-empty 'question' and 'answer' lists, got "
                         f"{len(questions)} questions and {len(answers)} answers")
    solutions = list(problems.get("solution") or [f"The answer is {a}." for a in answers])
    gold = [normalize_answer(a).encode("utf-8") for a in answers]
    width = max(1, max(len(g) for g in gold))
    gold_bytes = np.zeros((len(gold), width), np.uint8)
    for i, g in enumerate(gold):
        gold_bytes[i, : len(g)] = np.frombuffer(g, np.uint8)
    ints = [_integer_or_none(a) for a in answers]
    return {
        "question": questions, "answer": answers, "solution": solutions,
        "gold_bytes": jnp.asarray(gold_bytes), "gold_len": jnp.asarray([len(g) for g in gold], jnp.int32),
        "int_answer": jnp.asarray([v or 0 for v in ints], jnp.int32),
        "is_int": jnp.asarray([v is not None for v in ints]),
    }


registry.register("arithmetic", Arithmetic)

"""Countdown (docs/environments.md#countdown): reach the target with an arithmetic expression using each given number
once.

Instances are generated IN JAX from the reset key (`sample_instance`): draw the count of numbers
(default 3 or 4, like RAGEN's `Countdown-Tasks-3to4` data), the numbers, then reduce them to one value
by a random expression tree (repeatedly combine two random remaining values with a random allowed
operator), which becomes the target. Intermediate values stay non-negative integers (`a - b` is taken
as larger minus smaller, `/` only when exact) and below 2^15; a tree is rejected when the target falls
outside [1, max_target], and of `tries` independent draws the first accepted one is used, falling back
to "target = sum of the numbers". So every instance is solvable by construction with the allowed
operators. With the default `operators="+-"` the targets are signed sums, i.e. the instance
distribution is that of RAGEN's data, which it filters to instances solvable with + and - only.

Alternatively `instances=` takes a dataset (e.g. from `environments.datasets.generated` or RAGEN's
parquet converted to arrays): instance `instance_index(key, size)` = seed mod size is drawn.

Observation `Target: {target}, nums: [a, b, c]` (RAGEN's text); after the answer RAGEN's feedback
`Your answer get {reward} points.`. The answer (first `||`-part of `<answer>`) is evaluated in-graph
by `environments.expression` with exact rational arithmetic. Reward (RAGEN `compute_reward`): 0 when
the multiset of integer literals differs from the numbers, `format_score` (0.1) when it matches but
the value is wrong or the expression invalid, `score` (1.0) when it equals the target;
success = reward is `score`; every non-empty answer is a valid action that ends the episode.
Answers longer than `answer_capacity` bytes score 0.
"""
from __future__ import annotations

import itertools
from fractions import Fraction
from typing import Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from environments import registry
from environments.base import TextEnv
from environments.datasets import instance_index
from environments.expression import equals_integer, evaluate
from environments.faithfulness import Fact
from environments.pieces import PieceTable

OPERATORS = ("+-", "+-*/")
MAX_INTERMEDIATE = 2**15 - 1  # keeps every product of two intermediates inside int32
_DIV = 3  # operator order + - * /
INSTRUCTION = (
    "You are playing Countdown. The state gives a target number and a list of numbers. Write one "
    "arithmetic expression that uses every number of the list exactly once, combined with +, -, * and / "
    "and parentheses, whose value is the target. For example, for Target: 24, nums: [2, 3, 4] answer "
    "<answer>2 * 3 * 4</answer>."
)


@struct.dataclass
class CountdownState:
    """nums: i32[n] (entries past `count` are 0); count: i32[]; target: i32[];
    outcome: i32[] -1 before the answer, else 0 (reward 0), 1 (format_score), 2 (score)."""

    nums: jnp.ndarray
    count: jnp.ndarray
    target: jnp.ndarray
    outcome: jnp.ndarray


@struct.dataclass
class CountdownParams:
    """Countdown has no traced parameters (reward values and number ranges are static options)."""


def _uniform_int(u, low, high):
    """Integers in [low, high] from uniforms u in [0, 1)."""
    return jnp.minimum(low + (u * (high - low + 1)).astype(jnp.int32), high)


def _reduce_tree(u, nums, count, op_codes, max_target):
    """Combine nums[:count] pairwise with random ops into one value: (value i32[], ok bool[]).

    u: f32[n - 1, n + 1] uniforms; per step, n scores pick the two values and the last the operator.
    op_codes: the usable operators as indices into "+-*/". When the sampled operator is not usable at
    a step (inexact division, too large, or a final value outside [1, max_target]) the first usable
    one in the order + - * / is taken; ok is False when none is.
    """
    n = nums.shape[0]
    allowed = jnp.zeros((4,), bool).at[op_codes].set(True)
    alive = jnp.arange(n) < count
    values, ok = nums, jnp.bool_(True)
    for t in range(n - 1):
        left = alive.sum()
        _, (i, j) = jax.lax.top_k(jnp.where(alive, u[t, :n], -1.0), 2)
        hi, lo = jnp.maximum(values[i], values[j]), jnp.minimum(values[i], values[j])
        results = jnp.stack([hi + lo, hi - lo, hi * lo, hi // jnp.maximum(lo, 1)])
        usable = allowed & (results <= MAX_INTERMEDIATE)
        usable = usable.at[_DIV].set(usable[_DIV] & (lo > 0) & (hi % jnp.maximum(lo, 1) == 0))
        usable &= (left > 2) | ((results >= 1) & (results <= max_target))
        sampled = op_codes[_uniform_int(u[t, n], 0, op_codes.shape[0] - 1)]
        op = jnp.where(usable[sampled], sampled, jnp.argmax(usable))
        active = left >= 2
        ok &= ~active | usable.any()
        values = jnp.where(active, values.at[i].set(results[op]), values)
        alive = jnp.where(active, alive.at[j].set(False), alive)
    return values[jnp.argmax(alive)], ok


def sample_instance(
    key,
    counts: Sequence[int] = (3, 4),
    min_number: int = 1,
    max_number: int = 99,
    max_target: int = 999,
    operators: str = "+-",
    tries: int = 16,
):
    """A solvable instance from `key` (see the module docstring).

    Returns (nums i32[max(counts)] with zeros past `count`, count i32[], target i32[]).
    """
    n = max(counts)
    op_codes = jnp.asarray(["+-*/".index(c) for c in operators], jnp.int32)
    # a single draw of uniforms (cheaper to compile than many samplers): per try, n numbers and the
    # tree's (n - 1) x (n + 1); the last column of try 0 picks the count
    u = jax.random.uniform(key, (tries, n + (n - 1) * (n + 1) + 1))
    count = jnp.asarray(counts, jnp.int32)[_uniform_int(u[0, -1], 0, len(counts) - 1)]
    nums = jnp.where(jnp.arange(n) < count, _uniform_int(u[:, :n], min_number, max_number), 0)
    tree_u = u[:, n:-1].reshape(tries, n - 1, n + 1)
    targets, ok = jax.vmap(_reduce_tree, (0, 0, None, None, None))(tree_u, nums, count, op_codes, max_target)
    chosen = jnp.argmax(ok)  # the first accepted try (0 when none is)
    target = jnp.where(ok.any(), targets[chosen], nums[0].sum())
    return nums[chosen], count, target.astype(jnp.int32)


def solve(
    nums: Sequence[int], target: int, operators: str = "+-*/", natural: bool = False
) -> tuple[str, list[str]] | None:
    """Host brute force: (expression, steps) using every number once with `operators`, or None.

    Steps are "a op b = c" strings in evaluation order. `natural` keeps every intermediate a
    non-negative integer (as the generator does), which reads better in a reasoning text.
    """
    start = tuple((Fraction(v), str(v), []) for v in nums)

    def search(items):
        if len(items) == 1:
            return items[0] if items[0][0] == target else None
        for i, j in itertools.permutations(range(len(items)), 2):
            (a, ea, sa), (b, eb, sb) = items[i], items[j]
            rest = [items[k] for k in range(len(items)) if k not in (i, j)]
            for op in operators:
                if op in "+*" and i > j:  # commutative: one order suffices
                    continue
                if (op == "/" and b == 0) or (natural and op in "-/" and (a < b or (op == "/" and a % b))):
                    continue
                value = a + b if op == "+" else a - b if op == "-" else a * b if op == "*" else a / b
                wrap = lambda e, s: f"({e})" if s else e  # noqa: E731 (compound operands get parentheses)
                expr = f"{wrap(ea, sa)} {op} {wrap(eb, sb)}"
                step = f"{_fmt(a)} {op} {_fmt(b)} = {_fmt(value)}"
                found = search(rest + [(value, expr, sa + sb + [step])])
                if found is not None:
                    return found
        return None

    found = search(list(start))
    return None if found is None else (found[1], found[2])


def _fmt(x: Fraction) -> str:
    return str(x.numerator) if x.denominator == 1 else f"{x.numerator}/{x.denominator}"


_REASONING = (
    "We need {target} from {nums}. {steps}. That reaches {target} using every number once.",
    "Target {target}, numbers {nums}. Try {steps}. This equals the target {target}.",
    "Combine {nums} step by step: {steps}. So the expression gives {target}.",
    "To get {target} I use each of {nums} once: {steps}.",
)


class Countdown(TextEnv):
    """Countdown, one answer per episode (see the module docstring).

    Static options: counts (number counts drawn uniformly), min_number, max_number, max_target,
    operators ("+-" or "+-*/"), tries, format_score, score, answer_capacity (bytes evaluated),
    instances (optional dataset: mapping with i32 arrays `nums` [N, n], `target` [N] and optionally
    `count` [N], entries of `nums` past `count` ignored), plus the TextEnv options.
    """

    Params = CountdownParams
    default_params = CountdownParams()

    def __init__(
        self,
        tokenizer,
        counts: int | Sequence[int] = (3, 4),
        min_number: int = 1,
        max_number: int = 99,
        max_target: int = 999,
        operators: str = "+-",
        tries: int = 16,
        format_score: float = 0.1,
        score: float = 1.0,
        answer_capacity: int = 256,
        instances: Mapping[str, np.ndarray] | None = None,
        max_actions_per_traj: int = 1,
        **kwargs,
    ):
        counts = (counts,) if isinstance(counts, int) else tuple(int(c) for c in counts)
        if operators not in OPERATORS:
            raise ValueError(f"operators must be one of {OPERATORS}, got {operators!r}")
        if not counts or min(counts) < 2:
            raise ValueError(f"counts must be >= 2, got {counts}")
        if not 0 <= min_number <= max_number or max_number * max(counts) > MAX_INTERMEDIATE:
            raise ValueError(f"need 0 <= min_number <= max_number and max_number * count <= {MAX_INTERMEDIATE}")
        if not 1 <= max_target <= MAX_INTERMEDIATE:
            raise ValueError(f"max_target must be in [1, {MAX_INTERMEDIATE}], got {max_target}")
        self.sample_options = dict(counts=counts, min_number=min_number, max_number=max_number,
                                   max_target=max_target, operators=operators, tries=tries)
        self.operators = operators
        self.answer_capacity = int(answer_capacity)
        self.rewards = (0.0, float(format_score), float(score))
        self.instances = None if instances is None else _instance_table(instances)
        if self.instances is None:
            n, top = max(counts), max(max_target, max_number * max(counts))
        else:
            n = self.instances["nums"].shape[1]
            top = int(max(self.instances["nums"].max(), self.instances["target"].max()))
        self.num_slots = n
        numbers = [str(v) for v in range(top + 1)]
        # RAGEN prints the reward with Python's str: int 0, 0.1, 1.0
        self._reward_texts = [str(r if r else 0) for r in self.rewards]
        fixed = ["Target: ", ", nums: [", ", ", "]", "Your answer get ", " points."]
        pieces = PieceTable(tokenizer, fixed + numbers + self._reward_texts)
        self._number_piece = jnp.asarray(pieces.indices(numbers))
        self._fixed = {t: pieces.index(t) for t in fixed}
        self._reward_piece = jnp.asarray(pieces.indices(self._reward_texts))
        num_len = pieces.max_len(numbers)
        question = sum(pieces.token_len(t) for t in ("Target: ", ", nums: [", "]")) + num_len * (n + 1)
        question += (n - 1) * pieces.token_len(", ")
        feedback = sum(pieces.token_len(t) for t in ("Your answer get ", " points."))
        feedback += pieces.max_len(self._reward_texts)
        # one byte past the capacity, so an over-long answer shows as longer than `cap` and scores 0
        kwargs.setdefault("max_answer_bytes", self.answer_capacity + 1)
        super().__init__(tokenizer, pieces=pieces, action_words=(), obs_capacity=max(question, feedback),
                         instruction=INSTRUCTION, max_actions_per_traj=max_actions_per_traj, **kwargs)

    # ------------------------------------------------------------------ TextEnv hooks
    def init_state(self, key, params):
        if self.instances is None:
            nums, count, target = sample_instance(key, **self.sample_options)
        else:
            i = instance_index(key, self.instances["target"].shape[0])
            nums, count, target = (self.instances[k][i] for k in ("nums", "count", "target"))
        return CountdownState(nums=nums, count=count, target=target, outcome=jnp.int32(-1))

    def observation_pieces(self, s):
        n = self.num_slots
        present = jnp.arange(n) < s.count
        nums = jnp.where(present, self._number_piece[jnp.clip(s.nums, 0, self._number_piece.shape[0] - 1)], 0)
        seps = jnp.where(present & (jnp.arange(n) > 0), self._fixed[", "], 0)
        interleaved = jnp.stack([seps, nums], axis=1).reshape(-1)
        question = jnp.concatenate([
            jnp.asarray([self._fixed["Target: "]]),
            self._number_piece[jnp.clip(s.target, 0, self._number_piece.shape[0] - 1)][None],
            jnp.asarray([self._fixed[", nums: ["]]),
            interleaved,
            jnp.asarray([self._fixed["]"]]),
        ])
        feedback = jnp.zeros_like(question).at[:3].set(
            jnp.stack([self._fixed["Your answer get "], self._reward_piece[jnp.maximum(s.outcome, 0)],
                       self._fixed[" points."]])
        )
        return jnp.where(s.outcome >= 0, feedback, question)

    def success(self, s):
        return s.outcome == 2

    def apply_answer(self, key, s, text, text_len, params):
        cap = self.answer_capacity
        text = jnp.pad(text, (0, max(0, cap - text.shape[0])))[:cap]
        ev = evaluate(text, jnp.minimum(text_len, cap), max_literals=self.num_slots)
        slots = jnp.arange(self.num_slots)
        used = jnp.sort(jnp.where(slots < s.count, ev.literals, -2))
        given = jnp.sort(jnp.where(slots < s.count, s.nums, -2))
        uses_numbers = (text_len <= cap) & (ev.num_literals == s.count) & jnp.all(used == given)
        correct = uses_numbers & equals_integer(ev, s.target)
        outcome = jnp.where(correct, 2, jnp.where(uses_numbers, 1, 0)).astype(jnp.int32)
        reward = jnp.asarray(self.rewards, jnp.float32)[outcome]
        return s.replace(outcome=outcome), reward, jnp.bool_(True), jnp.bool_(True), reward > 0

    def oracle_answer(self, s, rng: np.random.Generator, max_actions: int) -> tuple[str, str]:
        nums = [int(v) for v in s.nums[: int(s.count)]]
        target = int(s.target)
        found = solve(nums, target, "+-", True) or solve(nums, target, "+-*/", True) or solve(nums, target)
        if found is None:
            raise ValueError(f"Countdown instance target={target} nums={nums} has no solution")
        expr, steps = found
        reasoning = str(rng.choice(_REASONING)).format(target=target, nums=nums, steps=", then ".join(steps))
        return reasoning, expr

    def describe(self, s, rng: np.random.Generator) -> str:
        nums, target = [int(v) for v in s.nums[: int(s.count)]], int(s.target)
        templates = (f"I need {target} from {nums}.", f"Target {target}; numbers {nums}, each used once.")
        return templates[int(rng.integers(len(templates)))]

    def facts(self, s):
        nums, target = [int(v) for v in s.nums[: int(s.count)]], int(s.target)
        return (Fact("target", r"(?:need|Target) (-?\d+)", (str(target),)),
                Fact("numbers", r"(\[[-\d, ]*\])", (str(nums),)))

    def random_answer(self, s, rng: np.random.Generator) -> str:
        """Every number once, in random order, joined by random allowed operators."""
        nums = [int(v) for v in rng.permutation(s.nums[: int(s.count)])]
        ops = rng.choice(list(self.operators), size=len(nums) - 1)
        return "".join(f"{n} {op} " for n, op in zip(nums, ops)) + str(nums[-1])


def _instance_table(instances: Mapping[str, np.ndarray]) -> dict[str, jnp.ndarray]:
    """Validate a dataset of instances and move it to the device as i32 arrays."""
    for k in ("nums", "target"):
        if k not in instances:
            raise ValueError(f"Countdown instances need {k!r}; got keys {sorted(instances)}")
    nums = np.asarray(instances["nums"], np.int64)
    target = np.asarray(instances["target"], np.int64)
    if nums.ndim != 2 or target.shape != (nums.shape[0],) or nums.shape[0] == 0:
        raise ValueError(f"Countdown instances: nums must be [N, n] and target [N], got {nums.shape} {target.shape}")
    count = np.asarray(instances.get("count", np.full(nums.shape[0], nums.shape[1])), np.int64)
    if count.shape != target.shape or (count < 1).any() or (count > nums.shape[1]).any():
        raise ValueError(f"Countdown instances: count must be in [1, {nums.shape[1]}] per instance")
    nums = np.where(np.arange(nums.shape[1]) < count[:, None], nums, 0)
    if nums.min() < 0 or target.min() < 0 or max(nums.max(), target.max()) > MAX_INTERMEDIATE:
        raise ValueError(f"Countdown instances: numbers and targets must be in [0, {MAX_INTERMEDIATE}]")
    return {"nums": jnp.asarray(nums, jnp.int32), "count": jnp.asarray(count, jnp.int32),
            "target": jnp.asarray(target, jnp.int32)}


registry.register("countdown", Countdown)

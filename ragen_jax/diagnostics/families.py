"""The two collapse sampling families (docs/diagnostics.md#sampling-families), run in-graph on the unfiltered rollout
batch.

Input: `ReasoningSpans`, per trajectory and turn the span of the reasoning inside the trajectory token buffer.
The prompt of turn t is the buffer before its reasoning (x_t = everything the model saw, `<think>` included),
the reasoning z_t is the span strictly between `<think>` and `</think>` (docs/diagnostics.md#what-is-measured). A
(trajectory, turn) pair is valid when the turn produced a response and its reasoning is non-empty.

- First-turn family (`collapse_first_turn_sample/`): one turn-1 pair per trajectory; `num_samples` of the
  valid ones without replacement (all if fewer); columns = groups, each represented by the prompt of its first
  sampled row. As in RAGEN (which raises and drops the family), the family reports no metrics (NaN) when two
  sampled members of one group have different turn-1 prompts; their count is `collapse/first_turn_prompt_mismatch`.
- Trajectory-uniform family (`collapse_trajectory_sample/`): `min(num_samples, sum_m T_m)` draws with
  replacement, trajectory m ~ U(B) then turn ~ U(its T_m valid turns); a draw of a trajectory without valid
  turns is wasted. Each draw is its own column.

Column signatures compare prompt tokens exactly (equal length and tokens), like RAGEN's tuple(prompt ids): the
same (m, t) drawn twice, or same-group turn-1 prompts, or two groups with identical prompts share a signature.
Differences from RAGEN: prompts are the sampled trajectory buffer (RAGEN re-renders them from text without the
training truncation, docs/differences.md#diagnostics), and timing metrics are left to
`experiments/benchmarks/diagnostics.py`.
"""
from __future__ import annotations

import dataclasses
from typing import Callable

import flax.struct
import jax
import jax.numpy as jnp

from environments.pytrees import filled, traced_once
from ragen_jax.diagnostics import collapse, schedule

FIRST_TURN = "collapse_first_turn_sample"
TRAJECTORY = "collapse_trajectory_sample"

# (prompts int32[C, P], prompt_len int32[C], reasoning int32[R, Z], reasoning_len int32[R]) -> (logp_mean, logp_sum)
# f32[R, C]; columns passed with prompt_len 0 are not needed (their scores are ignored) and may be skipped.
ScoreFn = Callable[[jax.Array, jax.Array, jax.Array, jax.Array], tuple[jax.Array, jax.Array]]


@flax.struct.dataclass
class ReasoningSpans:
    """What the rollout hands to the diagnostics (B trajectories, T = max_turn, L = buffer length).

    tokens: int32[B, L] trajectory token buffer; buffer index s is position s (rows right-padded).
    think_start: int32[B, T] buffer index of turn t's first reasoning token, i.e. the length of its prompt x_t.
    think_len: int32[B, T] reasoning tokens of turn t; 0 = empty or unparsable reasoning.
    turn_taken: bool[B, T] turn t produced a response (the denominator of `valid_thinking_rate`).
    group_ids: int32[B] prompt group in [0, num_groups).
    """

    tokens: jax.Array
    think_start: jax.Array
    think_len: jax.Array
    turn_taken: jax.Array
    group_ids: jax.Array

    @property
    def valid_turn(self) -> jax.Array:
        return self.turn_taken & (self.think_len > 0)


@flax.struct.dataclass
class ScoringPairs:
    """Rows (reasoning) and columns (prompts) of one family, as spans of the trajectory buffer.

    Column j's prompt is tokens[prompt_traj[j], :prompt_len[j]]; row i's reasoning is
    tokens[reason_traj[i], reason_start[i] : reason_start[i] + reason_len[i]] and its own prompt is
    tokens[reason_traj[i], :reason_start[i]].
    """

    prompt_traj: jax.Array  # int32[C]
    prompt_len: jax.Array  # int32[C]
    col_valid: jax.Array  # bool[C]
    reason_traj: jax.Array  # int32[R]
    reason_start: jax.Array  # int32[R]
    reason_len: jax.Array  # int32[R]
    row_valid: jax.Array  # bool[R]
    true_col: jax.Array  # int32[R]


@dataclasses.dataclass(frozen=True)
class CollapseOptions:
    """Static structure of the collapse diagnostics (config `diagnostics.*`).

    every: cadence (`should_compute`); 0 = off. max_prompt_len / max_reasoning_len: padded widths of the
    gathered prompts and reasoning (None = the buffer length / the longest possible span); longer spans are cut.
    width_tiers: `num_tiers` of `cross_logprobs.cross_log_probs` (its compiled scoring bodies grow as its square).
    """

    num_groups: int
    num_samples: int = 64
    first_turn: bool = True
    multi_turn: bool = True
    every: int = 1
    max_prompt_len: int | None = None
    max_reasoning_len: int | None = None
    width_tiers: int = 4

    @classmethod
    def from_config(cls, config, num_groups: int | None = None) -> "CollapseOptions":
        """The options of a rollout batch of `num_groups` groups (default `rollout.num_groups`, the training
        batch's) in a buffer of `rollout.max_model_len` tokens."""
        d, r = config.diagnostics, config.rollout
        return cls(num_groups=num_groups or r.num_groups, num_samples=d.num_samples, first_turn=d.first_turn_enabled,
                   multi_turn=d.multi_turn_enabled, every=d.collapse_every, max_prompt_len=r.max_model_len - 1,
                   max_reasoning_len=r.response_length, width_tiers=d.score_width_tiers)


def should_compute(step, every: int) -> jax.Array:
    """RAGEN's schedule (docs/diagnostics.md#schedule): never at step 0, always at step 1, then when step % every == 0;
    every=0: off."""
    return schedule.runs_at(step, every, phase=0)


def init_state() -> dict:
    """One marginal-std EMA per family (RAGEN keys its EMA by family prefix)."""
    return {FIRST_TURN: collapse.init_ema(), TRAJECTORY: collapse.init_ema()}


# ------------------------------------------------------------------------------------------------ sampling
def first_turn_pairs(spans: ReasoningSpans, key: jax.Array, num_samples: int, num_groups: int) -> ScoringPairs:
    """One turn-1 pair per trajectory, `num_samples` valid ones without replacement; columns = groups."""
    batch = spans.tokens.shape[0]
    num_rows = min(num_samples, batch)
    valid = spans.valid_turn[:, 0]
    priority = jnp.where(valid, jax.random.uniform(key, (batch,)), 2.0)  # valid first, in random order
    traj = jnp.argsort(priority)[:num_rows].astype(jnp.int32)
    row_valid = jnp.arange(num_rows) < jnp.sum(valid)
    group = spans.group_ids[traj].astype(jnp.int32)

    slots = jnp.arange(num_rows)
    in_group = row_valid[None, :] & (group[None, :] == jnp.arange(num_groups)[:, None])  # [G, R]
    rep = jnp.min(jnp.where(in_group, slots[None, :], num_rows), axis=1)  # first sampled row of each group
    col_valid = rep < num_rows
    rep = jnp.minimum(rep, num_rows - 1)
    start = spans.think_start[traj, 0]
    return ScoringPairs(prompt_traj=traj[rep], prompt_len=start[rep], col_valid=col_valid, reason_traj=traj,
                        reason_start=start, reason_len=spans.think_len[traj, 0], row_valid=row_valid, true_col=group)


def trajectory_uniform_pairs(spans: ReasoningSpans, key: jax.Array, num_samples: int) -> ScoringPairs:
    """`min(num_samples, sum T_m)` draws: trajectory uniform, then a uniform valid turn; one column per draw."""
    batch = spans.tokens.shape[0]
    valid_turn = spans.valid_turn
    turns_per_traj = jnp.sum(valid_turn, axis=1)
    num_draws = jnp.minimum(num_samples, jnp.sum(turns_per_traj))
    key_traj, key_turn = jax.random.split(key)
    traj = jax.random.randint(key_traj, (num_samples,), 0, batch, dtype=jnp.int32)
    count = turns_per_traj[traj]
    k = jnp.floor(jax.random.uniform(key_turn, (num_samples,)) * count).astype(jnp.int32)
    k = jnp.minimum(k, jnp.maximum(count - 1, 0))
    own = valid_turn[traj]  # [S, T]
    turn = jnp.argmax(own & (jnp.cumsum(own, axis=1) == k[:, None] + 1), axis=1)  # the k-th valid turn
    row_valid = (jnp.arange(num_samples) < num_draws) & (count > 0)
    start = spans.think_start[traj, turn]
    return ScoringPairs(prompt_traj=traj, prompt_len=start, col_valid=row_valid, reason_traj=traj,
                        reason_start=start, reason_len=spans.think_len[traj, turn], row_valid=row_valid,
                        true_col=jnp.arange(num_samples, dtype=jnp.int32))


# ------------------------------------------------------------------------------------------------ gathering
def gather_prompts(tokens: jax.Array, traj: jax.Array, length: jax.Array, width: int):
    """The last min(length, width) prompt tokens tokens[traj[n], :length[n]], left-aligned.

    Returns (int32[N, width] padded with -1 (never a token id), int32[N] kept lengths). A prompt longer than
    `width` loses its oldest tokens (RAGEN drops the oldest turns of an over-long context too).
    """
    kept = jnp.minimum(length, width)
    index = (length - kept)[:, None] + jnp.arange(width)[None, :]
    picked = jnp.take_along_axis(tokens[traj], jnp.clip(index, 0, tokens.shape[1] - 1), axis=1)
    return jnp.where(jnp.arange(width)[None, :] < kept[:, None], picked, -1), kept


def gather_reasoning(tokens: jax.Array, traj: jax.Array, start: jax.Array, width: int) -> jax.Array:
    """int32[N, width]: tokens[traj[n], start[n] : start[n] + width] (indices past the buffer clamp)."""
    index = jnp.clip(start[:, None] + jnp.arange(width)[None, :], 0, tokens.shape[1] - 1)
    return jnp.take_along_axis(tokens[traj], index, axis=1)


def prompt_signatures(prompts: jax.Array, valid: jax.Array) -> jax.Array:
    """int32[C]: the first valid column whose prompt (from `gather_prompts`) is token-identical to column j's."""
    same = jnp.all(prompts[:, None, :] == prompts[None, :, :], axis=-1) & valid[None, :]
    return jnp.argmax(same, axis=1).astype(jnp.int32)


# ------------------------------------------------------------------------------------------------ one step
def _family_metrics(score_fn, spans, pairs, ema, prompt_width, reason_width, std_eps, ema_decay, col_valid=None):
    col_valid = pairs.col_valid if col_valid is None else col_valid
    prompts, prompt_len = gather_prompts(spans.tokens, pairs.prompt_traj, pairs.prompt_len, prompt_width)
    signature = prompt_signatures(prompts, col_valid)
    reasoning = gather_reasoning(spans.tokens, pairs.reason_traj, pairs.reason_start, reason_width)
    reason_len = jnp.where(pairs.row_valid, jnp.minimum(pairs.reason_len, reason_width), 0)
    # score each distinct valid prompt once (length 0 = skipped), then copy it to its duplicate columns
    first_of_kind = col_valid & (signature == jnp.arange(signature.shape[0]))
    logp_mean, logp_sum = score_fn(jnp.maximum(prompts, 0), jnp.where(first_of_kind, prompt_len, 0), reasoning,
                                   reason_len)
    return collapse.collapse_metrics(logp_mean[:, signature], logp_sum[:, signature], pairs.true_col, signature,
                                     pairs.row_valid, ema, col_valid=col_valid, std_eps=std_eps, ema_decay=ema_decay)


def collapse_diagnostics(score_fn: ScoreFn, spans: ReasoningSpans, key: jax.Array, state: dict,
                         options: CollapseOptions, std_eps=collapse.STD_EPS, ema_decay=collapse.EMA_DECAY):
    """Both families on the unfiltered batch: (metrics, new_state). Jittable; `state` from `init_state()`.

    score_fn: e.g. `functools.partial(cross_logprobs.cross_log_probs, model, params, temperature=t)` (model: a
      `models.lm.CausalLM`).
    """
    tokens = spans.tokens
    prompt_width = options.max_prompt_len or tokens.shape[1]
    reason_width = options.max_reasoning_len or tokens.shape[1]
    reason_width = min(reason_width, tokens.shape[1])
    valid_turn = spans.valid_turn
    metrics = {"collapse/valid_thinking_rate": jnp.sum(valid_turn) / jnp.maximum(jnp.sum(spans.turn_taken), 1)}
    first_valid = jnp.sum(valid_turn[:, 0]).astype(jnp.float32)
    metrics["collapse/first_turn_num_total"] = jnp.float32(tokens.shape[0])
    metrics["collapse/first_turn_num_valid"] = first_valid
    metrics["collapse/first_turn_valid_rate"] = first_valid / tokens.shape[0]
    metrics = {k: jnp.asarray(v, jnp.float32) for k, v in metrics.items()}
    key_first, key_traj = jax.random.split(key)
    state = dict(state)

    if options.first_turn:
        pairs = first_turn_pairs(spans, key_first, options.num_samples, options.num_groups)
        own, _ = gather_prompts(tokens, pairs.reason_traj, pairs.reason_start, prompt_width)
        rep = gather_prompts(tokens, pairs.prompt_traj, pairs.prompt_len, prompt_width)[0][pairs.true_col]
        mismatch = jnp.sum(pairs.row_valid & jnp.any(own != rep, axis=1))
        col_valid = pairs.col_valid & (mismatch == 0)
        family, state[FIRST_TURN] = _family_metrics(score_fn, spans, pairs, state[FIRST_TURN], prompt_width,
                                                    reason_width, std_eps, ema_decay, col_valid)
        metrics["collapse/first_turn_prompt_mismatch"] = mismatch.astype(jnp.float32)
        metrics.update(collapse.prefixed(family, FIRST_TURN))
    if options.multi_turn:
        pairs = trajectory_uniform_pairs(spans, key_traj, options.num_samples)
        family, state[TRAJECTORY] = _family_metrics(score_fn, spans, pairs, state[TRAJECTORY], prompt_width,
                                                    reason_width, std_eps, ema_decay)
        metrics.update(collapse.prefixed(family, TRAJECTORY))
    return metrics, state


def collapse_diagnostics_every(step, score_fn: ScoreFn, spans: ReasoningSpans, key: jax.Array, state: dict,
                               options: CollapseOptions, std_eps=collapse.STD_EPS, ema_decay=collapse.EMA_DECAY):
    """`collapse_diagnostics` behind `lax.cond(should_compute(step, options.every))`: skipped steps cost nothing
    and return NaN metrics (same keys) with the state unchanged. `every == 0` returns ({}, state) statically."""
    if options.every <= 0 or not (options.first_turn or options.multi_turn):
        return {}, state

    def compute(_):
        return collapse_diagnostics(score_fn, spans, key, state, options, std_eps, ema_decay)

    compute, shapes = traced_once(compute, None)

    def skip(_):
        return filled(shapes[0], jnp.nan), state

    return jax.lax.cond(should_compute(step, options.every), compute, skip, None)

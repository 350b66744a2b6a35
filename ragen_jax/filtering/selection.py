"""Per-group selection scores and the group selection rule of SNR-aware filtering (docs/filtering.md#group-selection).

`select_groups` reproduces RAGEN's `_select_top_groups` with fixed shapes: it returns a bool[N] group
mask instead of an index list, an empty result is an all-False mask, and ties are broken by the lower
group index (stable sorts; torch leaves tie order unspecified). `value` and `include_zero` may be traced
arrays, so a new filter value never recompiles and `jax.vmap` over values runs a sweep; the strategy, the
filter type and the top-p mode are static.

Deliberate difference: `top_k` computes `k = floor(value * N)` in float32 where RAGEN uses a Python
float64 product; the two differ only when value * N lies within float32 rounding of an integer
(e.g. 0.29 * 100 gives 29 here and 28 in Python).

Filter metrics and strategies are registries (`FILTER_METRICS`, `FILTER_STRATEGIES`, declared in `ragen_jax.config`
so that validation reads their names). A new filter metric is ONE function in this file, from per-trajectory
values f32[N, G] to group scores f32[N], under `@register_filter_metric(name, quantity=..., min_group_size=...)`;
a new strategy is one function under `@register_filter_strategy(name)`. Nothing else changes: config validation,
`group_scores` / `select_groups`, the step (which feeds the `quantity`) and the filter metrics (named by it) read
the registries (docs/filtering.md#adding-a-filter-metric-or-strategy).
"""
from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp

from ragen_jax.config import FILTER_METRICS, FILTER_STRATEGIES, FILTER_TYPES, TOP_P_MODES, check_choice

ZERO_SCORE = 1e-10  # |score| <= this counts as zero (include_zero=False, filter_zero_count)
MIN_P_SLACK = 1e-10  # RAGEN's tolerance in the min_p comparisons


def group_stats(values: jax.Array) -> dict[str, jax.Array]:
    """Per-group statistics of per-trajectory quantities f32[N, G]: unbiased std (ddof=1), max, mean, sum.

    RAGEN calls the unbiased standard deviation "reward variance" (docs/filtering.md#group-scores). A group of one
    has std 0 here (torch gives NaN; the config rejects variance metrics with group_size 1).
    """
    values = jnp.asarray(values, jnp.float32)
    size = values.shape[1]
    mean = values.mean(1)
    var = jnp.square(values - mean[:, None]).sum(1) / max(size - 1, 1)
    return {"std": jnp.sqrt(var), "max": values.max(1), "mean": mean, "sum": values.sum(1)}


# The per-trajectory values a filter metric can score; train/step.py `_filter_values` computes them: the episode
# score (rewards with format penalties, normalised), the mean token entropy over the loss mask, the loss-token count.
FILTER_QUANTITIES = ("reward", "entropy", "length")


def register_filter_metric(name: str, quantity: str, min_group_size: int = 1) -> Callable[[Callable], Callable]:
    """Decorator registering `fn(values f32[N, G]) -> f32[N]` as the filter metric `name` (`filter.metric`).

    quantity: which per-trajectory value `values` holds, one of FILTER_QUANTITIES; it also names the metric's
      family in the filter metrics (`rollout/in_group_{quantity}_*`).
    min_group_size: the smallest rollout.group_size the score means something for (2 for a spread).
    """
    if quantity not in FILTER_QUANTITIES:
        raise ValueError(f"filter metric {name!r}: quantity {quantity!r} is not one of {FILTER_QUANTITIES}")
    return FILTER_METRICS.register(name, quantity=quantity, min_group_size=min_group_size)


def _group_std(values):
    return group_stats(values)["std"]


def _group_mean(values):
    return group_stats(values)["mean"]


def _group_sum(values):
    return group_stats(values)["sum"]


# RAGEN's metrics, in the order the errors list them (a new one: `@register_filter_metric(...)` on its function).
register_filter_metric("reward_variance", quantity="reward", min_group_size=2)(_group_std)
register_filter_metric("reward", quantity="reward")(_group_mean)
register_filter_metric("reward_sum", quantity="reward")(_group_sum)
register_filter_metric("entropy", quantity="entropy")(_group_mean)
register_filter_metric("entropy_variance", quantity="entropy", min_group_size=2)(_group_std)
register_filter_metric("length", quantity="length")(_group_mean)


def group_scores(values: jax.Array, metric: str) -> jax.Array:
    """Selection score per group, f32[N], from per-trajectory values f32[N, G] (docs/filtering.md#group-scores).

    metric (static, a `FILTER_METRICS` name): `reward_variance` / `entropy_variance` -> unbiased in-group std;
    `reward` / `entropy` / `length` -> in-group mean; `reward_sum` -> in-group sum. `values` holds the metric's
    `quantity`: episode rewards (incl. format penalty), mean token entropy over the loss mask, or the number of
    loss tokens.
    """
    return FILTER_METRICS.entry(metric).fn(values)


def _stable_order(candidate: jax.Array, key: jax.Array) -> jax.Array:
    """Indices sorting candidates first, by ascending `key`, ties by lower index."""
    iota = jnp.arange(key.shape[0], dtype=jnp.int32)
    _, _, order = jax.lax.sort((~candidate, key, iota), num_keys=2, is_stable=True)
    return order


def _scatter_back(order: jax.Array, keep_sorted: jax.Array) -> jax.Array:
    return jnp.zeros_like(keep_sorted).at[order].set(keep_sorted)


def _sequential_cumsum(x: jax.Array) -> jax.Array:
    """Left-to-right float32 prefix sums (the order torch/numpy accumulate in), so thresholds match exactly."""
    return jax.lax.scan(lambda c, v: (c + v, c + v), jnp.float32(0), x)[1]


def _top_p_softmax(scores, candidate, num_candidates, value, largest):
    logits = jnp.where(candidate, scores if largest else -scores, -jnp.inf)
    logits = logits - jnp.where(num_candidates > 0, logits.max(), 0.0)
    weights = jnp.where(candidate, jnp.exp(logits), 0.0)
    probs = weights / jnp.maximum(weights.sum(), jnp.finfo(jnp.float32).tiny)
    order = _stable_order(candidate, -probs + 0.0)
    position = jnp.arange(scores.shape[0])
    cumulative = _sequential_cumsum(probs[order])
    # torch.searchsorted(left) + 1: the first position whose cumulative mass reaches `value`, inclusive.
    k = jnp.minimum(((cumulative < value) & (position < num_candidates)).sum() + 1, num_candidates)
    return _scatter_back(order, position < k)


def _top_p_linear(scores, candidate, value, largest, eps):
    order = _stable_order(candidate, (-scores if largest else scores) + 0.0)
    sorted_scores = scores[order]
    sorted_candidate = candidate[order]
    threshold = value * jnp.where(candidate, scores, 0.0).sum() - eps

    def step(carry, x):  # RAGEN's Python loop, with "break" as a sticky flag
        total, count, stopped = carry
        score, is_candidate = x
        stopped = stopped | (total >= threshold) | (score <= 0) | ~is_candidate
        total = jnp.where(stopped, total, total + score)
        count = count + jnp.where(stopped, 0, 1)
        return (total, count, stopped), None

    init = (jnp.float32(0), jnp.int32(0), jnp.bool_(False))
    (total, count, _), _ = jax.lax.scan(step, init, (sorted_scores, sorted_candidate))
    keep_sorted = (jnp.arange(scores.shape[0]) < count) & (total >= threshold)
    return _scatter_back(order, keep_sorted)


def _top_k(scores, candidate, num_candidates, k, largest):
    k = jnp.maximum(jnp.minimum(k, num_candidates), 1)
    order = _stable_order(candidate, (-scores if largest else scores) + 0.0)
    position = jnp.arange(scores.shape[0])
    return _scatter_back(order, (position < k) & (position < num_candidates))


# A filter strategy: fn(scores f32[N], candidate bool[N], value f32, largest, top_p_mode, eps) -> bool[N], the
# groups to keep; `select_groups` ANDs the result with `candidate`. The static arguments are Python values
# (`largest`: filter.type == "largest"); `value` and `eps` may be traced. `value_ok` / `value_rule` tell
# `config.validate` which filter.value the strategy takes (default: a value in (0, 1]).
register_filter_strategy = FILTER_STRATEGIES.register


@register_filter_strategy("top_p")
def _top_p(scores, candidate, value, largest, top_p_mode, eps):
    if top_p_mode == "softmax":
        partial = _top_p_softmax(scores, candidate, candidate.sum(), value, largest)
    else:
        partial = _top_p_linear(scores, candidate, value, largest, jnp.asarray(eps, jnp.float32))
    return jnp.where(value >= 1.0, candidate, partial)


@register_filter_strategy("top_k")
def _top_k_fraction(scores, candidate, value, largest, top_p_mode, eps):
    count = jnp.floor(value * scores.shape[0]).astype(jnp.int32)
    return _top_k(scores, candidate, candidate.sum(), count, largest)


@register_filter_strategy("top_k_abs", value_ok=lambda value: value >= 1, value_rule="an absolute group count >= 1")
def _top_k_abs(scores, candidate, value, largest, top_p_mode, eps):
    return _top_k(scores, candidate, candidate.sum(), jnp.floor(value).astype(jnp.int32), largest)


@register_filter_strategy("min_p")
def _min_p(scores, candidate, value, largest, top_p_mode, eps):
    if largest:
        best = jnp.where(candidate, scores, -jnp.inf).max()
        return scores >= best * value - MIN_P_SLACK
    best = jnp.where(candidate, scores, jnp.inf).min()
    return scores <= best / (value + MIN_P_SLACK) + MIN_P_SLACK


def select_groups(
    scores: jax.Array,
    strategy: str,
    value: float | jax.Array,
    filter_type: str = "largest",
    include_zero: bool | jax.Array = True,
    top_p_mode: str = "linear",
    eps: float | jax.Array = 0.01,
) -> jax.Array:
    """Which groups to keep, bool[N], exactly as RAGEN's `_select_top_groups` (docs/filtering.md#group-selection).

    Candidates are all groups, or with `include_zero=False` those with |score| > 1e-10 (none left ->
    empty). Then, over the candidates:
      top_p (value >= 1): all candidates.
      top_p softmax: p = softmax(+-scores) over candidates; keep the most probable groups up to and
        including the first whose cumulative probability reaches `value`.
      top_p linear: scan scores from best to worst, adding positive scores until the running sum
        reaches value * sum(candidate scores) - eps; if it never does, keep nothing.
      top_k: the k = clip(floor(value * N), 1, #candidates) best, N counting ALL groups.
      top_k_abs: the k = clip(floor(value), 1, #candidates) best.
      min_p: largest keeps scores >= max * value - 1e-10; smallest keeps scores <= min / (value +
        1e-10) + 1e-10.
    "Best" is the largest score for filter_type="largest" and the smallest for "smallest".

    Args:
      scores: f32[N] group scores (see `group_scores`).
      strategy: static, a FILTER_STRATEGIES name.
      value: p, fraction k, absolute k or min-p ratio; a scalar that may be traced.
      filter_type: static, "largest" or "smallest".
      include_zero: bool (may be traced); False removes ~zero scores from the candidates first.
      top_p_mode: static, "linear" or "softmax".
      eps: the epsilon subtracted from the linear top-p threshold (may be traced).
    Returns:
      bool[N] group mask.
    """
    select = FILTER_STRATEGIES.entry(strategy).fn
    check_choice("filter.type", filter_type, FILTER_TYPES)
    check_choice("filter.top_p_mode", top_p_mode, TOP_P_MODES)
    scores = jnp.asarray(scores, jnp.float32)
    value = jnp.asarray(value, jnp.float32)
    candidate = jnp.asarray(include_zero, bool) | (jnp.abs(scores) > ZERO_SCORE)
    keep = select(scores, candidate, value, filter_type == "largest", top_p_mode, eps)
    return keep & candidate

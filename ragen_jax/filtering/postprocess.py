"""After selection: compaction of kept rows, filter metrics, loss scaling, soft reweighting (docs/filtering.md).

Rows are group-contiguous: rows g*G ... g*G+G-1 belong to group g (docs/filtering.md#group-scores). Instead of RAGEN's
`batch[mask]` (a variable-size batch) the kept rows are moved to the front by a stable permutation and
counted, so the update phase can skip whole minibatches of dropped rows: filtering saves compute.
"""
from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from ragen_jax.config import FILTER_METRICS, LOSS_SCALINGS, check_choice
from ragen_jax.filtering.selection import ZERO_SCORE, group_scores, group_stats, select_groups

SOFT_REWEIGHT_EPS = 1e-6


def expand_group_mask(group_mask: jax.Array, group_size: int) -> jax.Array:
    """bool[N] group mask -> bool[N * group_size] row mask."""
    return jnp.repeat(group_mask, group_size)


def compact(group_mask: jax.Array, group_size: int) -> tuple[jax.Array, jax.Array]:
    """A stable permutation that moves the rows of kept groups to the front, and their count.

    Args:
      group_mask: bool[N]; group_size: static G.
    Returns:
      (perm int32[N*G], kept_rows int32): `take(x, perm, axis=0)` lists the kept rows in their original
      order, then the dropped rows in theirs; rows [0, kept_rows) are the kept ones.
    """
    row_mask = expand_group_mask(group_mask, group_size)
    iota = jnp.arange(row_mask.shape[0], dtype=jnp.int32)
    _, perm = jax.lax.sort((~row_mask, iota), num_keys=1, is_stable=True)
    return perm, row_mask.sum().astype(jnp.int32)


def permute_rows(tree: Any, perm: jax.Array) -> Any:
    """Applies a row permutation to every array of a pytree (leading axis = rows)."""
    return jax.tree.map(lambda x: jnp.take(x, perm, axis=0), tree)


def kept_ratio(group_mask: jax.Array) -> jax.Array:
    """`filter_kept_ratio` = kept groups / all groups, f32 scalar."""
    return group_mask.astype(jnp.float32).mean()


def filter_loss_scaling(advantages: jax.Array, ratio: jax.Array, mode: str) -> jax.Array:
    """`filter_loss_scaling`: advantages * ratio (linear), * sqrt(ratio) (sqrt) or unchanged (none).

    RAGEN applies it to the advantages after their computation (after whitening), in the trainer
    (docs/differences.md#loss-scaling-placement).
    """
    check_choice("filter.loss_scaling", mode, LOSS_SCALINGS)
    if mode == "linear":
        return advantages * ratio
    if mode == "sqrt":
        return advantages * jnp.sqrt(ratio)
    return advantages


def soft_advantage_weights(group_std: jax.Array, group_mask: jax.Array) -> tuple[jax.Array, dict[str, jax.Array]]:
    """Soft reweighting w_g = std_g / (max std over kept groups + 1e-6)
    (docs/filtering.md#loss-scaling-and-soft-reweighting).

    Args:
      group_std: f32[N] the per-group std GRPO normalised by; group_mask: bool[N] kept groups.
    Returns:
      (weights f32[N], zero for dropped groups; metrics `train/soft_reweight_{min,max,mean}` over
      kept groups, zeros when none is kept).
    """
    kept = group_mask.astype(bool)
    top = jnp.where(kept, group_std, -jnp.inf).max()
    weights = jnp.where(kept, group_std / (top + SOFT_REWEIGHT_EPS), 0.0)
    count = kept.sum()
    any_kept = count > 0
    metrics = {
        "train/soft_reweight_min": jnp.where(any_kept, jnp.where(kept, weights, jnp.inf).min(), 0.0),
        "train/soft_reweight_max": jnp.where(any_kept, weights.max(), 0.0),
        "train/soft_reweight_mean": weights.sum() / jnp.maximum(count, 1),
    }
    return weights, metrics


def filter_metrics(
    values: jax.Array, scores: jax.Array, group_mask: jax.Array, metric: str
) -> dict[str, jax.Array]:
    """The filter's metrics with RAGEN's names (docs/filtering.md#filter-metrics), f32 scalars.

    `rollout/in_group_{std,max,mean}` (means over all groups) and `rollout/chosen_in_group_*` (over kept
    groups, 0 when none) of the metric's per-trajectory quantity; the copies named by that quantity (its registered
    `quantity`), `rollout/in_group_{reward,entropy,length}_*` (+ `_sum` for rewards); `rollout/filter_kept_count`
    (groups), `rollout/filter_kept_ratio`, `rollout/filter_zero_count` (groups with |score| <= 1e-10)
    and `rollout/empty_after_filter`.

    Args:
      values: f32[N, G] per-trajectory quantity; scores: f32[N] selection scores; group_mask: bool[N];
      metric: static, a `FILTER_METRICS` name.
    """
    family = FILTER_METRICS.entry(metric).quantity  # reward | entropy | length
    stats = group_stats(values)
    names = ("std", "max", "mean", "sum") if family == "reward" else ("std", "max", "mean")
    kept = group_mask.astype(jnp.float32)
    count = kept.sum()
    metrics = {}
    for name in names:
        overall = stats[name].mean()
        chosen = (stats[name] * kept).sum() / jnp.maximum(count, 1.0)
        if name != "sum":
            metrics[f"rollout/in_group_{name}"] = overall
            metrics[f"rollout/chosen_in_group_{name}"] = chosen
        metrics[f"rollout/in_group_{family}_{name}"] = overall
        metrics[f"rollout/chosen_in_group_{family}_{name}"] = chosen
    metrics["rollout/filter_kept_count"] = count
    metrics["rollout/filter_kept_ratio"] = kept_ratio(group_mask)
    metrics["rollout/filter_zero_count"] = (jnp.abs(scores) <= ZERO_SCORE).sum().astype(jnp.float32)
    metrics["rollout/empty_after_filter"] = (count == 0).astype(jnp.float32)
    return metrics


class FilterResult(NamedTuple):
    """Everything one filtering pass produces (all arrays, fixed shapes)."""

    group_mask: jax.Array  # bool[N]
    row_mask: jax.Array  # bool[N*G]
    perm: jax.Array  # int32[N*G], kept rows first (see `compact`)
    kept_rows: jax.Array  # int32
    kept_ratio: jax.Array  # f32, kept groups / N
    scores: jax.Array  # f32[N]
    metrics: dict[str, jax.Array]


def apply_filter(
    values: jax.Array,
    metric: str,
    strategy: str,
    value: float | jax.Array,
    filter_type: str = "largest",
    include_zero: bool | jax.Array = True,
    top_p_mode: str = "linear",
    eps: float | jax.Array = 0.01,
) -> FilterResult:
    """Scores, selects and compacts in one call: `group_scores` -> `select_groups` -> `compact` + metrics.

    Args:
      values: f32[N, G] per-trajectory quantity of `metric`; the rest as in `select_groups`.
    """
    scores = group_scores(values, metric)
    group_mask = select_groups(scores, strategy, value, filter_type, include_zero, top_p_mode, eps)
    group_size = values.shape[1]
    perm, kept_rows = compact(group_mask, group_size)
    return FilterResult(
        group_mask=group_mask,
        row_mask=expand_group_mask(group_mask, group_size),
        perm=perm,
        kept_rows=kept_rows,
        kept_ratio=kept_ratio(group_mask),
        scores=scores,
        metrics=filter_metrics(values, scores, group_mask, metric),
    )

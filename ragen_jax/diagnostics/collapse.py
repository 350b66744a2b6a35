"""MI proxies of reasoning collapse from a cross log-prob matrix (docs/diagnostics.md), fixed shapes, jittable.

Rows are sampled (x, z) pairs, columns are candidate prompts; `logp[i, j]` = log p(z_i | x_j). Columns
with equal signature hold token-identical prompts. Everything is computed under the empirical prompt
distribution of the N *valid columns* (RAGEN's N = number of columns, not of distinct signatures):

  matched_i  = logp[i, c(i)]                         marginal_i = logsumexp_j logp[i, j] - log N
  mi_estimate = mean(matched) - mean(marginal)       mi_upper_bound = log N
  mi_zscore   = mean((matched - marginal) / (std(marginal) + eps))   (population std)

Retrieval counts a hit when the predicted column has the true column's signature; chance levels count
columns per signature. Metrics are NaN and the EMA is left untouched when fewer than 2 valid columns or no
valid row exist (RAGEN returns no metrics then).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

TOPK = (2, 4, 8)  # retrieval_accuracy@k levels; k_max = min(8, N)
STD_EPS = 1e-3
EMA_DECAY = 0.9

def init_ema() -> dict:
    """The EMA state before the first computation: `initialised` False, so the first call sets ema = std."""
    zero = jnp.zeros((), jnp.float32)
    return {"initialised": jnp.zeros((), jnp.bool_), "marginal_std": zero, "marginal_std_seq": zero}


def _matched_marginal(logp, true_col, col_valid, num_cols):
    """matched f32[R] and marginal f32[R] (logsumexp over the valid columns minus log N)."""
    matched = jnp.take_along_axis(logp, true_col[:, None], axis=1)[:, 0]
    masked = jnp.where(col_valid[None, :], logp, -jnp.inf)
    marginal = jax.nn.logsumexp(masked, axis=1) - jnp.log(num_cols)
    return matched, marginal


def _masked_mean(x, w, n):
    return jnp.sum(jnp.where(w, x, 0.0)) / n


def _masked_std(x, w, n):
    mean = _masked_mean(x, w, n)
    return jnp.sqrt(_masked_mean(jnp.square(x - mean), w, n))


def _retrieval(logp, true_col, col_signature, col_valid, row_w, num_rows, num_cols):
    """Duplicate-aware retrieval accuracy, top-k accuracy and chance levels (docs/diagnostics.md#retrieval-accuracy)."""
    num_cols_static = logp.shape[1]
    masked = jnp.where(col_valid[None, :], logp, -jnp.inf)
    true_sig = col_signature[true_col]
    pred_sig = col_signature[jnp.argmax(masked, axis=1)]  # first max on ties, as torch.argmax
    acc = _masked_mean((pred_sig == true_sig).astype(jnp.float32), row_w, num_rows)

    same_sig = (col_signature[:, None] == col_signature[None, :]) & col_valid[None, :]
    counts = jnp.sum(same_sig, axis=1).astype(jnp.float32)  # valid columns sharing column j's signature
    chance = _masked_mean(counts[true_col] / num_cols, row_w, num_rows)
    out = {"retrieval_accuracy": acc, "retrieval_chance_level": chance, "retrieval_above_chance": acc - chance}

    k_top = min(max(TOPK), num_cols_static)
    _, top_cols = jax.lax.top_k(masked, k_top)  # ties: lower column first
    top_hit = col_signature[top_cols] == true_sig[:, None]  # [R, k_top]
    k_max = jnp.minimum(max(TOPK), num_cols)
    for k in TOPK:
        k_eff = jnp.minimum(k, k_max)
        hit = jnp.any(top_hit & (jnp.arange(k_top)[None, :] < k_eff), axis=1)
        acc_k = _masked_mean(hit.astype(jnp.float32), row_w, num_rows)
        chance_k = jnp.minimum(1.0, chance * k_eff)
        out[f"retrieval_accuracy@{k}"] = acc_k
        out[f"retrieval_chance_level@{k}"] = chance_k
        out[f"retrieval_above_chance@{k}"] = acc_k - chance_k
    return out


def collapse_metrics(
    logp_mean: jax.Array,
    logp_sum: jax.Array,
    true_col: jax.Array,
    col_signature: jax.Array,
    row_valid: jax.Array,
    ema_state: dict,
    *,
    col_valid: jax.Array | None = None,
    std_eps: float | jax.Array = STD_EPS,
    ema_decay: float | jax.Array = EMA_DECAY,
) -> tuple[dict, dict]:
    """All MI proxies (docs/diagnostics.md) for one sampling family.

    Args:
      logp_mean: f32[R, C] per-token mean log p(z_i | x_j).
      logp_sum: f32[R, C] summed log p(z_i | x_j).
      true_col: i32[R] the column holding row i's own prompt.
      col_signature: i32[C]; equal values = token-identical prompts.
      row_valid: bool[R]; invalid rows (empty reasoning, unused sample slots) are excluded. A row whose true
        column is invalid is excluded too.
      ema_state: from `init_ema()` or a previous call (one state per sampling family).
      col_valid: bool[C] or None (= all columns valid); invalid columns leave N and every max/logsumexp.
      std_eps, ema_decay: floats or traced scalars.
    Returns:
      (metrics, new_ema_state); metrics maps each MI proxy's name (docs/diagnostics.md) to an f32 scalar.
    """
    logp_mean = jnp.asarray(logp_mean, jnp.float32)
    logp_sum = jnp.asarray(logp_sum, jnp.float32)
    num_rows_static, num_cols_static = logp_mean.shape
    if logp_sum.shape != logp_mean.shape:
        raise ValueError(f"logp_sum shape {logp_sum.shape} differs from logp_mean shape {logp_mean.shape}")
    for name, arr in (("true_col", true_col), ("row_valid", row_valid)):
        if arr.shape != (num_rows_static,):
            raise ValueError(f"{name} has shape {arr.shape}, expected ({num_rows_static},)")
    if col_signature.shape != (num_cols_static,):
        raise ValueError(f"col_signature has shape {col_signature.shape}, expected ({num_cols_static},)")
    col_valid = jnp.ones((num_cols_static,), jnp.bool_) if col_valid is None else jnp.asarray(col_valid, jnp.bool_)

    true_col = jnp.asarray(true_col, jnp.int32)
    row_w = jnp.asarray(row_valid, jnp.bool_) & col_valid[true_col]
    num_rows = jnp.sum(row_w).astype(jnp.float32)
    num_cols = jnp.sum(col_valid).astype(jnp.float32)
    ok = (num_cols >= 2) & (num_rows >= 1)
    safe_rows, safe_cols = jnp.maximum(num_rows, 1.0), jnp.maximum(num_cols, 1.0)

    matched, marginal = _matched_marginal(logp_mean, true_col, col_valid, safe_cols)
    matched_seq, marginal_seq = _matched_marginal(logp_sum, true_col, col_valid, safe_cols)
    mean = lambda x: _masked_mean(x, row_w, safe_rows)  # noqa: E731
    std = _masked_std(marginal, row_w, safe_rows)
    std_seq = _masked_std(marginal_seq, row_w, safe_rows)

    first = ~ema_state["initialised"]
    ema = jnp.where(first, std, ema_decay * ema_state["marginal_std"] + (1 - ema_decay) * std)
    ema_seq = jnp.where(first, std_seq, ema_decay * ema_state["marginal_std_seq"] + (1 - ema_decay) * std_seq)

    gap, gap_seq = matched - marginal, matched_seq - marginal_seq
    metrics = {
        "mi_estimate": mean(matched) - mean(marginal),
        "mi_seq_estimate": mean(matched_seq) - mean(marginal_seq),
        "mi_upper_bound": jnp.log(safe_cols),
        "matched_log_prob_mean": mean(matched),
        "marginal_log_prob_mean": mean(marginal),
        "conditional_entropy_est": -mean(matched),
        "reasoning_entropy_est": -mean(marginal),
        "conditional_entropy_seq_est": -mean(matched_seq),
        "reasoning_entropy_seq_est": -mean(marginal_seq),
        "marginal_std": std,
        "marginal_std_seq": std_seq,
        "mi_zscore": mean(gap / (std + std_eps)),
        "mi_zscore_seq": mean(gap_seq / (std_seq + std_eps)),
        "marginal_std_ema": ema,
        "marginal_std_ema_seq": ema_seq,
        "mi_zscore_ema": mean(gap / (ema + std_eps)),
        "mi_zscore_ema_seq": mean(gap_seq / (ema_seq + std_eps)),
        **_retrieval(logp_mean, true_col, col_signature, col_valid, row_w, safe_rows, safe_cols),
    }
    metrics = {k: jnp.where(ok, v, jnp.nan).astype(jnp.float32) for k, v in metrics.items()}
    metrics["num_pairs"] = num_rows
    metrics["num_prompts"] = num_cols

    new_ema = {
        "initialised": ema_state["initialised"] | ok,
        "marginal_std": jnp.where(ok, ema, ema_state["marginal_std"]).astype(jnp.float32),
        "marginal_std_seq": jnp.where(ok, ema_seq, ema_state["marginal_std_seq"]).astype(jnp.float32),
    }
    return metrics, new_ema


def prefixed(metrics: dict, prefix: str) -> dict:
    """`{name: v}` -> `{f"{prefix}/{name}": v}` (RAGEN's family prefixes, e.g. `collapse_first_turn_sample`)."""
    return {f"{prefix}/{name}": value for name, value in metrics.items()}

"""Shared helpers of the diagnostics tests: an independent numpy reference of the MI proxies (docs/diagnostics.md)."""
import math

import numpy as np
import pytest


def _reference(lp, lps, true_col, sig, ema_std=None, ema_std_seq=None, eps=1e-3, decay=0.9):
    """Rows and columns here are only the valid ones; `sig` holds arbitrary hashables."""
    n = lp.shape[1]
    rows = np.arange(lp.shape[0])

    def stats(m):
        matched = m[rows, true_col]
        mx = m.max(axis=1, keepdims=True)
        marginal = np.log(np.exp(m - mx).sum(axis=1)) + mx[:, 0] - math.log(n)
        return matched, marginal

    matched, marginal = stats(lp)
    matched_s, marginal_s = stats(lps)
    out = {
        "mi_estimate": matched.mean() - marginal.mean(),
        "mi_seq_estimate": (matched_s - marginal_s).mean(),
        "mi_upper_bound": math.log(n),
        "matched_log_prob_mean": matched.mean(),
        "marginal_log_prob_mean": marginal.mean(),
        "conditional_entropy_est": -matched.mean(),
        "reasoning_entropy_est": -marginal.mean(),
        "conditional_entropy_seq_est": -matched_s.mean(),
        "reasoning_entropy_seq_est": -marginal_s.mean(),
    }
    sig_ids = {}
    col_sig = np.array([sig_ids.setdefault(s, len(sig_ids)) for s in sig])
    true_sig = col_sig[true_col]
    pred = np.array([int(np.argmax(r)) for r in lp])
    acc = float(np.mean(col_sig[pred] == true_sig))
    counts = np.bincount(col_sig)
    chance = float(np.mean(counts[true_sig] / n))
    out.update(retrieval_accuracy=acc, retrieval_chance_level=chance, retrieval_above_chance=acc - chance)
    k_max = min(8, n)
    order = np.array([sorted(range(n), key=lambda j: (-r[j], j)) for r in lp])  # stable: lower column on ties
    for k in (2, 4, 8):
        k_eff = min(k, k_max)
        hit = np.array([true_sig[i] in set(col_sig[order[i, :k_eff]]) for i in rows])
        chance_k = min(1.0, chance * k_eff)
        out[f"retrieval_accuracy@{k}"] = hit.mean()
        out[f"retrieval_chance_level@{k}"] = chance_k
        out[f"retrieval_above_chance@{k}"] = hit.mean() - chance_k
    std, std_s = marginal.std(), marginal_s.std()
    ema = std if ema_std is None else decay * ema_std + (1 - decay) * std
    ema_s = std_s if ema_std_seq is None else decay * ema_std_seq + (1 - decay) * std_s
    out.update(
        marginal_std=std, marginal_std_seq=std_s,
        mi_zscore=np.mean((matched - marginal) / (std + eps)),
        mi_zscore_seq=np.mean((matched_s - marginal_s) / (std_s + eps)),
        marginal_std_ema=ema, marginal_std_ema_seq=ema_s,
        mi_zscore_ema=np.mean((matched - marginal) / (ema + eps)),
        mi_zscore_ema_seq=np.mean((matched_s - marginal_s) / (ema_s + eps)),
        num_pairs=len(rows), num_prompts=n,
    )
    return out



@pytest.fixture(scope="session")
def collapse_reference():
    """The numpy reference of docs/diagnostics.md (RAGEN's computation order), as a function."""
    return _reference

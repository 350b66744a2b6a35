"""collapse_metrics against the worked example of docs/diagnostics.md, a numpy reference, and generative batches."""
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ragen_jax.diagnostics import collapse

_metrics = jax.jit(collapse.collapse_metrics)


def _run(logp_mean, logp_sum, true_col, sig, row_valid, ema, col_valid=None):
    out, new_ema = _metrics(
        jnp.asarray(logp_mean, jnp.float32), jnp.asarray(logp_sum, jnp.float32), jnp.asarray(true_col, jnp.int32),
        jnp.asarray(sig, jnp.int32), jnp.asarray(row_valid, bool), ema,
        col_valid=None if col_valid is None else jnp.asarray(col_valid, bool),
    )
    return {k: float(v) for k, v in out.items()}, new_ema


# ---------------------------------------------------------------- docs/diagnostics.md#worked-example
def test_worked_example_healthy():
    lp = np.array([[-1.0, -2.0], [-1.2, -1.5], [-2.5, -0.8], [-1.1, -1.0]])
    m, ema = _run(lp, 10 * lp, [0, 0, 1, 1], [0, 1], [True] * 4, collapse.init_ema())
    assert m["conditional_entropy_est"] == pytest.approx(1.0, abs=1e-6)
    assert m["reasoning_entropy_est"] == pytest.approx(1.273197, abs=1e-6)
    assert m["marginal_log_prob_mean"] == pytest.approx(-1.273197, abs=1e-6)
    assert m["mi_estimate"] == pytest.approx(0.273197, abs=1e-6)
    assert m["mi_upper_bound"] == pytest.approx(0.693147, abs=1e-6)
    assert m["marginal_std"] == pytest.approx(0.131132, abs=1e-6)
    assert m["mi_zscore"] == pytest.approx(2.0676, abs=1e-4)
    assert m["marginal_std_ema"] == pytest.approx(0.131132, abs=1e-6)
    assert m["mi_zscore_ema"] == pytest.approx(2.0676, abs=1e-4)
    assert m["retrieval_accuracy"] == 1.0 and m["retrieval_chance_level"] == 0.5
    assert m["retrieval_above_chance"] == 0.5
    for k in (2, 4, 8):
        assert m[f"retrieval_accuracy@{k}"] == 1.0 and m[f"retrieval_chance_level@{k}"] == 1.0
    assert bool(ema["initialised"]) and float(ema["marginal_std"]) == pytest.approx(0.131132, abs=1e-6)


def test_worked_example_collapsed():
    lp = np.array([[-1.0, -1.01], [-1.2, -1.19], [-1.1, -1.1], [-1.3, -1.29]])
    m, _ = _run(lp, lp, [0, 0, 1, 1], [0, 1], [True] * 4, collapse.init_ema())
    assert m["mi_estimate"] == pytest.approx(0.00124, abs=1e-5)
    assert m["retrieval_accuracy"] == 0.5 == m["retrieval_chance_level"]
    assert m["retrieval_above_chance"] == 0.0


def test_duplicate_signature_chance_example():
    """docs/diagnostics.md#retrieval-accuracy: columns [A, A, B, C], one row per column -> chance 0.375."""
    lp = -np.random.default_rng(0).random((4, 4))
    m, _ = _run(lp, lp, [0, 1, 2, 3], [7, 7, 3, 9], [True] * 4, collapse.init_ema())
    assert m["retrieval_chance_level"] == pytest.approx(0.375)


# ---------------------------------------------------------------- randomised against the reference
@pytest.mark.parametrize("seed", range(6))
def test_random_matrices_match_reference(seed, collapse_reference):
    rng = np.random.default_rng(seed)
    rows, cols = 12, 10  # fixed padded shape (one compile); the valid counts vary below
    n_cols = int(rng.integers(2, cols + 1))  # often fewer than 8 columns
    col_valid = np.zeros(cols, bool)
    col_valid[rng.choice(cols, n_cols, replace=False)] = True
    sig = rng.integers(0, max(1, n_cols // 2 + 1), cols)  # duplicate signatures
    true_col = rng.choice(np.flatnonzero(col_valid), rows)
    row_valid = rng.random(rows) < 0.8
    row_valid[0] = True
    if seed % 2:  # rows pointing at an invalid column are dropped too
        true_col[1] = np.flatnonzero(~col_valid)[0] if (~col_valid).any() else true_col[1]
    lp = rng.normal(-2.0, 1.0, (rows, cols))
    lp[:, 3] = lp[:, 2]  # exact ties exercise the first-max rule
    lp[2, :] = lp[2, 0]  # a row that ties everywhere
    lps = lp * rng.integers(1, 30, (rows, 1))
    ema_in = {"initialised": jnp.array(bool(seed % 3)), "marginal_std": jnp.float32(0.7),
              "marginal_std_seq": jnp.float32(5.0)}

    got, ema = _run(lp, lps, true_col, sig, row_valid, ema_in, col_valid)

    keep_rows = row_valid & col_valid[true_col]
    col_index = np.cumsum(col_valid) - 1
    prior = (0.7, 5.0) if seed % 3 else (None, None)
    valid_lp, valid_lps = (m[keep_rows][:, col_valid].astype(np.float32) for m in (lp, lps))
    want = collapse_reference(valid_lp, valid_lps, col_index[true_col[keep_rows]], list(sig[col_valid]), *prior)
    assert set(got) == set(want)
    for name in want:
        assert got[name] == pytest.approx(float(want[name]), rel=1e-4, abs=1e-4), name
    assert float(ema["marginal_std"]) == pytest.approx(want["marginal_std_ema"], rel=1e-5)


def test_too_few_columns_gives_nan_and_keeps_ema():
    lp = -np.ones((3, 4))
    ema_in = {"initialised": jnp.array(True), "marginal_std": jnp.float32(0.3), "marginal_std_seq": jnp.float32(2.0)}
    m, ema = _run(lp, lp, [1, 1, 1], [0, 1, 2, 3], [True] * 3, ema_in, col_valid=[False, True, False, False])
    assert math.isnan(m["mi_estimate"]) and math.isnan(m["retrieval_accuracy"])
    assert m["num_prompts"] == 1.0
    assert float(ema["marginal_std"]) == pytest.approx(0.3) and float(ema["marginal_std_seq"]) == pytest.approx(2.0)


# ---------------------------------------------------------------- generative batches: template collapse vs healthy
def _generative_matrix(rng, coupling, num_prompts=8, rows_per_prompt=64, vocab=32, length=24):
    """Reasoning tokens i.i.d. from softmax(base + coupling * u_x); returns exact per-token mean log-probs."""
    base = rng.normal(0, 1, vocab)
    logits = base[None] + coupling * rng.normal(0, 1, (num_prompts, vocab))
    logq = logits - np.log(np.exp(logits).sum(1, keepdims=True))
    true_col = np.repeat(np.arange(num_prompts), rows_per_prompt)
    z = np.stack([rng.choice(vocab, length, p=np.exp(logq[c])) for c in true_col])
    lps = logq[:, z].sum(-1).T  # [R, C]
    return lps / length, lps, true_col


def test_template_collapse_gives_zero_mi_and_chance_accuracy():
    rng = np.random.default_rng(1)
    lp, lps, true_col = _generative_matrix(rng, coupling=0.01)
    m, _ = _run(lp, lps, true_col, np.arange(8), np.ones(len(true_col), bool), collapse.init_ema())
    assert abs(m["mi_estimate"]) < 0.01
    se = math.sqrt(0.125 * 0.875 / len(true_col))
    assert abs(m["retrieval_accuracy"] - m["retrieval_chance_level"]) < 4 * se + 0.03
    assert m["reasoning_entropy_est"] > 2.5  # reasoning stays diverse: high H(Z), low I(X;Z)


def test_input_dependent_reasoning_gives_mi_near_log_c():
    rng = np.random.default_rng(2)
    lp, lps, true_col = _generative_matrix(rng, coupling=4.0)
    m, _ = _run(lp, lps, true_col, np.arange(8), np.ones(len(true_col), bool), collapse.init_ema())
    assert m["mi_seq_estimate"] == pytest.approx(math.log(8), abs=0.02)
    assert m["retrieval_accuracy"] > 0.99
    assert m["mi_estimate"] > 0.5 * math.log(8)

"""Prefix-cached cross log-probs equal the naive full-sequence computation and per-pair unpadded forwards."""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ragen_jax.diagnostics import cross_logprobs
from ragen_jax.models import ModelConfig, init_params, transformer

CONFIG = ModelConfig(vocab_size=61, d_model=32, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=8, mlp_dim=64,
                     max_seq_len=64)
COLS, PROMPT, ROWS, REASON = 5, 13, 7, 9
TEMPERATURE = 0.7
MODEL = transformer.DecoderLM(CONFIG)


@pytest.fixture(scope="module")
def params():
    # larger than the default init so the next-token distributions are far from uniform
    init = jax.jit(init_params, static_argnums=0)
    return jax.tree.map(lambda x: 6.0 * x if x.ndim > 1 else x, init(CONFIG, jax.random.key(0)))


# one row and one column per chunk: every row and prompt picks its own width tier (Z: 3, 5, 9; P: 4, 7, 13)
_cached = jax.jit(functools.partial(cross_logprobs.cross_log_probs, MODEL, row_chunk=1, col_chunk=1))
_cached_untiered = jax.jit(functools.partial(cross_logprobs.cross_log_probs, MODEL, row_chunk=0, col_chunk=0,
                                             num_tiers=1))
_naive = jax.jit(functools.partial(cross_logprobs.cross_log_probs_naive, MODEL))


def _inputs(seed):
    rng = np.random.default_rng(seed)
    prompt_len = rng.integers(1, PROMPT + 1, COLS)
    prompt_len[0] = PROMPT
    reasoning_len = rng.integers(0, REASON + 1, ROWS)
    reasoning_len[:2] = (REASON, 1)
    pad = lambda a, n: np.where(np.arange(a.shape[1]) < n[:, None], a, 0)  # noqa: E731
    prompts = pad(rng.integers(0, CONFIG.vocab_size, (COLS, PROMPT)), prompt_len)
    reasoning = pad(rng.integers(0, CONFIG.vocab_size, (ROWS, REASON)), reasoning_len)
    return tuple(jnp.asarray(a, jnp.int32) for a in (prompts, prompt_len, reasoning, reasoning_len))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_prefix_cache_matches_naive(params, seed):
    args = _inputs(seed)
    mean, total = _cached(params, *args, TEMPERATURE)
    naive_mean, naive_total = _naive(params, *args, TEMPERATURE)
    assert mean.shape == total.shape == (ROWS, COLS)
    assert float(jnp.max(jnp.abs(mean - naive_mean))) < 1e-4
    assert float(jnp.max(jnp.abs(total - naive_total))) < 1e-4
    if seed == 0:  # all rows and columns in one chunk at the padded widths
        untiered_mean, _ = _cached_untiered(params, *args, TEMPERATURE)
        assert float(jnp.max(jnp.abs(untiered_mean - mean))) < 1e-5
    if seed == 1:  # a column passed with prompt length 0 is skipped (zeros); the others are unchanged
        skipped_mean, skipped_total = _cached(params, args[0], args[1].at[2].set(0), *args[2:], TEMPERATURE)
        assert float(jnp.max(jnp.abs(skipped_total[:, 2]))) == 0.0
        keep = np.arange(COLS) != 2
        assert float(jnp.max(jnp.abs(skipped_mean[:, keep] - mean[:, keep]))) == 0.0


def test_matches_unpadded_per_pair_forward(params):
    """Independent of both paths: [x_j | z_i] alone at its exact length, log-softmax in numpy.

    Lengths are chosen so four pairs have |x| + |z| = 12 and run as one unpadded batch.
    """
    rng = np.random.default_rng(3)
    prompt_len = np.array([13, 8, 5, 10, 3])
    reasoning_len = np.array([9, 1, 4, 7, 2, 0, 9])
    prompts = rng.integers(0, CONFIG.vocab_size, (COLS, PROMPT))
    reasoning = rng.integers(0, CONFIG.vocab_size, (ROWS, REASON))
    args = tuple(jnp.asarray(a, jnp.int32) for a in (prompts, prompt_len, reasoning, reasoning_len))
    mean, total = (np.asarray(a) for a in _cached(params, *args, TEMPERATURE))
    pairs = [(2, 1), (3, 2), (4, 3), (0, 4)]
    seqs = np.stack([np.concatenate([prompts[j, :prompt_len[j]], reasoning[i, :reasoning_len[i]]]) for i, j in pairs])
    logits = np.asarray(jax.jit(functools.partial(transformer.apply, CONFIG))(params, jnp.asarray(seqs, jnp.int32)),
                        np.float64) / TEMPERATURE
    shifted = logits - logits.max(-1, keepdims=True)
    logsm = shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))
    for row, (i, j) in enumerate(pairs):
        x, z = prompt_len[j], reasoning[i, :reasoning_len[i]]
        want = sum(logsm[row, x - 1 + t, z[t]] for t in range(len(z)))
        assert total[i, j] == pytest.approx(want, abs=1e-4)
        assert mean[i, j] == pytest.approx(want / len(z), abs=1e-5)
    assert (total[reasoning_len == 0] == 0).all() and (mean[reasoning_len == 0] == 0).all()


def test_temperature_scales_logits(params):
    """T -> the same as dividing the model's logits by T: check against the naive path at T=1 on scaled params."""
    args = _inputs(4)
    mean_t, _ = _cached(params, *args, 2.0)
    halved = dict(params, final_norm={"scale": params["final_norm"]["scale"] / 2.0})  # tied head: logits / 2
    mean_half, _ = _naive(halved, *args, 1.0)
    assert float(jnp.max(jnp.abs(mean_t - mean_half))) < 1e-4


def test_width_tiers():
    assert cross_logprobs.width_tiers(9, 3) == (3, 6, 9)
    assert cross_logprobs.width_tiers(400, 4) == (100, 200, 300, 400)
    assert cross_logprobs.width_tiers(1, 3) == (1,) and cross_logprobs.width_tiers(48, 1) == (48,)


def test_concat_prompt_reasoning_layout():
    prompt = jnp.array([5, 6, 7, 0], jnp.int32)
    reasoning = jnp.array([[1, 2, 0], [3, 0, 0]], jnp.int32)
    seq = cross_logprobs.concat_prompt_reasoning(prompt, jnp.int32(3), reasoning)
    assert np.asarray(seq)[:, :5].tolist() == [[5, 6, 7, 1, 2], [5, 6, 7, 3, 0]]

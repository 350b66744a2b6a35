"""StarPO losses: dual-clip PPO, clipped value loss, entropy, KL estimators, aggregation
(docs/rewards_and_objectives.md).

Pure and jittable; token arrays are f32[B, T] with a loss mask of the same shape. String options
(aggregation mode, KL estimator) are static; clip ratios and coefficients may be traced.
"""
from __future__ import annotations

import functools
from typing import Callable

import jax
import jax.numpy as jnp

from ragen_jax.config import KL_ESTIMATORS, LOSS_AGG_MODES

LOG_RATIO_CLAMP = 20.0  # verl clamps log(pi / pi_old) to [-20, 20] before exp
LOW_VAR_KL_CLAMP = 10.0  # verl clamps the k3 estimate to [-10, 10]
DEFAULT_VOCAB_CHUNK = 8192
DEFAULT_LOGITS_CHUNK = 2 ** 24  # logits held at once by token-chunked scoring (floats: 64 MiB in float32)


def masked_mean(values: jax.Array, mask: jax.Array) -> jax.Array:
    """Sum(values * mask) / (sum(mask) + 1e-8) over all entries (verl `masked_mean`); 0 for an empty mask."""
    mask = mask.astype(jnp.float32)
    return (values * mask).sum() / (mask.sum() + 1e-8)


# A new `algo.loss_agg_mode` is one function here, `fn(loss f32[B, T], mask f32[B, T] of 0/1 floats) -> f32 scalar`,
# under `@register_loss_agg_mode("name")`: `config.validate` and `agg_loss` read the registry.
register_loss_agg_mode = LOSS_AGG_MODES.register


def _row_sums(loss: jax.Array, mask: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
    """(sum_t l*m f32[B], sum_t m f32[B], rows holding at least one loss token, at least 1)."""
    token_sum = (loss * mask).sum(-1)
    token_count = mask.sum(-1)
    has_tokens = (token_count > 0).astype(jnp.float32)
    return token_sum, token_count, jnp.maximum(has_tokens.sum(), 1.0)


@register_loss_agg_mode("token-mean")
def _token_mean(loss, mask):
    token_sum, token_count, _ = _row_sums(loss, mask)
    return token_sum.sum() / (token_count.sum() + 1e-8)


@register_loss_agg_mode("seq-mean-token-mean")
def _seq_mean_token_mean(loss, mask):
    token_sum, token_count, num_rows = _row_sums(loss, mask)
    return (token_sum / jnp.maximum(token_count, 1.0)).sum() / num_rows


@register_loss_agg_mode("seq-mean-token-sum")
def _seq_mean_token_sum(loss, mask):
    token_sum, _, num_rows = _row_sums(loss, mask)
    return token_sum.sum() / num_rows


@register_loss_agg_mode("seq-mean-token-sum-norm")
def _seq_mean_token_sum_norm(loss, mask):
    token_sum, _, _ = _row_sums(loss, mask)
    return token_sum.sum() / loss.shape[-1]


def agg_loss(loss: jax.Array, mask: jax.Array, mode: str) -> jax.Array:
    """Aggregates a token loss f32[B, T] into a scalar (verl `agg_loss`,
    docs/rewards_and_objectives.md#loss-aggregation).

    Modes (`LOSS_AGG_MODES`, registered above; `mode` is static):
      token-mean: sum(l*m) / sum(m).
      seq-mean-token-mean: mean over rows of sum_t(l*m) / sum_t(m).
      seq-mean-token-sum: mean over rows of sum_t(l*m).
      seq-mean-token-sum-norm: sum(l*m) / T (the padded length; verl sums over rows, no row mean).
    The seq-mean modes average over rows that hold at least one loss token: fixed-shape batches carry
    padding rows (dropped by the filter) that RAGEN's variable-size batch never contains.
    """
    return LOSS_AGG_MODES.entry(mode).fn(loss, mask.astype(jnp.float32))


def policy_loss(
    logp: jax.Array,
    old_logp: jax.Array,
    advantages: jax.Array,
    mask: jax.Array,
    clip_low: float | jax.Array,
    clip_high: float | jax.Array,
    clip_c: float | jax.Array,
    agg_mode: str,
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """Dual-clip PPO with asymmetric clipping (verl `compute_policy_loss` vanilla,
    docs/rewards_and_objectives.md#policy-loss).

    Args:
      logp, old_logp, advantages, mask: f32[B, T].
      clip_low, clip_high: epsilons of the ratio clip [1 - clip_low, 1 + clip_high].
      clip_c: dual-clip bound for negative advantages (loss <= -A * clip_c).
      agg_mode: a `LOSS_AGG_MODES` name.
    Returns:
      (loss, metrics) with token-mean metrics `pg_clipfrac`, `pg_clipfrac_lower`, `ppo_kl`.
    """
    log_ratio = jnp.clip(logp - old_logp, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    ratio = jnp.exp(log_ratio)
    loss1 = -advantages * ratio
    loss2 = -advantages * jnp.clip(ratio, 1.0 - clip_low, 1.0 + clip_high)
    clipped = jnp.maximum(loss1, loss2)
    loss3 = -advantages * clip_c
    negative = advantages < 0
    token_loss = jnp.where(negative, jnp.minimum(loss3, clipped), clipped)
    metrics = {
        "pg_clipfrac": masked_mean((loss2 > loss1).astype(jnp.float32), mask),
        "pg_clipfrac_lower": masked_mean(((clipped > loss3) & negative).astype(jnp.float32), mask),
        "ppo_kl": masked_mean(-log_ratio, mask),
    }
    return agg_loss(token_loss, mask, agg_mode), metrics


def value_loss(
    values: jax.Array,
    old_values: jax.Array,
    returns: jax.Array,
    mask: jax.Array,
    clip_range: float | jax.Array,
    agg_mode: str,
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """Clipped critic loss 0.5 * agg(max((v-R)^2, (clip(v, v_old +- c) - R)^2)) (verl;
    docs/rewards_and_objectives.md#value-loss).

    Returns:
      (loss, metrics) with `vf_clipfrac` = token-mean of (clipped loss > unclipped loss).
    """
    clipped_values = jnp.clip(values, old_values - clip_range, old_values + clip_range)
    loss1 = jnp.square(values - returns)
    loss2 = jnp.square(clipped_values - returns)
    loss = 0.5 * agg_loss(jnp.maximum(loss1, loss2), mask, agg_mode)
    return loss, {"vf_clipfrac": masked_mean((loss2 > loss1).astype(jnp.float32), mask)}


def kl_penalty(logp: jax.Array, ref_logp: jax.Array, kind: str) -> jax.Array:
    """Per-token KL estimate of pi against pi_ref (verl `kl_penalty`,
    docs/rewards_and_objectives.md#kl-estimators-and-placements).

    `kl`/`k1`: d; `abs`: |d|; `mse`/`k2`: d^2 / 2; `low_var_kl`/`k3`: exp(u) - u - 1 with
    u = clip(-d, -20, 20), clipped to [-10, 10]; d = logp - ref_logp. Hyphenated spellings
    (`low-var-kl`) are accepted: RAGEN's scripts pass them, which upstream verl would reject
    (docs/differences.md#kl-type-strings).
    """
    if kind not in KL_ESTIMATORS:
        raise ValueError(f"kl estimator {kind!r} is invalid: allowed values are {KL_ESTIMATORS}")
    kind = kind.replace("-", "_")
    diff = logp - ref_logp
    if kind in ("kl", "k1"):
        return diff
    if kind == "abs":
        return jnp.abs(diff)
    if kind in ("mse", "k2"):
        return 0.5 * jnp.square(diff)
    u = jnp.clip(-diff, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    return jnp.clip(jnp.exp(u) - u - 1.0, -LOW_VAR_KL_CLAMP, LOW_VAR_KL_CLAMP)


# ----------------------------------------------------------------------------------------------
# Log-probabilities and entropy over the full vocabulary, streamed over vocabulary chunks.


def _vocab_moments(logits: jax.Array, inv_temperature: jax.Array, chunk_size: int):
    """Streaming logsumexp and the first two moments of l = logits * inv_temperature under softmax(l).

    Reads `logits` chunk by chunk along the vocabulary so no full-size temporary (probabilities,
    log-softmax, float32 copy of bfloat16 logits) is materialised.
    Returns (lse, E[l], E[l^2]), each f32[...].
    """
    vocab = logits.shape[-1]
    chunk = min(chunk_size, vocab)

    def stats(piece):
        piece = piece.astype(jnp.float32) * inv_temperature
        m = piece.max(-1)
        w = jnp.exp(piece - m[..., None])
        return m, w.sum(-1), (w * piece).sum(-1), (w * piece * piece).sum(-1)

    def merge(acc, new):
        m_a, *sums_a = acc
        m_b, *sums_b = new
        m = jnp.maximum(m_a, m_b)
        scale_a, scale_b = jnp.exp(m_a - m), jnp.exp(m_b - m)
        return (m, *(a * scale_a + b * scale_b for a, b in zip(sums_a, sums_b)))

    acc = stats(logits[..., :chunk])
    num_full = vocab // chunk
    if num_full > 1:
        def body(carry, i):
            piece = jax.lax.dynamic_slice_in_dim(logits, i * chunk, chunk, axis=-1)
            return merge(carry, stats(piece)), None

        acc, _ = jax.lax.scan(body, acc, jnp.arange(1, num_full))
    if vocab % chunk:
        acc = merge(acc, stats(logits[..., num_full * chunk:]))
    m, s, t1, t2 = acc
    return m + jnp.log(s), t1 / s, t2 / s


@functools.partial(jax.custom_vjp, nondiff_argnums=(3,))
def _logprob_entropy(logits, targets, inv_temperature, chunk_size):
    lse, mean, _ = _vocab_moments(logits, inv_temperature, chunk_size)
    target_logit = jnp.take_along_axis(logits, targets[..., None], -1)[..., 0].astype(jnp.float32)
    return target_logit * inv_temperature - lse, lse - mean


def _logprob_entropy_fwd(logits, targets, inv_temperature, chunk_size):
    lse, mean, second = _vocab_moments(logits, inv_temperature, chunk_size)
    target_logit = jnp.take_along_axis(logits, targets[..., None], -1)[..., 0].astype(jnp.float32)
    scaled_target = target_logit * inv_temperature
    out = (scaled_target - lse, lse - mean)
    return out, (logits, targets, inv_temperature, lse, mean, second, scaled_target)


def _logprob_entropy_bwd(chunk_size, residuals, cotangents):
    # With l = z * s (s = 1/T), p = softmax(l):
    #   d logp / d l = onehot - p,      d H / d l = -p * (l - E[l]);   d l / d z = s.
    logits, targets, inv_temperature, lse, mean, second, scaled_target = residuals
    g_logp, g_entropy = cotangents
    scaled = logits.astype(jnp.float32) * inv_temperature
    probs = jnp.exp(scaled - lse[..., None])
    onehot = jnp.arange(logits.shape[-1]) == targets[..., None]
    g_scaled = g_logp[..., None] * (onehot - probs) - g_entropy[..., None] * probs * (scaled - mean[..., None])
    g_logits = (g_scaled * inv_temperature).astype(logits.dtype)
    # d l / d s = z = l / s: d logp / d s = (l_target - E[l]) / s,  d H / d s = -Var[l] / s.
    g_inv_temp = ((g_logp * (scaled_target - mean) - g_entropy * (second - mean * mean)) / inv_temperature).sum()
    g_targets = None
    return g_logits, g_targets, g_inv_temp.astype(jnp.asarray(inv_temperature).dtype)


_logprob_entropy.defvjp(_logprob_entropy_fwd, _logprob_entropy_bwd)


def logprobs_and_entropy(
    logits: jax.Array,
    targets: jax.Array,
    temperature: float | jax.Array = 1.0,
    chunk_size: int = DEFAULT_VOCAB_CHUNK,
) -> tuple[jax.Array, jax.Array]:
    """Log-probability of `targets` and full-vocabulary entropy under softmax(logits / temperature).

    One streamed pass over vocabulary chunks computes both; the custom gradient keeps only the
    logits (the input) and per-position statistics, and writes the logits' cotangent in one fused
    elementwise pass, so a 150k vocabulary costs no extra full-size buffers.

    Args:
      logits: float[..., V] (float32 or bfloat16); targets: int[...] token ids.
      temperature: the rollout temperature (may be traced).
      chunk_size: static vocabulary chunk length.
    Returns:
      (logp f32[...], entropy f32[...]).
    """
    inv_temperature = 1.0 / jnp.asarray(temperature, jnp.float32)
    return _logprob_entropy(logits, targets.astype(jnp.int32), inv_temperature, chunk_size)


def entropy_from_logits(
    logits: jax.Array, temperature: float | jax.Array = 1.0, chunk_size: int = DEFAULT_VOCAB_CHUNK
) -> jax.Array:
    """Entropy f32[...] of softmax(logits / temperature) over the full vocabulary, streamed in chunks."""
    targets = jnp.zeros(logits.shape[:-1], jnp.int32)
    return logprobs_and_entropy(logits, targets, temperature, chunk_size)[1]


def block_positions(rows: int, length: int, vocab: int, logits_chunk: int = DEFAULT_LOGITS_CHUNK) -> int:
    """Positions c per block of `hidden_logprobs_and_entropy`: max(1, min(length, logits_chunk // (rows * vocab)))
    (1 for an empty sequence: no blocks); a block holds float[rows, c, vocab] logits."""
    if logits_chunk < 1:
        raise ValueError(f"logits_chunk = {logits_chunk} is invalid: it must be a positive number of logits")
    return max(1, min(length, logits_chunk // (rows * vocab)))


def hidden_logprobs_and_entropy(
    unembed: Callable[[jax.Array], jax.Array],
    hidden: jax.Array,
    targets: jax.Array,
    temperature: float | jax.Array = 1.0,
    logits_chunk: int = DEFAULT_LOGITS_CHUNK,
    vocab_chunk: int = DEFAULT_VOCAB_CHUNK,
) -> tuple[jax.Array, jax.Array]:
    """`logprobs_and_entropy(unembed(hidden), targets, ...)` without ever holding the logits of every position.

    The positions are scored in blocks of c = max(1, logits_chunk // (B * V)) (the last block zero-padded) by a
    `lax.map` whose body is rematerialised (`jax.checkpoint`): the forward and the backward pass each hold the
    logits and their cotangent of one block, float[B, c, V], not float[B, T, V] (unless c >= T: one block then
    holds everything, as a small vocabulary allows). The backward pass recomputes each block's logits once (one
    more LM-head matmul). Values and gradients (through `hidden` and whatever `unembed` closes over, e.g. the
    head's parameters) equal the unchunked computation up to float rounding.

    Args:
      unembed: the LM head, float[B, c, D] -> float[B, c, V]; it may close over traced parameters.
      hidden: float[B, T, D] final hidden states; targets: int[B, T] the ids they score.
      temperature: the rollout temperature (may be traced).
      logits_chunk: static budget of logits (floats) per block; vocab_chunk: as in `logprobs_and_entropy`.
    Returns:
      (logp f32[B, T], entropy f32[B, T]).
    """
    rows, length, _ = hidden.shape
    vocab = jax.eval_shape(unembed, hidden[:, :1]).shape[-1]
    size = block_positions(rows, length, vocab, logits_chunk)
    blocks = -(-length // size)
    pad = blocks * size - length

    def to_blocks(x):  # [B, T, ...] -> [blocks, B, size, ...]
        x = jnp.pad(x, [(0, 0), (0, pad)] + [(0, 0)] * (x.ndim - 2))
        return jnp.swapaxes(x.reshape(rows, blocks, size, *x.shape[2:]), 0, 1)

    @functools.partial(jax.checkpoint, prevent_cse=False)
    def score(block):
        h, t = block
        return logprobs_and_entropy(unembed(h), t, temperature, vocab_chunk)

    out = jax.lax.map(score, (to_blocks(hidden), to_blocks(targets.astype(jnp.int32))))
    return tuple(jnp.swapaxes(x, 0, 1).reshape(rows, blocks * size)[:, :length] for x in out)

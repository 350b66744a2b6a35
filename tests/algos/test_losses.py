"""Losses against numpy transcriptions of verl's formulas, hand-computed aggregations and finite differences."""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ragen_jax.algos.losses import (
    agg_loss,
    entropy_from_logits,
    kl_penalty,
    logprobs_and_entropy,
    policy_loss,
    value_loss,
)
from ragen_jax.config import KL_ESTIMATORS, LOSS_AGG_MODES

MASK = np.array([[1, 1, 0, 1], [0, 0, 0, 0], [1, 0, 1, 0]], np.float32)
LOSS = np.array([[1.0, 2.0, 100.0, 3.0], [7.0, 7.0, 7.0, 7.0], [-1.0, 50.0, 5.0, 9.0]], np.float32)


@pytest.mark.parametrize(
    "mode, expected",
    [
        ("token-mean", (1 + 2 + 3 - 1 + 5) / 5),
        ("seq-mean-token-mean", ((1 + 2 + 3) / 3 + (-1 + 5) / 2) / 2),  # row 1 holds no loss token
        ("seq-mean-token-sum", ((1 + 2 + 3) + (-1 + 5)) / 2),
        ("seq-mean-token-sum-norm", (1 + 2 + 3 - 1 + 5) / 4),
    ],
)
def test_agg_loss_modes_by_hand(mode, expected):
    assert mode in LOSS_AGG_MODES
    assert float(agg_loss(jnp.asarray(LOSS), jnp.asarray(MASK), mode)) == pytest.approx(expected, rel=1e-6)


def test_agg_loss_rejects_unknown_mode_and_empty_mask_is_zero():
    with pytest.raises(ValueError, match="token-sum"):
        agg_loss(jnp.asarray(LOSS), jnp.asarray(MASK), "token-sum")
    for mode in LOSS_AGG_MODES:
        assert float(agg_loss(jnp.asarray(LOSS), jnp.zeros_like(MASK), mode)) == 0.0


def np_policy_loss(logp, old, adv, mask, lo, hi, c):
    """verl compute_policy_loss (vanilla + dual clip) with token-mean aggregation."""
    neg_kl = np.clip(logp - old, -20, 20)
    ratio = np.exp(neg_kl)
    l1, l2 = -adv * ratio, -adv * np.clip(ratio, 1 - lo, 1 + hi)
    clip1 = np.maximum(l1, l2)
    l3 = -adv * c
    loss = np.where(adv < 0, np.minimum(l3, clip1), clip1)
    mm = lambda x: (x * mask).sum() / mask.sum()
    return mm(loss), mm((l2 > l1).astype(float)), mm((clip1 > l3) * (adv < 0)), mm(-neg_kl)


def random_policy_inputs(seed, shape=(3, 5)):
    rng = np.random.default_rng(seed)
    old = rng.normal(-2, 1, shape)
    logp = old + rng.normal(0, 0.6, shape)
    logp[0, 0] = old[0, 0] + 2.0  # ratio ~ 7.4 with a negative advantage: dual clip active
    adv = rng.normal(0, 1, shape)
    adv[0, 0] = -1.5
    mask = (rng.random(shape) < 0.8).astype(np.float64)
    mask[0, 0] = 1
    return logp, old, adv, mask


def test_policy_loss_matches_verl_formula():
    logp, old, adv, mask = random_policy_inputs(0)
    loss, metrics = policy_loss(*(jnp.asarray(x, jnp.float32) for x in (logp, old, adv, mask)), 0.2, 0.28, 3.0,
                                "token-mean")
    ref = np_policy_loss(logp, old, adv, mask, 0.2, 0.28, 3.0)
    np.testing.assert_allclose(
        [loss, metrics["pg_clipfrac"], metrics["pg_clipfrac_lower"], metrics["ppo_kl"]], ref, rtol=1e-5, atol=1e-6
    )
    assert float(metrics["pg_clipfrac_lower"]) > 0  # the dual clip was exercised


def test_policy_loss_ratio_one_gives_minus_mean_advantage_and_clamps_log_ratio():
    adv = jnp.array([[1.0, -2.0, 0.5]])
    mask = jnp.ones((1, 3))
    loss, metrics = policy_loss(jnp.zeros((1, 3)), jnp.zeros((1, 3)), adv, mask, 0.2, 0.28, 3.0, "token-mean")
    assert float(loss) == pytest.approx(-float(adv.mean()))
    assert float(metrics["pg_clipfrac"]) == 0.0
    # log-ratio 100 is clamped to 20: ppo_kl = -20, still finite
    _, metrics = policy_loss(jnp.full((1, 3), 100.0), jnp.zeros((1, 3)), adv, mask, 0.2, 0.28, 3.0, "token-mean")
    assert float(metrics["ppo_kl"]) == pytest.approx(-20.0)


def central_difference(fn, x, eps=1e-6):
    grad = np.zeros_like(x)
    for idx in np.ndindex(x.shape):
        up, down = x.copy(), x.copy()
        up[idx] += eps
        down[idx] -= eps
        grad[idx] = (fn(up) - fn(down)) / (2 * eps)
    return grad


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
def test_policy_and_value_loss_gradients_match_finite_differences(mode):
    logp, old, adv, mask = random_policy_inputs(1, (2, 4))
    rng = np.random.default_rng(2)
    values, old_values, returns = rng.normal(size=(3, 2, 4))
    with jax.enable_x64(True):
        pl = jax.jit(lambda lp: policy_loss(lp, old, adv, mask, 0.2, 0.28, 3.0, mode)[0])
        np.testing.assert_allclose(jax.grad(pl)(logp), central_difference(lambda x: float(pl(x)), logp),
                                   rtol=1e-5, atol=1e-7)
        vl = jax.jit(lambda v: value_loss(v, old_values, returns, mask, 0.5, mode)[0])
        np.testing.assert_allclose(jax.grad(vl)(values), central_difference(lambda x: float(vl(x)), values),
                                   rtol=1e-5, atol=1e-7)


def test_value_loss_matches_verl_formula():
    values = jnp.array([[0.0, 1.0, 2.0, 3.0]])
    old = jnp.array([[1.0, 1.0, 1.0, 1.0]])
    returns = jnp.array([[0.4, 0.0, 3.0, 0.0]])
    mask = jnp.array([[1.0, 1.0, 1.0, 0.0]])
    loss, metrics = value_loss(values, old, returns, mask, 0.5, "token-mean")
    # clipped values: [0.5, 1, 1.5, 1.5]; max squared errors: [max(.16,.01), 1, max(1, 2.25), -]
    assert float(loss) == pytest.approx(0.5 * (0.16 + 1.0 + 2.25) / 3, rel=1e-6)
    assert float(metrics["vf_clipfrac"]) == pytest.approx(1 / 3)


def test_kl_estimators_with_clamps_and_spellings():
    logp = jnp.array([-1.0, -3.0, 0.0, -30.0])
    ref = jnp.array([-2.0, -1.0, 0.0, 0.0])
    d = np.asarray(logp - ref)
    u = np.clip(-d, -20, 20)
    k3 = np.clip(np.exp(u) - u - 1, -10, 10)
    expected = {"kl": d, "k1": d, "abs": np.abs(d), "mse": 0.5 * d * d, "k2": 0.5 * d * d,
                "low_var_kl": k3, "low-var-kl": k3, "k3": k3}
    assert set(expected) == set(KL_ESTIMATORS)
    for kind, value in expected.items():
        np.testing.assert_allclose(kl_penalty(logp, ref, kind), value, rtol=1e-6, err_msg=kind)
    assert float(kl_penalty(logp, ref, "k3")[3]) == 10.0  # exp(20) - 21 clamped to 10
    with pytest.raises(ValueError, match="full"):
        kl_penalty(logp, ref, "full")


def naive_logprob_entropy(logits, targets, temperature):
    logsm = jax.nn.log_softmax(logits.astype(jnp.float32) / temperature, -1)
    logp = jnp.take_along_axis(logsm, targets[..., None], -1)[..., 0]
    return logp, -(jnp.exp(logsm) * logsm).sum(-1)


@pytest.mark.parametrize("vocab, chunk", [(37, 8), (37, 64)])
def test_streamed_logprob_entropy_equals_naive_values_and_gradients(vocab, chunk):
    rng = np.random.default_rng(vocab + chunk)
    logits = jnp.asarray(3.0 * rng.normal(size=(2, 3, vocab)), jnp.float32)
    targets = jnp.asarray(rng.integers(0, vocab, (2, 3)), jnp.int32)
    weights = jnp.asarray(rng.normal(size=(2, 2, 3)), jnp.float32)
    temperature = jnp.float32(0.7)
    streamed = functools.partial(logprobs_and_entropy, chunk_size=chunk)
    for got, want in zip(jax.jit(streamed)(logits, targets, temperature), naive_logprob_entropy(logits, targets, temperature)):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)

    def scalar(fn, z, t):
        logp, ent = fn(z, targets, t)
        return (weights[0] * logp).sum() + (weights[1] * ent).sum()

    g_stream = jax.jit(jax.grad(functools.partial(scalar, streamed), argnums=(0, 1)))(logits, temperature)
    g_naive = jax.jit(jax.grad(functools.partial(scalar, naive_logprob_entropy), argnums=(0, 1)))(logits, temperature)
    for got, want in zip(g_stream, g_naive):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_entropy_from_logits_bfloat16_and_uniform():
    entropy = jax.jit(entropy_from_logits, static_argnames="chunk_size")
    logits = jnp.zeros((2, 1000), jnp.bfloat16)
    np.testing.assert_allclose(entropy(logits, chunk_size=128), np.log(1000.0), rtol=1e-6)
    x = jnp.asarray(np.random.default_rng(0).normal(size=(2, 1000)), jnp.bfloat16)
    want = naive_logprob_entropy(x, jnp.zeros(2, jnp.int32), 1.0)[1]
    np.testing.assert_allclose(entropy(x, chunk_size=128), want, rtol=1e-5)
    assert entropy(x, chunk_size=128).dtype == jnp.float32

"""Gradient-component analysis: bucket rules (docs/diagnostics.md#gradient-analysis), gradient decomposition, per-bucket
metrics."""
import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ragen_jax.algos import losses
from ragen_jax.diagnostics import gradients
from ragen_jax.models import ModelConfig, init_params, transformer
from ragen_jax.algos.update_inputs import ActorHyper, UpdateBatch

CONFIG = ModelConfig(vocab_size=31, d_model=16, num_layers=2, num_heads=2, num_kv_heads=1, head_dim=8, mlp_dim=32,
                     max_seq_len=32)
GROUPS, GROUP_SIZE, LENGTH = 6, 3, 10
AGG, KL = "token-mean", "low_var_kl"
HYPER = ActorHyper(lr=jnp.float32(0.0), clip_ratio_low=jnp.float32(0.2), clip_ratio_high=jnp.float32(0.28),
                   clip_ratio_c=jnp.float32(3.0), entropy_coeff=jnp.float32(0.01), kl_loss_coef=jnp.float32(0.05),
                   temperature=jnp.float32(0.8))


def _logits_fn(params, tokens, positions, mask):
    return transformer.apply(CONFIG, params, tokens, positions, mask)


# ---------------------------------------------------------------- bucket assignment
def _reference_quantile(rv, valid, num_buckets):
    """RAGEN's split on the valid groups with the effective count min(num_buckets, #groups)."""
    ids = [g for g in sorted(np.flatnonzero(valid), key=lambda g: (rv[g], g))]
    n = len(ids)
    used = min(num_buckets, n)
    out = np.full(len(rv), -1)
    start = 0
    for b in range(used):
        size = n // used + (n % used if b == used - 1 else 0)
        out[ids[start:start + size]] = b
        start += size
    return out


_assign = jax.jit(gradients.assign_buckets, static_argnums=(2, 3))


def test_quantile_128_groups_gives_21_21_21_21_21_23():
    rv = np.random.default_rng(0).random(128).astype(np.float32)
    got = np.asarray(_assign(jnp.asarray(rv), jnp.ones(128, bool), "quantile", 6))
    assert np.bincount(got).tolist() == [21, 21, 21, 21, 21, 23]
    assert all(rv[got == b].max() <= rv[got == b + 1].min() for b in range(5))
    assert (got == _reference_quantile(rv, np.ones(128, bool), 6)).all()


@pytest.mark.parametrize("seed", range(5))
def test_quantile_matches_reference_with_ties_and_invalid_groups(seed):
    rng = np.random.default_rng(seed)
    rv = rng.integers(0, 4, 16).astype(np.float32) / 2  # many ties
    valid = rng.random(16) < [0.3, 0.6, 0.9, 1.0, 0.5][seed]
    got = np.asarray(_assign(jnp.asarray(rv), jnp.asarray(valid), "quantile", 6))
    assert (got == _reference_quantile(rv, valid, 6)).all()


def test_fixed_rv_intervals():
    rv = jnp.array([0.0, 0.99, 1.0, 2.5, 4.999, 5.0, 17.0, 3.0], jnp.float32)
    valid = jnp.array([True] * 7 + [False])
    assert np.asarray(_assign(rv, valid, "fixed_rv", 6)).tolist() == [0, 0, 1, 2, 4, 5, 5, -1]


def test_should_run_schedule():
    assert [s for s in range(0, 160) if bool(gradients.should_run(jnp.int32(s), 50))] == [1, 51, 101, 151]
    assert not any(bool(gradients.should_run(jnp.int32(s), 0)) for s in range(5))


# ---------------------------------------------------------------- gradients
@pytest.fixture(scope="module")
def setup():
    rng = np.random.default_rng(1)
    params = jax.jit(init_params, static_argnums=0)(CONFIG, jax.random.key(1))
    batch_size = GROUPS * GROUP_SIZE
    lengths = rng.integers(5, LENGTH + 1, batch_size)
    attention = np.arange(LENGTH)[None, :] < lengths[:, None]
    loss_mask = attention[:, 1:] & (np.arange(1, LENGTH)[None, :] >= 3)  # targets after a 3-token prompt
    rewards = rng.integers(0, 2, (GROUPS, GROUP_SIZE)).astype(np.float32) * 3
    rewards[0] = 1.0  # a zero-variance group
    group_rv = rewards.std(axis=1, ddof=1)
    adv = (rewards - rewards.mean(1, keepdims=True)).reshape(-1)  # Dr.GRPO-style: 0 for zero-variance groups
    row_valid = np.ones(batch_size, bool)
    row_valid[-GROUP_SIZE:] = False  # a filtered-out group
    tokens = jnp.asarray(np.where(attention, rng.integers(0, CONFIG.vocab_size, (batch_size, LENGTH)), 0), jnp.int32)
    zeros = jnp.zeros((batch_size, LENGTH - 1), jnp.float32)
    batch = UpdateBatch(
        tokens=tokens, positions=jnp.broadcast_to(jnp.arange(LENGTH, dtype=jnp.int32), tokens.shape),
        attention_mask=jnp.asarray(attention), loss_mask=jnp.asarray(loss_mask), old_logp=zeros,
        advantages=jnp.asarray(np.broadcast_to(adv[:, None], zeros.shape), jnp.float32), ref_logp=zeros,
        returns=zeros, old_values=zeros)
    extras = dict(row_valid=jnp.asarray(row_valid),
                  group_ids=jnp.asarray(np.repeat(np.arange(GROUPS), GROUP_SIZE), jnp.int32),
                  group_rv=jnp.asarray(group_rv, jnp.float32))
    (_, logp), _ = _total_value_and_grad(params, batch, extras["row_valid"].astype(jnp.float32), jnp.ones(3))
    noise = lambda scale: scale * jnp.asarray(rng.normal(size=logp.shape), jnp.float32)  # noqa: E731
    return params, batch._replace(old_logp=logp + noise(0.05), ref_logp=logp + noise(0.3)), extras


def _total_loss(params, batch, rows, weights):
    """(weighted actor loss, logp) written directly: plain log-softmax and entropy, then the objective's terms.

    weights f32[3] scale the (task, entropy, kl) terms, so one compiled gradient gives each component.
    """
    logits = _logits_fn(params, batch.tokens, batch.positions, batch.attention_mask)[:, :-1] / HYPER.temperature
    logsm = jax.nn.log_softmax(logits, axis=-1)
    logp = jnp.take_along_axis(logsm, batch.tokens[:, 1:, None], axis=-1)[..., 0]
    entropy = -jnp.sum(jnp.exp(logsm) * logsm, axis=-1)
    mask = batch.loss_mask * rows[:, None]
    task, _ = losses.policy_loss(logp, batch.old_logp, batch.advantages, mask, HYPER.clip_ratio_low,
                                 HYPER.clip_ratio_high, HYPER.clip_ratio_c, AGG)
    ent = -HYPER.entropy_coeff * losses.agg_loss(entropy, mask, AGG)
    kl = HYPER.kl_loss_coef * losses.agg_loss(losses.kl_penalty(logp, batch.ref_logp, KL), mask, AGG)
    return weights @ jnp.stack([task, ent, kl]), logp


_total_value_and_grad = jax.jit(jax.value_and_grad(_total_loss, has_aux=True))
# 2-row chunks: buckets of 3 rows span two chunks, the second one partly padded
_analysis = jax.jit(functools.partial(gradients.gradient_analysis, _logits_fn, agg_mode=AGG, use_kl_loss=True,
                                      kl_type=KL, chunk_rows=2))


def _norm(tree):
    return math.sqrt(sum(float(jnp.sum(jnp.square(x))) for x in jax.tree.leaves(tree)))


def test_bucket_metrics(setup):
    """Every bucket's component norms, their sum's norm, losses and RV statistics against direct gradients."""
    params, batch, extras = setup
    out = {k: float(v) for k, v in _analysis(params, batch, HYPER, **extras).items()}
    rv = np.asarray(extras["group_rv"])
    valid = np.arange(GROUPS) < GROUPS - 1  # the last group is filtered out
    bucket = _reference_quantile(rv, valid, 6)
    group_of_row = np.repeat(np.arange(GROUPS), GROUP_SIZE)
    assert out["grad_norm/all/sample_count"] == (GROUPS - 1) * GROUP_SIZE
    buckets = [("all", np.flatnonzero(valid))] + [(f"bucket_{b + 1}", np.flatnonzero(bucket == b)) for b in range(6)]
    for name, groups in buckets:
        key = f"grad_norm/{name}"
        if len(groups) == 0:  # 5 valid groups -> 5 buckets: bucket_6 stays empty
            assert name == "bucket_6" and out[f"{key}/sample_count"] == 0
            assert math.isnan(out[f"{key}/task"]) and math.isnan(out[f"{key}/reward_std_mean"])
            continue
        rows = jnp.asarray(np.isin(group_of_row, groups), jnp.float32)
        tokens = float(jnp.sum(batch.loss_mask * rows[:, None]))
        direct = {}
        for comp, weights in zip((*gradients.COMPONENTS, "total"), (*np.eye(3), np.ones(3))):
            (value, _), grad = _total_value_and_grad(params, batch, rows, jnp.asarray(weights, jnp.float32))
            direct[comp] = (float(value), _norm(grad))
        for comp in (*gradients.COMPONENTS, "total"):  # the total checks that the components sum to the gradient
            assert out[f"{key}/{comp}"] == pytest.approx(direct[comp][1], rel=1e-4, abs=1e-9), (name, comp)
        for comp in gradients.COMPONENTS:
            assert out[f"{key}/per_token/{comp}"] == pytest.approx(direct[comp][1] / tokens, rel=1e-4, abs=1e-9)
            assert out[f"{key}/per_sample/{comp}"] == pytest.approx(
                direct[comp][1] / (len(groups) * GROUP_SIZE), rel=1e-4, abs=1e-9)
        for comp, term in zip(gradients.COMPONENTS, ("policy", "entropy", "kl")):
            assert out[f"{key}/loss/{term}"] == pytest.approx(direct[comp][0], rel=1e-4, abs=1e-7)
        assert out[f"{key}/sample_count"] == len(groups) * GROUP_SIZE
        assert out[f"{key}/sample_pct"] == pytest.approx(len(groups) / (GROUPS - 1))
        assert out[f"{key}/group_rv_count"] == len(groups)
        assert out[f"{key}/reward_std_mean"] == pytest.approx(rv[groups].mean(), rel=1e-6)
        assert out[f"{key}/reward_std_min"] == pytest.approx(rv[groups].min(), rel=1e-6)
        assert out[f"{key}/reward_std_max"] == pytest.approx(rv[groups].max(), rel=1e-6)
    # the zero-variance group has zero advantages: no task gradient, but the regularisers still pull
    lowest = f"grad_norm/bucket_{bucket[0] + 1}"
    assert out[f"{lowest}/reward_std_max"] == 0.0 and out[f"{lowest}/task"] < 1e-7
    assert out[f"{lowest}/entropy"] > 0 and out[f"{lowest}/kl"] > 0
    assert out["grad_norm/all/task"] > 0
    _, reg_grad = _total_value_and_grad(params, batch, extras["row_valid"].astype(jnp.float32),
                                        jnp.array([0.0, 1, 1]))
    assert out["grad_norm/all/reg"] == pytest.approx(_norm(reg_grad), rel=1e-4)
    assert out["grad_norm/all/snr"] == pytest.approx(out["grad_norm/all/task"] / out["grad_norm/all/reg"], rel=1e-5)

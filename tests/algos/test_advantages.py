"""Advantage estimators against the worked examples of docs/rewards_and_objectives.md and loop references in numpy."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ragen_jax.algos.advantages import bi_level_gae, gae, grpo, kl_in_reward, masked_whiten

gae_jit = jax.jit(gae, static_argnames="whiten")
bi_level_jit = jax.jit(bi_level_gae, static_argnames="whiten")


def np_gae(r, v, m, gamma, lam):
    """The backward loop of docs/rewards_and_objectives.md#gae, row by row."""
    adv = np.zeros_like(r)
    for b in range(r.shape[0]):
        nextv = lastgae = 0.0
        for t in reversed(range(r.shape[1])):
            delta = r[b, t] + gamma * nextv - v[b, t]
            g = delta + gamma * lam * lastgae
            nextv = v[b, t] * m[b, t] + (1 - m[b, t]) * nextv
            lastgae = g * m[b, t] + (1 - m[b, t]) * lastgae
            adv[b, t] = lastgae
    return adv, adv + v


def np_whiten(x, m):
    sel = x[m > 0]
    return (x - sel.mean()) / np.sqrt(sel.var(ddof=1) + 1e-8) * m


def np_bi_level(r, v, m, gamma, lam, gamma_high):
    """RAGEN's loops (docs/rewards_and_objectives.md#bi-level-gae) with the end-of-row guard (bootstrap 0 after the last
    masked token)."""
    adv, ret, upd = np.zeros_like(r), np.zeros_like(r), r.copy()
    for b in range(r.shape[0]):
        eos = list(np.nonzero(r[b])[0])
        last = 0.0
        for i in reversed(range(len(eos))):
            nextv = v[b, eos[i + 1]] if i + 1 < len(eos) else 0.0
            last = upd[b, eos[i]] + gamma_high * nextv - v[b, eos[i]] + gamma_high * lam * last
            adv[b, eos[i]] = last
        for p in eos:
            ret[b, p] = upd[b, p] = adv[b, p] + v[b, p]
        valid = list(np.nonzero(m[b])[0])
        last = 0.0
        for i in reversed(range(len(valid))):
            pos = valid[i]
            if pos in eos:
                nextv, last = 0.0, 0.0
            else:
                nextv = v[b, valid[i + 1]] if i + 1 < len(valid) else 0.0
            last = upd[b, pos] + gamma * nextv - v[b, pos] + gamma * lam * last
            adv[b, pos] = last
            ret[b, pos] = last + v[b, pos]
    return adv, ret


def test_gae_worked_example_b2():
    r = jnp.array([[0, 0, 0, 0, 0, 1.0]])
    v = jnp.array([[0.1, 0.2, 0.3, 0.4, 0.5, 0.6]])
    m = jnp.array([[0, 1, 1, 0, 1, 1.0]])
    raw, returns = gae_jit(r, v, m, 1.0, 1.0, whiten=False)
    np.testing.assert_allclose(raw[0], [0.8, 0.8, 0.7, 0.5, 0.5, 0.4], atol=1e-6)
    np.testing.assert_allclose(returns[0], [0.9, 1, 1, 0.9, 1, 1], atol=1e-6)
    adv, returns_w = gae_jit(r, v, m, 1.0, 1.0, whiten=True)
    np.testing.assert_allclose(returns_w, returns)  # returns come from the raw advantages
    np.testing.assert_allclose(adv[0][np.array([1, 2, 4, 5])], [1.0954, 0.5477, -0.5477, -1.0954], atol=1e-4)


def test_gae_matches_loop_reference():
    rng = np.random.default_rng(0)
    r = rng.normal(size=(3, 9)).astype(np.float32)
    v = rng.normal(size=(3, 9)).astype(np.float32)
    m = (rng.random((3, 9)) < 0.6).astype(np.float32)
    for gamma, lam in [(1.0, 1.0), (0.9, 0.8), (0.99, 0.0)]:
        ref_adv, ref_ret = np_gae(r, v, m, gamma, lam)
        adv, ret = gae_jit(r, v, m, gamma, lam, whiten=False)
        np.testing.assert_allclose(adv, ref_adv, atol=1e-5)
        np.testing.assert_allclose(ret, ref_ret, atol=1e-5)
        adv_w, _ = gae_jit(r, v, m, gamma, lam, whiten=True)
        np.testing.assert_allclose(adv_w, np_whiten(ref_adv, m), atol=1e-4)


def test_whiten_degenerate_masks_are_finite():
    x = jnp.arange(4.0)
    np.testing.assert_array_equal(masked_whiten(x, jnp.zeros(4)), jnp.zeros(4))
    np.testing.assert_array_equal(masked_whiten(x, jnp.array([0, 1.0, 0, 0])), jnp.zeros(4))


def test_bi_level_gae_worked_example_b3():
    r = jnp.array([[0, 0, 0, 0, 1, 0, 0, 0, 0, 1.0]])
    v = jnp.arange(1, 11, dtype=jnp.float32)[None] / 10
    m = jnp.ones((1, 10))
    adv, ret = bi_level_jit(r, v, m, 1.0, 1.0, 0.95, whiten=False)
    np.testing.assert_allclose(adv[0], [1.85, 1.75, 1.65, 1.55, 1.45, 0.4, 0.3, 0.2, 0.1, 0.0], atol=1e-5)
    np.testing.assert_allclose(ret[0], [1.95] * 5 + [1.0] * 5, atol=1e-5)


def test_bi_level_gae_matches_loop_reference_and_guards_zero_reward():
    rng = np.random.default_rng(1)
    r = np.zeros((4, 12), np.float32)
    r[0, [3, 7, 11]] = [1.0, -0.5, 2.0]
    r[1, [5, 9]] = [0.3, 1.0]  # row 1: masked tokens after the last eos
    r[2, 11] = 1.0
    # row 3: zero total reward: RAGEN crashes, we bootstrap 0 at the end
    v = rng.normal(size=(4, 12)).astype(np.float32)
    m = (rng.random((4, 12)) < 0.7).astype(np.float32)
    m[0, [3, 11]] = 1.0
    m[0, 7] = 0.0  # an eos outside the loss mask keeps its high-level advantage
    for gamma, lam, gh in [(1.0, 1.0, 0.95), (0.9, 0.7, 0.8)]:
        ref_adv, ref_ret = np_bi_level(r, v, m, gamma, lam, gh)
        adv, ret = bi_level_jit(r, v, m, gamma, lam, gh, whiten=False)
        np.testing.assert_allclose(adv, ref_adv, atol=1e-5)
        np.testing.assert_allclose(ret, ref_ret, atol=1e-5)
        adv_w, _ = bi_level_jit(r, v, m, gamma, lam, gh, whiten=True)
        np.testing.assert_allclose(adv_w, np_whiten(ref_adv, m), atol=1e-4)
    assert np.isfinite(np.asarray(adv)).all()


def test_bi_level_equals_gae_with_only_a_final_reward():
    # docs/rewards_and_objectives.md#bi-level-gae: with the reward on the last token only it is plain GAE.
    rng = np.random.default_rng(2)
    r = np.zeros((2, 8), np.float32)
    r[:, -1] = [1.0, -2.0]
    v = rng.normal(size=(2, 8)).astype(np.float32)
    m = np.ones((2, 8), np.float32)
    m[:, :2] = 0
    a1, _ = bi_level_jit(r, v, m, 1.0, 1.0, 0.95)
    a2, _ = gae_jit(r, v, m, 1.0, 1.0)
    np.testing.assert_allclose(a1, a2, atol=1e-5)


def test_grpo_worked_example_b5():
    scores = jnp.array([10.5, -1.0, 10.7, -1.0])
    ids = jnp.zeros(4, jnp.int32)
    np.testing.assert_allclose(grpo(scores, ids, 1), [0.851, -0.866, 0.881, -0.866], atol=1e-3)
    np.testing.assert_allclose(grpo(scores, ids, 1, norm_by_std=False), [5.7, -5.8, 5.9, -5.8], atol=1e-5)


def test_grpo_groups_singletons_and_length_weight():
    scores = jnp.array([1.0, 0.0, 0.0, 1.0, 3.0, 5.0, 5.0])
    ids = jnp.array([0, 0, 0, 0, 1, 2, 2])
    adv = grpo(scores, ids, 4)
    std0 = np.std([1, 0, 0, 1], ddof=1)
    expected = [0.5 / (std0 + 1e-6), -0.5 / (std0 + 1e-6), -0.5 / (std0 + 1e-6), 0.5 / (std0 + 1e-6),
                3.0 / (1 + 1e-6), 0.0, 0.0]  # singleton: mean 0, std 1; zero-variance group: exactly 0
    np.testing.assert_allclose(adv, expected, rtol=1e-5)
    lengths = jnp.array([2.0, 4.0, 6.0, 8.0, 10.0, 1.0, 1.0])
    rows = jnp.array([1, 1, 1, 1, 1, 0, 0], bool)
    weighted = grpo(scores, ids, 4, lengths=lengths, row_mask=rows)
    np.testing.assert_allclose(weighted, np.asarray(adv) / ((np.asarray(lengths) + 1e-6) / 6.0), rtol=1e-5)


def test_kl_in_reward():
    rewards = jnp.array([[0.0, 0.0, 1.0], [0.0, 2.0, 0.0]])
    logp = jnp.array([[-1.0, -2.0, -0.5], [-1.0, -1.0, -1.0]])
    ref = jnp.array([[-1.5, -1.0, -0.5], [-2.0, -1.0, -3.0]])
    mask = jnp.array([[1.0, 1.0, 0.0], [0.0, 1.0, 1.0]])
    out, metrics = kl_in_reward(rewards, logp, ref, mask, 0.1, "k1")
    kl = np.array([[0.5, -1.0, 0.0], [0.0, 0.0, 2.0]])
    np.testing.assert_allclose(out, np.asarray(rewards) - 0.1 * kl, atol=1e-6)
    assert float(metrics["actor/reward_kl_penalty"]) == pytest.approx(((0.5 - 1.0) / 2 + 2.0 / 2) / 2)

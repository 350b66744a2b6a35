"""The update phase: skipped minibatches, optimizer semantics and losses against an optax + naive-JAX reference."""
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from ragen_jax.algos.scoring import token_logprobs
from ragen_jax.algos.update_inputs import ActorHyper, CriticHyper, UpdateBatch
from ragen_jax.train.update import UpdateConfig, actor_update, critic_update, optimizer_init, optimizer_step

VOCAB, WIDTH, ROWS, LENGTH = 11, 6, 16, 6
FORWARD_CALLS = []


def logits_fn(params, tokens, positions, attention_mask):
    """A tiny causal 'model': each position's logits depend on its own token and position only."""
    jax.debug.callback(lambda: FORWARD_CALLS.append(1))
    h = jnp.tanh(params["embed"][tokens] + 0.1 * positions[..., None] * attention_mask[..., None])
    return h @ params["out"]


def values_fn(params, tokens, positions, attention_mask):
    return (jnp.tanh(params["embed"][tokens]) @ params["head"])[..., 0]


def make_params(seed=0):
    rng = np.random.default_rng(seed)
    return {"embed": jnp.asarray(rng.normal(size=(VOCAB, WIDTH)), jnp.float32),
            "out": jnp.asarray(rng.normal(size=(WIDTH, VOCAB)), jnp.float32),
            "head": jnp.asarray(rng.normal(size=(WIDTH, 1)), jnp.float32)}


def make_batch(seed=1, rows=ROWS):
    rng = np.random.default_rng(seed)
    t = LENGTH - 1
    f32 = lambda x: jnp.asarray(x, jnp.float32)
    loss_mask = (rng.random((rows, t)) < 0.7).astype(np.float32)
    loss_mask[:, -1] = 1
    return UpdateBatch(
        tokens=jnp.asarray(rng.integers(0, VOCAB, (rows, LENGTH)), jnp.int32),
        positions=jnp.broadcast_to(jnp.arange(LENGTH, dtype=jnp.int32), (rows, LENGTH)),
        attention_mask=jnp.ones((rows, LENGTH), bool),
        loss_mask=f32(loss_mask),
        old_logp=f32(rng.normal(-2.4, 0.5, (rows, t))),
        advantages=f32(rng.normal(size=(rows, t))),
        ref_logp=f32(rng.normal(-2.4, 0.5, (rows, t))),
        returns=f32(rng.normal(size=(rows, t))),
        old_values=f32(rng.normal(size=(rows, t))),
    )


HYPER = ActorHyper(*(jnp.float32(v) for v in (1e-2, 0.2, 0.28, 3.0, 0.01, 0.05, 0.9)))
actor_jit = jax.jit(actor_update, static_argnums=(0, 6))
critic_jit = jax.jit(critic_update, static_argnums=(0, 6))


def tree_equal(a, b):
    return all(jax.tree.leaves(jax.tree.map(lambda x, y: bool(jnp.array_equal(x, y)), a, b)))


def tree_close(a, b, **kw):
    jax.tree.map(lambda x, y: np.testing.assert_allclose(x, y, **kw), a, b)


SKIP_CONFIG = UpdateConfig(epochs=2, minibatch_size=4, micro_batch_size=2, use_kl_loss=True, kl_loss_type="k3")


def test_skipping_dropped_minibatches_equals_training_on_the_kept_rows_only():
    params, batch = make_params(), make_batch()
    opt = optimizer_init(params, SKIP_CONFIG)
    FORWARD_CALLS.clear()
    full = actor_jit(logits_fn, params, opt, batch, 6, HYPER, SKIP_CONFIG)
    jax.block_until_ready(full)
    # 2 epochs x (minibatch 0: two micro-batches, minibatch 1: rows 4-5 only), minibatches 2-3 skipped
    assert len(FORWARD_CALLS) == 2 * (2 + 1)
    FORWARD_CALLS.clear()
    head = jax.tree.map(lambda x: x[:8], batch)
    kept_only = actor_jit(logits_fn, params, opt, head, 6, HYPER, SKIP_CONFIG)
    jax.block_until_ready(kept_only)
    assert len(FORWARD_CALLS) == 6
    tree_close(full[0], kept_only[0], rtol=1e-6, atol=1e-7)
    tree_close(full[1], kept_only[1], rtol=1e-6, atol=1e-7)
    tree_close(full[2], kept_only[2], rtol=1e-6, atol=1e-7)
    assert float(full[2]["actor/num_updates"]) == 4.0
    assert not tree_equal(full[0], params)
    # rows beyond kept_rows have no influence at all
    scrambled = batch._replace(advantages=batch.advantages.at[6:].set(1e3), old_logp=batch.old_logp.at[6:].set(0.0))
    tree_close(actor_jit(logits_fn, params, opt, scrambled, 6, HYPER, SKIP_CONFIG)[0], full[0], rtol=1e-6, atol=1e-7)


def test_fully_dropped_batch_leaves_params_and_optimizer_unchanged():
    params, batch = make_params(), make_batch()
    opt = optimizer_init(params, SKIP_CONFIG)
    FORWARD_CALLS.clear()
    new_params, new_opt, metrics = actor_jit(logits_fn, params, opt, batch, 0, HYPER, SKIP_CONFIG)
    jax.block_until_ready(new_params)
    assert FORWARD_CALLS == []
    assert tree_equal(new_params, params) and tree_equal(new_opt, opt)
    assert float(metrics["actor/num_updates"]) == 0.0 and float(metrics["actor/pg_loss"]) == 0.0


def naive_actor_loss(params, batch, hyper, mode):
    """docs/rewards_and_objectives.md#policy-loss written out with log_softmax (no streaming, no custom gradient)."""
    logits = logits_fn(params, batch.tokens[:, :-1], batch.positions[:, :-1], batch.attention_mask[:, :-1])
    logsm = jax.nn.log_softmax(logits / hyper.temperature, -1)
    logp = jnp.take_along_axis(logsm, batch.tokens[:, 1:, None], -1)[..., 0]
    entropy = -(jnp.exp(logsm) * logsm).sum(-1)
    m, a = batch.loss_mask, batch.advantages
    ratio = jnp.exp(jnp.clip(logp - batch.old_logp, -20, 20))
    clipped = jnp.maximum(-a * ratio, -a * jnp.clip(ratio, 1 - hyper.clip_ratio_low, 1 + hyper.clip_ratio_high))
    pg = jnp.where(a < 0, jnp.minimum(-a * hyper.clip_ratio_c, clipped), clipped)
    u = jnp.clip(batch.ref_logp - logp, -20, 20)
    kl = jnp.clip(jnp.exp(u) - u - 1, -10, 10)
    seq_mean = lambda x: ((x * m).sum(-1) / m.sum(-1)).mean()  # seq-mean-token-mean, every row has tokens
    return seq_mean(pg) - hyper.entropy_coeff * seq_mean(entropy) + hyper.kl_loss_coef * seq_mean(kl)


ONE_STEP_CONFIG = UpdateConfig(minibatch_size=8, micro_batch_size=4, loss_agg_mode="seq-mean-token-mean",
                               use_kl_loss=True, kl_loss_type="low-var-kl", weight_decay=0.1, grad_clip=100.0)


def test_one_minibatch_matches_optax_adamw_on_the_naive_loss():
    config = ONE_STEP_CONFIG
    params, batch = make_params(), make_batch(rows=8)
    new_params, _, metrics = actor_jit(logits_fn, params, optimizer_init(params, config), batch, 8, HYPER, config)
    halves = [jax.tree.map(lambda x, i=i: x[4 * i:4 * i + 4], batch) for i in range(2)]
    ref_loss = lambda p: sum(naive_actor_loss(p, h, HYPER, "seq-mean-token-mean") for h in halves) / 2
    grads = jax.jit(jax.grad(ref_loss))(params)
    tx = optax.adamw(float(HYPER.lr), b1=0.9, b2=0.999, eps=1e-8, weight_decay=0.1)
    updates, _ = tx.update(grads, tx.init(params), params)
    tree_close(new_params, optax.apply_updates(params, updates), rtol=1e-5, atol=1e-6)
    assert float(metrics["actor/grad_norm"]) == pytest.approx(float(optax.tree.norm(grads)), rel=1e-5)
    assert float(metrics["actor/pg_clipfrac"]) > 0 and float(metrics["actor/kl_loss"]) > 0


def test_ratio_is_one_when_old_logprobs_come_from_the_same_params():
    config = ONE_STEP_CONFIG
    params, batch = make_params(), make_batch(rows=8)
    old_logp, _ = jax.jit(token_logprobs, static_argnums=0)(logits_fn, params, batch.tokens, batch.positions,
                                                            batch.attention_mask, HYPER.temperature)
    _, _, metrics = actor_jit(logits_fn, params, optimizer_init(params, config), batch._replace(old_logp=old_logp),
                              8, HYPER, config)
    # equal up to float32 rounding (the forward is fused differently with and without the backward pass)
    assert abs(float(metrics["actor/ppo_kl"])) < 1e-6 and float(metrics["actor/pg_clipfrac"]) == 0.0


def test_optimizer_clips_like_torch_and_skips_nonfinite_gradients():
    config = UpdateConfig(grad_clip=0.5, weight_decay=0.0)
    params = {"w": jnp.array([1.0, -2.0])}
    state = optimizer_init(params, config)
    grads = {"w": jnp.array([3.0, 4.0])}  # norm 5 -> scaled by 0.5 / (5 + 1e-6)
    new_params, new_state, norm, applied = optimizer_step(params, state, grads, 0.1, config)
    assert float(norm) == pytest.approx(5.0) and bool(applied)
    np.testing.assert_allclose(new_state[0].mu["w"], 0.1 * np.array([3.0, 4.0]) * 0.5 / (5 + 1e-6), rtol=1e-6)
    np.testing.assert_allclose(new_params["w"], [1.0 - 0.1, -2.0 - 0.1], rtol=1e-5)  # Adam step 1: lr * sign
    bad = {"w": jnp.array([jnp.nan, 1.0])}
    same_params, same_state, norm, applied = optimizer_step(params, state, bad, 0.1, config)
    assert not bool(applied) and tree_equal(same_params, params) and tree_equal(same_state, state)


def test_nonfinite_minibatch_is_skipped_inside_the_update():
    config = ONE_STEP_CONFIG
    params, batch = make_params(), make_batch(rows=8)
    batch = batch._replace(advantages=batch.advantages.at[0, -1].set(jnp.nan))
    new_params, _, metrics = actor_jit(logits_fn, params, optimizer_init(params, config), batch, 8, HYPER, config)
    assert tree_equal(new_params, params)
    assert float(metrics["actor/nonfinite_skips"]) == 1.0 and float(metrics["actor/num_updates"]) == 1.0


def test_critic_update_matches_optax_on_the_clipped_value_loss():
    config = UpdateConfig(minibatch_size=8, weight_decay=0.01, grad_clip=100.0)
    hyper = CriticHyper(jnp.float32(1e-2), jnp.float32(0.5))
    params, batch = make_params(), make_batch(rows=16)
    new_params, _, metrics = critic_jit(values_fn, params, optimizer_init(params, config), batch, 8, hyper, config)

    def ref_loss(p):
        v = values_fn(p, batch.tokens[:8, :-1], None, None)
        old, ret, m = batch.old_values[:8], batch.returns[:8], batch.loss_mask[:8]
        loss = jnp.maximum((v - ret) ** 2, (jnp.clip(v, old - 0.5, old + 0.5) - ret) ** 2)
        return 0.5 * (loss * m).sum() / m.sum()

    tx = optax.adamw(1e-2, weight_decay=0.01)
    updates, _ = tx.update(jax.jit(jax.grad(ref_loss))(params), tx.init(params), params)
    tree_close(new_params, optax.apply_updates(params, updates), rtol=1e-5, atol=1e-6)
    assert float(metrics["critic/num_updates"]) == 1.0
    assert float(metrics["critic/vf_loss"]) == pytest.approx(float(ref_loss(params)), rel=1e-5)


def test_config_errors_and_from_config():
    from configs.base import get_config

    base = get_config()
    config = UpdateConfig.from_config(base)
    assert (config.minibatch_size, config.epochs, config.loss_agg_mode, config.grad_clip) == (32, 1, "token-mean", 1.0)
    assert config.micro == 32
    base.algo.ppo_micro_batch_size = 8
    assert UpdateConfig.from_config(base).micro == 8
    with pytest.raises(ValueError, match="micro"):
        UpdateConfig(minibatch_size=4, micro_batch_size=3)
    with pytest.raises(ValueError, match="minibatch_size"):
        params, batch = make_params(), make_batch(rows=6)
        actor_update(logits_fn, params, optimizer_init(params, SKIP_CONFIG), batch, 6, HYPER, SKIP_CONFIG)

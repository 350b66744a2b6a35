"""Prefix scoring (`update.scored_prefix`): a batch padded far past its longest row is scored over a short prefix
tier, and gives what the same rows give without the padding (the independent reference: no trimming can happen at
that length), in log-probs, values and a whole actor update."""
import jax
import jax.numpy as jnp
import numpy as np

from ragen_jax.models.config import ModelConfig
from ragen_jax.models.transformer import DecoderLM
from ragen_jax.train import update

MODEL = DecoderLM(ModelConfig(vocab_size=40, d_model=16, num_layers=2, num_heads=2, num_kv_heads=1, head_dim=8,
                              mlp_dim=32, max_seq_len=512))
ROWS, SHORT, LONG = 8, 100, 400  # rows of up to SHORT tokens right-padded to LONG (tiers 128, 256, 399)


def padded_batch(length: int, seed: int = 0) -> update.UpdateBatch:
    rng = np.random.default_rng(seed)
    lengths = rng.integers(SHORT // 2, SHORT + 1, ROWS)
    lengths[0] = SHORT
    positions = np.broadcast_to(np.arange(length), (ROWS, length))
    real = positions < lengths[:, None]
    tokens = np.where(real, rng.integers(0, 40, (ROWS, LONG))[:, :length], 0)
    loss_mask = (real[:, 1:] & (positions[:, 1:] > 20)).astype(np.float32)
    noise = lambda: rng.normal(size=(ROWS, LONG - 1))[:, :length - 1].astype(np.float32)  # noqa: E731
    return update.UpdateBatch(tokens=jnp.asarray(tokens, jnp.int32), positions=jnp.asarray(positions, jnp.int32),
                              attention_mask=jnp.asarray(real), loss_mask=jnp.asarray(loss_mask),
                              old_logp=jnp.asarray(noise() - 3.0) * loss_mask, advantages=jnp.asarray(noise()),
                              ref_logp=jnp.asarray(noise() - 3.0) * loss_mask, returns=jnp.asarray(noise()),
                              old_values=jnp.asarray(noise()))


def test_the_prefix_tier_is_the_smallest_that_holds_every_real_target():
    batch = padded_batch(LONG)
    assert update.prefix_widths(batch.tokens) == (128, 256, 399)
    assert int(update.needed_width(batch.attention_mask)) == SHORT - 1
    assert int(update.needed_width(jnp.zeros((2, 9), bool))) == -1


def test_padded_rows_score_as_the_unpadded_rows_and_zero_after_them():
    params = MODEL.init_params(jax.random.key(0))
    long, short = padded_batch(LONG), padded_batch(SHORT)
    score = jax.jit(lambda b: update.token_logprobs(MODEL, params, b.tokens, b.positions, b.attention_mask, 1.0))
    (logp, entropy), (ref_logp, ref_entropy) = score(long), score(short)
    np.testing.assert_allclose(logp[:, :SHORT - 1], ref_logp, rtol=2e-5, atol=2e-6)
    np.testing.assert_allclose(entropy[:, :SHORT - 1], ref_entropy, rtol=2e-5, atol=2e-6)
    assert not np.any(np.asarray(logp[:, 128:])) and not np.any(np.asarray(entropy[:, 128:]))
    critic = MODEL.init_value_params(jax.random.key(1), params)
    critic["value_head"]["kernel"] = jnp.ones_like(critic["value_head"]["kernel"])
    values = jax.jit(lambda b: update.token_values(MODEL.values, critic, b.tokens, b.positions, b.attention_mask))
    np.testing.assert_allclose(values(long)[:, :SHORT - 1], values(short), rtol=2e-5, atol=2e-6)


def test_an_actor_update_on_padded_rows_equals_the_update_on_the_unpadded_rows():
    params = MODEL.init_params(jax.random.key(0))
    config = update.UpdateConfig(minibatch_size=4, micro_batch_size=2, use_kl_loss=True, kl_loss_type="low_var_kl")
    hyper = update.ActorHyper(*(jnp.float32(v) for v in (1e-2, 0.2, 0.28, 3.0, 0.01, 0.1, 1.0)))
    run = jax.jit(lambda b: update.actor_update(MODEL, params, update.optimizer_init(params, config), b, 6, hyper,
                                                config))
    (long_params, _, long_metrics), (short_params, _, short_metrics) = run(padded_batch(LONG)), run(padded_batch(SHORT))
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6), long_params, short_params)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6), long_metrics, short_metrics)
    assert float(long_metrics["actor/num_updates"]) == 2.0

"""Token-chunked scoring (`losses.hidden_logprobs_and_entropy`, `scoring.token_logprobs` with a
`models.lm.CausalLM`): values and gradients equal a plain log-softmax over the whole logits computed in the
test, and the compiled backward pass holds no [B, T, V] float32 array."""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ragen_jax.algos import losses
from ragen_jax.algos import scoring, update_inputs
from ragen_jax.models import transformer
from ragen_jax.models.config import ModelConfig
from ragen_jax.train import update

ROWS, LENGTH, WIDTH, VOCAB = 3, 11, 8, 37
TEMPERATURE = 0.7


def reference(logits, targets, temperature):
    """(logp, entropy) of softmax(logits / temperature) the plain way: the whole log-softmax at once."""
    logp = jax.nn.log_softmax(logits.astype(jnp.float32) / temperature)
    target_logp = jnp.take_along_axis(logp, targets[..., None], -1)[..., 0]
    return target_logp, -(jnp.exp(logp) * logp).sum(-1)


def objective(logp, entropy):
    """A scalar mixing both outputs with position-dependent weights, so every cotangent is exercised."""
    weights = jnp.linspace(-1.0, 2.0, logp.size).reshape(logp.shape)
    return (weights * logp).sum() + 0.3 * (weights[::-1] * entropy).sum()


def with_gradient(score, argnums=0):
    """Jitted args -> ((objective, (logp, entropy)), d objective / d args[argnums]): one compile for both."""
    def loss(*args):
        outputs = score(*args)
        return objective(*outputs), outputs

    return jax.jit(jax.value_and_grad(loss, argnums, has_aux=True))


def head_inputs(seed=0):
    rng = np.random.default_rng(seed)
    hidden = jnp.asarray(rng.normal(size=(ROWS, LENGTH, WIDTH)), jnp.float32)
    kernel = jnp.asarray(rng.normal(size=(WIDTH, VOCAB)), jnp.float32)
    targets = jnp.asarray(rng.integers(0, VOCAB, (ROWS, LENGTH)), jnp.int32)
    return hidden, kernel, targets


@pytest.mark.parametrize("logits_chunk,vocab_chunk", [(1, 8), (2 * ROWS * VOCAB + 5, 37), (4 * ROWS * VOCAB, 5),
                                                       (10 ** 6, 64)])
def test_chunked_head_matches_whole_logits(logits_chunk, vocab_chunk):
    """Blocks of 1, 2 (padded: 11 positions), 4 (padded) and all positions; vocab chunks with a remainder."""
    hidden, kernel, targets = head_inputs()

    def chunked(h, w):
        return losses.hidden_logprobs_and_entropy(lambda x: x @ w, h, targets, TEMPERATURE, logits_chunk, vocab_chunk)

    def plain(h, w):
        return reference(h @ w, targets, TEMPERATURE)

    (_, outputs), grads = with_gradient(chunked, (0, 1))(hidden, kernel)
    (_, want_outputs), want_grads = with_gradient(plain, (0, 1))(hidden, kernel)
    for got, want in zip(outputs, want_outputs):
        assert got.shape == (ROWS, LENGTH)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    for got, want in zip(grads, want_grads):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_empty_sequence_scores_nothing():
    hidden, kernel, targets = head_inputs()
    outputs = losses.hidden_logprobs_and_entropy(lambda x: x @ kernel, hidden[:, :0], targets[:, :0])
    assert [x.shape for x in outputs] == [(ROWS, 0), (ROWS, 0)]


def test_rejects_empty_chunks():
    hidden, kernel, targets = head_inputs()
    with pytest.raises(ValueError, match="logits_chunk"):
        losses.hidden_logprobs_and_entropy(lambda x: x @ kernel, hidden, targets, 1.0, 0)
    with pytest.raises(ValueError, match="logits_chunk"):
        update.UpdateConfig(logits_chunk=0)


CONFIGS = {tied: ModelConfig(vocab_size=VOCAB, d_model=16, num_layers=1, num_heads=2, num_kv_heads=1, head_dim=8,
                             mlp_dim=32, max_seq_len=32, qkv_bias=True, tie_embeddings=tied)
           for tied in (True, False)}


def model_batch(seed=1):
    rng = np.random.default_rng(seed)
    tokens = jnp.asarray(rng.integers(0, VOCAB, (ROWS, LENGTH + 1)), jnp.int32)
    lengths = np.array([LENGTH + 1, 7, 4])
    attention = jnp.asarray(np.arange(LENGTH + 1)[None, :] < lengths[:, None])
    return tokens, transformer.default_positions(tokens, attention), attention


@pytest.mark.parametrize("tied", [True, False])
def test_causal_lm_scoring_matches_plain_log_softmax(tied):
    """`token_logprobs(CausalLM)` (blocks of 5 x V logits: 1 position of 3 rows) against the whole model's logits
    through `jax.nn.log_softmax`, values and gradients w.r.t. every parameter (tied and untied LM heads)."""
    config = CONFIGS[tied]
    params = transformer.init_params(config, jax.random.key(0))
    params = jax.tree.map(lambda x: x + 0.05 * jax.random.normal(jax.random.key(1), x.shape), params)  # nonzero biases
    tokens, positions, attention = model_batch()

    def chunked(p):
        return scoring.token_logprobs(transformer.DecoderLM(config), p, tokens, positions, attention, TEMPERATURE,
                                     vocab_chunk=16, logits_chunk=5 * VOCAB)

    def plain(p):
        logits = transformer.apply(config, p, tokens[:, :-1], positions[:, :-1], attention[:, :-1])
        return reference(logits, tokens[:, 1:], TEMPERATURE)

    (_, outputs), grads = with_gradient(chunked)(params)
    (_, want_outputs), want_grads = with_gradient(plain)(params)
    for got, want in zip(outputs, want_outputs):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    assert jax.tree.structure(grads) == jax.tree.structure(want_grads)
    jax.tree.map(lambda g, w: np.testing.assert_allclose(g, w, rtol=1e-4, atol=2e-6), grads, want_grads)


def test_actor_update_with_causal_lm_equals_logits_function():
    """The whole minibatch loop (logits_chunk from UpdateConfig) trains the same parameters through either scorer."""
    config = CONFIGS[False]
    params = transformer.init_params(config, jax.random.key(2))
    tokens, positions, attention = model_batch(3)
    rng = np.random.default_rng(4)
    shape = (ROWS, LENGTH)
    f32 = lambda x: jnp.asarray(x, jnp.float32)  # noqa: E731
    batch = update_inputs.UpdateBatch(tokens, positions, attention, loss_mask=f32(attention[:, 1:]),
                               old_logp=f32(rng.normal(-3.5, 0.3, shape)), advantages=f32(rng.normal(size=shape)),
                               ref_logp=f32(rng.normal(-3.5, 0.3, shape)), returns=f32(np.zeros(shape)),
                               old_values=f32(np.zeros(shape)))
    hyper = update_inputs.ActorHyper(*(jnp.float32(v) for v in (1e-2, 0.2, 0.28, 3.0, 0.01, 0.05, TEMPERATURE)))
    upd = update.UpdateConfig(epochs=1, minibatch_size=ROWS, use_kl_loss=True, kl_loss_type="k3",
                              logits_chunk=4 * VOCAB)
    run = jax.jit(update.actor_update, static_argnums=(0, 6))
    opt = update.optimizer_init(params, upd)
    got = run(transformer.DecoderLM(config), params, opt, batch, ROWS, hyper, upd)
    want = run(functools.partial(transformer.apply, config), params, opt, batch, ROWS, hyper, upd)
    jax.tree.map(lambda g, w: np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-6), got[0], want[0])
    for name in ("actor/pg_loss", "actor/entropy_loss", "actor/kl_loss", "actor/grad_norm"):
        np.testing.assert_allclose(got[2][name], want[2][name], rtol=1e-4, err_msg=name)


def test_backward_pass_holds_no_full_logits():
    """XLA's buffer assignment of the jitted gradient: the plain path needs several [B, T, V] float32 buffers,
    the chunked one less than half of one (B = 4 rows, T = 64 positions, V = 4096; blocks of 16 x V logits: 4
    positions of 4 rows)."""
    rows, length, vocab = 4, 64, 4096
    hidden = jnp.zeros((rows, length, WIDTH), jnp.float32)
    kernel = jnp.zeros((WIDTH, vocab), jnp.float32)
    targets = jnp.zeros((rows, length), jnp.int32)
    full = rows * length * vocab * 4

    def temp_bytes(score):
        loss = lambda h, w: objective(*score(h, w))  # noqa: E731
        return jax.jit(jax.grad(loss, (0, 1))).lower(hidden, kernel).compile().memory_analysis().temp_size_in_bytes

    plain = temp_bytes(lambda h, w: reference(h @ w, targets, 1.0))
    chunked = temp_bytes(lambda h, w: losses.hidden_logprobs_and_entropy(lambda x: x @ w, h, targets, 1.0, 16 * vocab))
    assert plain >= 2 * full  # the measure sees the whole logits and their cotangent
    assert chunked < full / 2

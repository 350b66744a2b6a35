"""Sampler: softmax statistics, top-k/top-p truncation, stop sequences, log-probs, multi-turn cache reuse."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

from ragen_jax import models
from ragen_jax.models import transformer as tfm
from ragen_jax.rollout import sampler

CONFIG = models.ModelConfig(vocab_size=24, d_model=32, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=8,
                            mlp_dim=64, qkv_bias=True, max_seq_len=64)
MODEL = models.DecoderLM(CONFIG)
B, T, N = 4, 6, 8  # rows, prompt chunk width, max new tokens: one compiled shape for most tests
PROMPT_LENGTHS = np.array([6, 3, 1, 4], np.int32)
NUM_DRAWS = 20000
# Every generate call below shares one compiled shape: the same stop-array shape (ids >= vocab never occur)
# and an explicit `active` mask.
NO_STOP = sampler.stop_sequence_array([[CONFIG.vocab_size], [CONFIG.vocab_size, CONFIG.vocab_size]])


@pytest.fixture(scope="module")
def params():
    p = jax.jit(tfm.init_params, static_argnums=0)(CONFIG, jax.random.key(0))
    p["embed"]["embedding"] = p["embed"]["embedding"] * 50.0  # peaked, varied next-token distributions
    return p


def _prompt(seed):
    tokens = np.random.default_rng(seed).integers(0, CONFIG.vocab_size, size=(B, T)).astype(np.int32)
    return np.where(np.arange(T)[None] < PROMPT_LENGTHS[:, None], tokens, 0)


def _generate(params, prompt, key, temperature=1.0, stop=NO_STOP, cache=None, active=(True,) * B):
    cache = models.init_cache(CONFIG, B, 40) if cache is None else cache
    return sampler.generate(MODEL, params, cache, jnp.asarray(prompt), jnp.asarray(PROMPT_LENGTHS), key,
                            jnp.float32(temperature), jnp.float32(1.0), jnp.asarray(stop), jnp.asarray(active),
                            max_new_tokens=N)


@jax.jit
def _draw(logits, key, temperature, top_p):
    """NUM_DRAWS independent samples from one logits row."""
    return sampler.sample_tokens(jnp.broadcast_to(logits, (NUM_DRAWS, logits.shape[0])), key, temperature, top_p)


_draw_top3 = jax.jit(lambda logits, key, top_p: sampler.sample_tokens(
    jnp.broadcast_to(logits, (NUM_DRAWS, logits.shape[0])), key, jnp.float32(1.0), top_p, top_k=3))

LOGITS = jnp.asarray(np.random.default_rng(0).normal(size=12) * 1.5, jnp.float32)


def _check_distribution(tokens, logprobs, probs):
    """Chi-square goodness of fit on the support, nothing outside it, log-probs equal log of the target."""
    probs = np.asarray(probs, np.float64)
    counts = np.bincount(np.asarray(tokens), minlength=len(probs))
    support = probs > 0
    assert counts[~support].sum() == 0, f"excluded tokens emitted: {np.nonzero(counts * ~support)[0]}"
    assert stats.chisquare(counts[support], NUM_DRAWS * probs[support] / probs[support].sum()).pvalue > 1e-3
    np.testing.assert_allclose(np.asarray(logprobs), np.log(probs[np.asarray(tokens)]), atol=1e-5)


@pytest.mark.parametrize("temperature", [1.0, 0.6])
def test_sampling_follows_softmax(temperature):
    tokens, logprobs = _draw(LOGITS, jax.random.key(1), jnp.float32(temperature), jnp.float32(1.0))
    _check_distribution(tokens, logprobs, jax.nn.softmax(LOGITS / temperature))


def _nucleus(probs, top_p):
    """numpy reference: the smallest most-likely set with mass >= top_p, renormalised."""
    order = np.argsort(-probs)
    keep = order[:np.searchsorted(np.cumsum(probs[order]), top_p) + 1]
    out = np.zeros_like(probs)
    out[keep] = probs[keep]
    return out / out.sum()


def test_top_p_and_top_k_never_emit_excluded_tokens():
    probs = np.asarray(jax.nn.softmax(LOGITS), np.float64)
    tokens, logprobs = _draw(LOGITS, jax.random.key(2), jnp.float32(1.0), jnp.float32(0.7))
    expected = _nucleus(probs, 0.7)
    assert 1 < (expected > 0).sum() < len(probs)
    _check_distribution(tokens, logprobs, expected)
    top3 = np.where(probs >= np.sort(probs)[-3], probs, 0.0)
    tokens, logprobs = _draw_top3(LOGITS, jax.random.key(3), jnp.float32(1.0))
    _check_distribution(tokens, logprobs, top3 / top3.sum())
    tokens, logprobs = _draw_top3(LOGITS, jax.random.key(4), jnp.float32(0.6))  # top-k, then top-p on the rest
    _check_distribution(tokens, logprobs, _nucleus(top3 / top3.sum(), 0.6))


def test_greedy_rows_take_the_argmax():
    logits = jax.random.normal(jax.random.key(5), (6, 12))
    temperature = jnp.array([0.0, 1.0, 0.0, 1.0, 0.0, 0.0])
    tokens, logprobs = jax.jit(sampler.sample_tokens)(logits, jax.random.key(6), temperature, jnp.float32(1.0))
    greedy = np.asarray(temperature) == 0
    np.testing.assert_array_equal(np.asarray(tokens)[greedy], np.argmax(logits, -1)[greedy])
    np.testing.assert_array_equal(np.asarray(logprobs)[greedy], 0.0)
    assert np.all(np.asarray(logprobs)[~greedy] < 0)


@jax.jit
def _next_token_logprobs(params, tokens, mask, temperature):
    logp = jax.nn.log_softmax(tfm.apply(CONFIG, params, tokens, None, mask) / temperature)
    return jnp.take_along_axis(logp[:, :-1], tokens[:, 1:, None], -1)[..., 0]


def _recomputed_logprobs(params, rows, temperature):
    """Uncached log-softmax(logits / temperature) of every next token of each row (right-padded to 40)."""
    tokens = np.zeros((len(rows), 40), np.int32)
    mask = np.zeros_like(tokens)
    for b, r in enumerate(rows):
        tokens[b, :len(r)], mask[b, :len(r)] = r, 1
    return np.asarray(_next_token_logprobs(params, tokens, mask, jnp.float32(temperature)))


def test_first_argmax_takes_the_first_of_tied_maxima_like_numpy():
    x = np.array([[1.0, 3.0, 3.0, 0.0], [-np.inf, -np.inf, -np.inf, -np.inf], [0.5, -1.0, 0.5, 0.5],
                  [2.0, 1.0, 0.0, 2.0]], np.float32)
    x = np.concatenate([x, np.random.default_rng(1).normal(size=(64, 4)).astype(np.float32)])
    np.testing.assert_array_equal(np.asarray(sampler.first_argmax(jnp.asarray(x))), np.argmax(x, axis=-1))


def test_sampled_tokens_are_jax_categorical_draws_with_the_same_key():
    logits = jax.random.normal(jax.random.key(7), (32, 12)) * 2.0
    key = jax.random.key(8)
    tokens, _ = jax.jit(sampler.sample_tokens)(logits, key, jnp.float32(0.7), jnp.float32(1.0))
    expected = jax.random.categorical(key, jax.nn.log_softmax(logits / 0.7, axis=-1), axis=-1)
    np.testing.assert_array_equal(np.asarray(tokens), np.asarray(expected))


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_logprobs_equal_recomputed_log_softmax(params, temperature):
    prompt = _prompt(1)
    out, cache = _generate(params, prompt, jax.random.key(7), temperature)
    np.testing.assert_array_equal(out.lengths, N)
    np.testing.assert_array_equal(cache.lengths, PROMPT_LENGTHS + N)
    rows = [np.concatenate([prompt[b, :PROMPT_LENGTHS[b]], out.tokens[b]]) for b in range(B)]
    recomputed = _recomputed_logprobs(params, rows, temperature)
    for b in range(B):
        n = PROMPT_LENGTHS[b]
        np.testing.assert_allclose(out.logprobs[b], recomputed[b, n - 1:n - 1 + N], atol=1e-4)
    assert len(np.unique(np.asarray(out.tokens))) > 3  # really sampling, not one repeated token


def _first_stop(row, stops):
    """numpy reference: tokens up to and including the first completed stop sequence (or all of them)."""
    for end in range(1, len(row) + 1):
        if any(end >= len(s) and list(row[end - len(s):end]) == list(s) for s in stops):
            return end, True
    return len(row), False


def test_stop_sequences_end_rows_independently(params):
    prompt, key = _prompt(2), jax.random.key(8)
    free, _ = _generate(params, prompt, key)  # same key => identical tokens up to each row's stop
    free_tokens = np.asarray(free.tokens)
    stops = [list(free_tokens[0, 2:4]), [int(free_tokens[1, 4])]]  # a 2-token and a 1-token stop sequence
    out, cache = _generate(params, prompt, key, stop=sampler.stop_sequence_array(stops))
    expected = [_first_stop(free_tokens[b], stops) for b in range(B)]
    np.testing.assert_array_equal(out.lengths, [e[0] for e in expected])
    np.testing.assert_array_equal(out.stopped, [e[1] for e in expected])
    assert out.stopped[0] and out.stopped[1] and out.lengths[0] <= 4 and out.lengths[1] <= 5
    assert len(set(np.asarray(out.lengths).tolist())) > 1
    np.testing.assert_array_equal(cache.lengths, PROMPT_LENGTHS + out.lengths)
    for b, (n, _) in enumerate(expected):
        np.testing.assert_array_equal(out.tokens[b, :n], free_tokens[b, :n])
        np.testing.assert_array_equal(out.tokens[b, n:], 0)
        np.testing.assert_array_equal(out.logprobs[b, n:], 0.0)


def test_multi_turn_generation_continues_on_the_same_cache(params):
    """turn 1 -> observation 2 appended to the same cache -> turn 2; row 2 inactive in turn 2;
    `extend` appends a final observation. Log-probs equal those recomputed on the whole dialogue."""
    prompt1, prompt2 = _prompt(3), _prompt(4)
    out1, cache = _generate(params, prompt1, jax.random.key(9))
    active = np.array([True, True, False, True])
    out2, cache = _generate(params, prompt2, jax.random.key(10), cache=cache, active=active)
    np.testing.assert_array_equal(out2.lengths, np.where(active, N, 0))
    np.testing.assert_array_equal(cache.lengths, PROMPT_LENGTHS + N + np.where(active, PROMPT_LENGTHS + N, 0))
    final_obs, final_len = _prompt(5)[:, :3], np.array([3, 1, 2, 2], np.int32)
    cache = sampler.extend(MODEL, params, cache, jnp.asarray(final_obs), jnp.asarray(final_len))
    rows = [np.concatenate([prompt1[b, :PROMPT_LENGTHS[b]], out1.tokens[b]]
                           + ([prompt2[b, :PROMPT_LENGTHS[b]], out2.tokens[b]] if active[b] else [])
                           + [final_obs[b, :final_len[b]]]) for b in range(B)]
    np.testing.assert_array_equal(cache.lengths, [len(r) for r in rows])
    recomputed = _recomputed_logprobs(params, rows, 1.0)
    for b in np.nonzero(active)[0]:
        start = 2 * PROMPT_LENGTHS[b] + N - 1
        np.testing.assert_allclose(out2.logprobs[b], recomputed[b, start:start + N], atol=1e-4)


def test_full_cache_ends_rows_without_stop(params):
    """A cache already holding 30 of its 40 slots (zero keys/values: any content works) fills up mid-turn."""
    cache = models.init_cache(CONFIG, B, 40)
    cache = cache.replace(lengths=jnp.full((B,), 30, jnp.int32))
    out, cache = _generate(params, _prompt(6), jax.random.key(11), cache=cache)
    np.testing.assert_array_equal(out.lengths, np.minimum(10 - PROMPT_LENGTHS, N))
    np.testing.assert_array_equal(cache.lengths, np.minimum(30 + PROMPT_LENGTHS + N, 40))
    assert not np.any(out.stopped)


def test_stop_sequence_array_layout_and_errors():
    np.testing.assert_array_equal(sampler.stop_sequence_array([[5, 6, 7], [9]]), [[5, 6, 7], [-1, -1, 9]])
    assert sampler.stop_sequence_array([]).shape == (0, 1)
    with pytest.raises(ValueError, match="empty"):
        sampler.stop_sequence_array([[3], []])
    with pytest.raises(ValueError, match="negative"):
        sampler.stop_sequence_array([[-2]])


def test_num_tokens_limits_sampling_to_the_tokenizer_vocabulary(params):
    """A model vocabulary padded beyond the tokenizer's: ids >= num_tokens are never sampled, and log-probs are
    those of the softmax renormalised over the allowed ids."""
    cache = models.init_cache(CONFIG, B, 40)
    out, _ = sampler.generate(MODEL, params, cache, jnp.asarray(_prompt(7)), jnp.asarray(PROMPT_LENGTHS),
                              jax.random.key(12), jnp.float32(1.0), jnp.float32(1.0), jnp.asarray(NO_STOP),
                              jnp.ones((B,), bool), max_new_tokens=N, num_tokens=5)
    assert (np.asarray(out.tokens) < 5).all() and (np.asarray(out.lengths) == N).all()
    rows = [np.concatenate([_prompt(7)[b, :PROMPT_LENGTHS[b]], out.tokens[b]]) for b in range(B)]
    logits = [np.asarray(tfm.apply(CONFIG, params, jnp.asarray(r)[None]))[0, :, :5] for r in rows]
    for b in range(B):
        logp = jax.nn.log_softmax(logits[b], axis=-1)
        steps = PROMPT_LENGTHS[b] - 1 + np.arange(N)
        expected = np.asarray(logp)[steps, np.asarray(out.tokens[b])]
        np.testing.assert_allclose(out.logprobs[b], expected, atol=1e-4)


def test_prompt_widths_add_a_short_tier_below_the_cache_widths():
    """A short prompt (the rollout's turn 1 appends one token) is prefilled 8 wide, not at the chunk's tiers."""
    assert sampler.prompt_widths(300) == (8, 128, 256, 300)
    assert sampler.prompt_widths(100) == (8, 100)
    assert sampler.prompt_widths(8) == (8,) and sampler.prompt_widths(6) == (6,)

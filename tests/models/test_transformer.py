"""Decoder parity with transformers (torch CPU) on random tiny Qwen2 / Llama-3 models, KV cache and value head."""
import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers

from configs import base as base_config
from ragen_jax import models
from ragen_jax.models import cpu_kernels, kv_cache
from ragen_jax.models import transformer as tfm
from ragen_jax.rollout import sampler

LAYER_NAMES = {  # HF per-layer module path -> our stacked layer name
    "input_layernorm": "input_norm", "post_attention_layernorm": "post_attn_norm",
    "self_attn.q_proj": "q_proj", "self_attn.k_proj": "k_proj", "self_attn.v_proj": "v_proj",
    "self_attn.o_proj": "o_proj", "mlp.gate_proj": "gate_proj", "mlp.up_proj": "up_proj",
    "mlp.down_proj": "down_proj",
}


def _hf_model(kind):
    """A random tiny HF model. Every tensor (biases and norm scales too) is randomised so parity is meaningful."""
    torch.manual_seed(0 if kind == "qwen2" else 1)
    if kind == "qwen2":  # q/k/v bias, tied embeddings, head_dim = hidden / heads
        hf_config = transformers.Qwen2Config(
            vocab_size=96, hidden_size=64, intermediate_size=112, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, rms_norm_eps=1e-6, tie_word_embeddings=True, max_position_embeddings=128,
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
        model = transformers.Qwen2ForCausalLM(hf_config)
    else:  # no bias, untied head, head_dim != hidden / heads, multi-query, Llama-3 RoPE rescaling
        hf_config = transformers.LlamaConfig(
            vocab_size=80, hidden_size=48, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=1, head_dim=16, rms_norm_eps=1e-5, tie_word_embeddings=False,
            max_position_embeddings=128,
            rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
                             "high_freq_factor": 4.0, "original_max_position_embeddings": 16})
        model = transformers.LlamaForCausalLM(hf_config)
    with torch.no_grad():
        for name, tensor in model.named_parameters():
            scale = 0.3 if name.endswith("embed_tokens.weight") else 0.1
            tensor.copy_((1.0 if "norm" in name else 0.0) + scale * torch.randn_like(tensor))
    model.config._attn_implementation = "eager"
    return model.eval()


def _our_config(hf_config):
    rope = hf_config.rope_parameters
    scaling = None
    if rope["rope_type"] == "llama3":
        scaling = models.Llama3RopeScaling(rope["factor"], rope["low_freq_factor"], rope["high_freq_factor"],
                                           rope["original_max_position_embeddings"])
    return models.ModelConfig(
        vocab_size=hf_config.vocab_size, d_model=hf_config.hidden_size, num_layers=hf_config.num_hidden_layers,
        num_heads=hf_config.num_attention_heads, num_kv_heads=hf_config.num_key_value_heads,
        head_dim=getattr(hf_config, "head_dim", None) or hf_config.hidden_size // hf_config.num_attention_heads,
        mlp_dim=hf_config.intermediate_size, rope_theta=rope["rope_theta"],
        qkv_bias=hf_config.model_type == "qwen2", tie_embeddings=hf_config.tie_word_embeddings,
        norm_eps=hf_config.rms_norm_eps, max_seq_len=64, rope_scaling=scaling)


def _our_params(sd, config):
    """Test-local mapping of a torch state dict (name -> tensor) onto the documented stacked param tree."""
    sd = {k: v.detach().numpy() for k, v in sd.items()}
    layers = {}
    for hf_name, ours in LAYER_NAMES.items():
        per_layer = [sd[f"model.layers.{i}.{hf_name}.weight"] for i in range(config.num_layers)]
        if "norm" in hf_name:
            layers[ours] = {"scale": np.stack(per_layer)}
        else:
            layers[ours] = {"kernel": np.stack([w.T for w in per_layer])}
            if f"model.layers.0.{hf_name}.bias" in sd:
                layers[ours]["bias"] = np.stack([sd[f"model.layers.{i}.{hf_name}.bias"]
                                                 for i in range(config.num_layers)])
    params = {"embed": {"embedding": sd["model.embed_tokens.weight"]}, "layers": layers,
              "final_norm": {"scale": sd["model.norm.weight"]}}
    if not config.tie_embeddings:
        params["lm_head"] = {"kernel": sd["lm_head.weight"].T}
    return jax.tree.map(jnp.asarray, params)


@pytest.fixture(scope="module", params=["qwen2", "llama"])
def pair(request):
    hf = _hf_model(request.param)
    config = _our_config(hf.config)
    params = _our_params(hf.state_dict(), config)
    # the mapping covers exactly the tree init_params documents (names, shapes, dtypes)
    reference = jax.eval_shape(functools.partial(tfm.init_params, config), jax.random.key(0))
    assert jax.tree.structure(reference) == jax.tree.structure(params)
    assert jax.tree.map(lambda a: (a.shape, a.dtype), reference) == jax.tree.map(lambda a: (a.shape, a.dtype), params)
    return hf, models.Model(config, params)


# Three rows of real lengths 10, 7 and 4 out of T = 10.
LENGTHS = np.array([10, 7, 4])
T = 10
WIDE = 22  # width of every uncached reference batch (one compiled shape)


def _sequences(vocab, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.integers(1, vocab, size=n) for n in LENGTHS]


def _pad(seqs, left, width=T, pad=0):
    tokens = np.full((len(seqs), width), pad, np.int32)
    mask = np.zeros((len(seqs), width), np.int32)
    for b, s in enumerate(seqs):
        sl = slice(width - len(s), width) if left else slice(0, len(s))
        tokens[b, sl], mask[b, sl] = s, 1
    return tokens, mask


def _real(x, mask):
    """The real-token rows of x [B, T, ...] in order, concatenated."""
    return np.concatenate([np.asarray(x)[b][np.asarray(mask)[b] == 1] for b in range(len(mask))])


_apply = jax.jit(tfm.apply, static_argnums=0)
_apply_with_cache = jax.jit(tfm.apply_with_cache, static_argnums=0)


@pytest.fixture(params=["kernel", "xla"])
def cached_forward(request, monkeypatch):
    """The jitted cached forward on the fused CPU attention kernel, or forced onto the XLA path (what accelerators
    and sharded batches run; a fresh function, so no trace of the kernel's is reused)."""
    if request.param == "kernel":
        if not cpu_kernels.applies(jnp.float32, 16):
            pytest.skip("the fused CPU attention is not available here")
        return _apply_with_cache
    monkeypatch.setattr(cpu_kernels, "applies", lambda *args: False)
    return jax.jit(lambda *args: tfm.apply_with_cache(*args), static_argnums=0)


def test_left_padded_logits_match_transformers(pair):
    hf, model = pair
    tokens, mask = _pad(_sequences(model.config.vocab_size), left=True)
    positions = np.maximum(np.cumsum(mask, axis=1) - 1, 0)
    with torch.no_grad():
        expected = hf(input_ids=torch.tensor(tokens, dtype=torch.long), attention_mask=torch.tensor(mask),
                      position_ids=torch.tensor(positions, dtype=torch.long)).logits.numpy()
    ours = _apply(model.config, model.params, tokens, None, mask)
    assert ours.dtype == jnp.float32 and ours.shape == expected.shape
    np.testing.assert_array_less(np.abs(_real(ours, mask) - _real(expected, mask)).max(), 1e-4)
    # right padding gives the same logits for the real tokens
    r_tokens, r_mask = _pad(_sequences(model.config.vocab_size), left=False)
    right = _apply(model.config, model.params, r_tokens, None, r_mask)
    np.testing.assert_allclose(_real(right, r_mask), _real(ours, mask), atol=1e-5)


def test_gradients_match_torch(pair):
    """Next-token loss gradients equal torch's (the Llama pair recomputes its blocks: config.remat)."""
    hf, model = pair
    config = dataclasses.replace(model.config, remat=not model.config.qkv_bias)
    tokens, mask = _pad(_sequences(model.config.vocab_size, seed=1), left=False)
    targets = np.roll(tokens, -1, axis=1)
    weights = (mask * np.roll(mask, -1, axis=1)).astype(np.float32)

    def loss_fn(params):
        logp = jax.nn.log_softmax(tfm.apply(config, params, tokens, None, mask))
        return -(jnp.take_along_axis(logp, targets[..., None], -1)[..., 0] * weights).sum() / weights.sum()

    grads = jax.jit(jax.grad(loss_fn))(model.params)
    hf.zero_grad()
    logits = hf(input_ids=torch.tensor(tokens, dtype=torch.long), attention_mask=torch.tensor(mask)).logits
    logp = torch.log_softmax(logits, -1).gather(-1, torch.tensor(targets, dtype=torch.long)[..., None])[..., 0]
    (-(logp * torch.tensor(weights)).sum() / weights.sum()).backward()
    expected = _our_params({k: v.grad for k, v in hf.named_parameters()}, model.config)
    diffs = jax.tree.map(lambda a, b: float(jnp.abs(a - b).max()), grads, expected)
    assert max(jax.tree.leaves(diffs)) < 1e-5, diffs


def test_cached_decoding_equals_uncached(pair):
    """Prefill a right-padded batch, decode 3 tokens one at a time; logits equal the uncached forward."""
    _, model = pair
    c, p = model.config, model.params
    seqs = _sequences(c.vocab_size, seed=2)
    rng = np.random.default_rng(3)
    continuations = rng.integers(1, c.vocab_size, size=(len(seqs), 3)).astype(np.int32)
    prompt, _ = _pad(seqs, left=False)
    cache = model.init_cache(len(seqs), 32)
    prefill_logits, cache = _apply_with_cache(c, p, prompt, cache, LENGTHS)
    step_logits = []
    for t in range(3):
        logits, cache = _apply_with_cache(c, p, continuations[:, t:t + 1], cache, None)
        step_logits.append(np.asarray(logits[:, 0]))
    np.testing.assert_array_equal(cache.lengths, LENGTHS + 3)
    full, full_mask = _pad([np.concatenate([s, continuations[b]]) for b, s in enumerate(seqs)], False, width=WIDE)
    expected = np.asarray(_apply(c, p, full, None, full_mask))
    for b, n in enumerate(LENGTHS):
        np.testing.assert_allclose(prefill_logits[b, :n], expected[b, :n], atol=2e-5)
        for t in range(3):
            np.testing.assert_allclose(step_logits[t][b], expected[b, n + t], atol=2e-5)


def test_cross_turn_extension_and_row_broadcast(pair):
    """Turn 2 appended to the turn-1 cache equals encoding the concatenation; so does a repeated prefix."""
    _, model = pair
    c, p = model.config, model.params
    turn1 = _sequences(c.vocab_size, seed=4)
    rng = np.random.default_rng(5)
    turn2 = [rng.integers(1, c.vocab_size, size=n) for n in (3, 6, 1)]
    cache = model.init_cache(3, 32)
    _, cache = _apply_with_cache(c, p, _pad(turn1, False)[0], cache, LENGTHS)
    chunk, chunk_mask = _pad(turn2, False, width=6)
    logits, cache = _apply_with_cache(c, p, chunk, cache, chunk_mask.sum(1))
    np.testing.assert_array_equal(cache.lengths, LENGTHS + [3, 6, 1])
    full, full_mask = _pad([np.concatenate(x) for x in zip(turn1, turn2)], False, width=WIDE)
    expected = np.asarray(_apply(c, p, full, None, full_mask))
    for b in range(3):
        n, m = LENGTHS[b], len(turn2[b])
        np.testing.assert_allclose(logits[b, :m], expected[b, n:n + m], atol=2e-5)
    # one prefix (row 1), broadcast to 3 rows, each extended with a different continuation
    repeated = models.take_rows(cache, jnp.array([1, 1, 1]))
    assert models.repeat_rows(cache, 2).lengths.tolist() == np.repeat(cache.lengths, 2).tolist()
    cont_logits, _ = _apply_with_cache(c, p, chunk, repeated, chunk_mask.sum(1))
    full2, mask2 = _pad([np.concatenate([turn1[1], turn2[1], t]) for t in turn2], False, width=WIDE)
    expected2 = np.asarray(_apply(c, p, full2, None, mask2))
    start = LENGTHS[1] + len(turn2[1])
    for b in range(3):
        np.testing.assert_allclose(cont_logits[b, :len(turn2[b])], expected2[b, start:start + len(turn2[b])],
                                   atol=2e-5)


def test_attention_reads_the_narrowest_cache_prefix(pair, cached_forward):
    """A 300-slot cache (attended widths 128, 256, 300) holding NaN from slot 256 on: short rows decode within the
    128-slot prefix, a 150-token chunk moves them to the 256 one, and every logit equals the uncached forward, so the
    prefix the XLA path chooses always holds the visible slots and the slots past it are never read (the fused kernel
    reads no slot past a query's own)."""
    _, model = pair
    c = dataclasses.replace(model.config, max_seq_len=320)
    p = model.params
    assert kv_cache.attended_widths(300) == (128, 256, 300)
    seqs = _sequences(c.vocab_size, seed=8)
    rng = np.random.default_rng(9)
    decoded = rng.integers(1, c.vocab_size, size=(3, 2)).astype(np.int32)
    chunk = rng.integers(1, c.vocab_size, size=(3, 150)).astype(np.int32)
    cache = models.init_cache(c, 3, 300)
    cache = cache.replace(k=cache.k.at[:, :, :, 256:].set(jnp.nan), v=cache.v.at[:, :, :, 256:].set(jnp.nan))
    _, cache = cached_forward(c, p, _pad(seqs, False)[0], cache, LENGTHS)
    step_logits = []
    for t in range(2):
        logits, cache = cached_forward(c, p, decoded[:, t:t + 1], cache, None)
        step_logits.append(np.asarray(logits[:, 0]))
    chunk_logits, cache = cached_forward(c, p, chunk, cache, None)
    np.testing.assert_array_equal(cache.lengths, LENGTHS + 152)
    full, mask = _pad([np.concatenate([s, decoded[b], chunk[b]]) for b, s in enumerate(seqs)], False, width=162)
    expected = np.asarray(_apply(c, p, full, None, mask))
    for b, n in enumerate(LENGTHS):
        for t in range(2):
            np.testing.assert_allclose(step_logits[t][b], expected[b, n + t], atol=2e-5)
        np.testing.assert_allclose(chunk_logits[b], expected[b, n + 2:n + 152], atol=2e-5)


def test_grouped_decode_reads_the_shared_prefix_once_per_group(pair, cached_forward):
    """Two prefixes (140 and 133 tokens) repeated to groups of 3 rows share min(lengths) = 133 slots; each row appends
    its own chunk (0-150 tokens, up to 290 of a 300-slot cache), then decodes two tokens. The rows after the first of
    each group hold large random values in their shared slots during decode, so the decode logits, equal to the
    uncached forward's, show that one-token decode takes those slots from the group's first row only, and that the
    rows' own slots (on the XLA path read from the shared length on, 128 or 256 of them, the latter clamped to the
    cache's end, with the slots before the shared length masked) cover the rest."""
    _, model = pair
    c = dataclasses.replace(model.config, max_seq_len=320)
    p = model.params
    rng = np.random.default_rng(12)
    prefixes = [rng.integers(1, c.vocab_size, size=n) for n in (140, 133)]
    chunk_lengths = np.array([5, 0, 150, 100, 20, 60])
    chunk = rng.integers(1, c.vocab_size, size=(6, 150)).astype(np.int32)
    decoded = rng.integers(1, c.vocab_size, size=(6, 2)).astype(np.int32)
    cache = models.init_cache(c, 2, 300)
    prefix_tokens, prefix_mask = _pad(prefixes, False, width=140)
    _, cache = cached_forward(c, p, prefix_tokens, cache, prefix_mask.sum(1))
    grouped = models.repeat_rows(cache, 3)
    assert grouped.group_size == 3 and int(grouped.shared) == 133
    assert models.take_rows(grouped, jnp.arange(6)).group_size == 1 and int(models.truncate(grouped, 100).shared) == 100
    _, grouped = cached_forward(c, p, chunk, grouped, jnp.asarray(chunk_lengths))
    followers = np.arange(6) % 3 > 0
    garbage = jnp.asarray(100 * rng.normal(size=grouped.k.shape), grouped.k.dtype)
    overwritten = jnp.asarray(followers)[None, :, None, None, None] & (jnp.arange(300) < 133)[None, None, None, :, None]
    grouped = grouped.replace(k=jnp.where(overwritten, garbage, grouped.k), v=jnp.where(overwritten, -garbage, grouped.v))
    step_logits = []
    for t in range(2):
        logits, grouped = cached_forward(c, p, decoded[:, t:t + 1], grouped, None)
        step_logits.append(np.asarray(logits[:, 0]))
    rows = [np.concatenate([prefixes[b // 3], chunk[b, :chunk_lengths[b]], decoded[b]]) for b in range(6)]
    full, mask = _pad(rows, False, width=300)
    expected = np.asarray(_apply(c, p, full, None, mask))
    for b, row in enumerate(rows):
        for t in range(2):
            np.testing.assert_allclose(step_logits[t][b], expected[b, len(row) - 2 + t], atol=2e-5)


def test_generation_ignores_the_chunk_padding_width(pair):
    """The same prompts right-padded to 10 or to 200 columns (the prefill runs at the narrowest of 128 / 200 that
    holds them) give the same greedy tokens and the same cache."""
    _, model = pair
    c = dataclasses.replace(model.config, max_seq_len=320)
    prompt, _ = _pad(_sequences(c.vocab_size, seed=10), left=False)
    wide = np.zeros((3, 200), np.int32)
    wide[:, :T] = prompt
    results = [sampler.generate(models.DecoderLM(c), model.params, models.init_cache(c, 3, 256), jnp.asarray(x),
                                jnp.asarray(LENGTHS), jax.random.key(0), jnp.float32(0.0), jnp.float32(1.0),
                                max_new_tokens=6) for x in (prompt, wide)]
    (narrow_out, narrow_cache), (wide_out, wide_cache) = results
    np.testing.assert_array_equal(wide_out.tokens, narrow_out.tokens)
    np.testing.assert_array_equal(wide_cache.lengths, LENGTHS + 6)
    for b, n in enumerate(LENGTHS + 6):
        np.testing.assert_allclose(wide_cache.k[:, b, :, :n], narrow_cache.k[:, b, :, :n], atol=2e-5)
        np.testing.assert_allclose(wide_cache.v[:, b, :, :n], narrow_cache.v[:, b, :, :n], atol=2e-5)


def test_greedy_generation_equals_transformers(pair):
    hf, model = pair
    c = model.config
    seqs = _sequences(c.vocab_size, seed=6)
    left, left_mask = _pad(seqs, left=True)
    with torch.no_grad():
        out = hf.generate(torch.tensor(left, dtype=torch.long), attention_mask=torch.tensor(left_mask),
                          do_sample=False, max_new_tokens=8, min_new_tokens=8, pad_token_id=0,
                          eos_token_id=None).numpy()[:, T:]
    prompt, _ = _pad(seqs, left=False)
    result, cache = sampler.generate(
        models.DecoderLM(c), model.params, model.init_cache(3, 32), jnp.asarray(prompt), jnp.asarray(LENGTHS),
        jax.random.key(0), jnp.float32(0.0), jnp.float32(1.0), max_new_tokens=8)
    np.testing.assert_array_equal(np.asarray(result.tokens), out)
    np.testing.assert_array_equal(result.lengths, [8, 8, 8])
    np.testing.assert_array_equal(cache.lengths, LENGTHS + 8)


def test_bfloat16_compute_stays_close(pair):
    _, model = pair
    config = dataclasses.replace(model.config, compute_dtype="bfloat16")
    tokens, mask = _pad(_sequences(config.vocab_size), left=True)
    low = _apply(config, model.params, tokens, None, mask)
    high = _apply(model.config, model.params, tokens, None, mask)
    assert low.dtype == jnp.float32
    err = np.abs(_real(low, mask) - _real(high, mask)).max()
    assert 0 < err < 0.05 * np.abs(_real(high, mask)).max()


@functools.partial(jax.jit, static_argnums=0)
def _values_and_hidden(config, value_params, tokens, mask):
    return (tfm.values(config, value_params, tokens, None, mask),
            tfm.hidden_states(config, value_params, tokens, None, mask))


def test_value_head_own_parameters_and_padding(pair):
    _, model = pair
    c = model.config
    value_params = model.init_value_params(jax.random.key(1))
    assert "lm_head" not in value_params and value_params["value_head"]["kernel"].shape == (c.d_model, 1)
    value_params["value_head"] = {"kernel": jax.random.normal(jax.random.key(2), (c.d_model, 1)),
                                  "bias": jnp.array([0.5])}
    tokens, mask = _pad(_sequences(c.vocab_size), left=True)
    vals, hidden = _values_and_hidden(model.config, value_params, tokens, mask)
    # values = final hidden states @ w + b, computed in numpy
    expected = hidden @ np.asarray(value_params["value_head"]["kernel"])[:, 0] + 0.5
    np.testing.assert_allclose(_real(vals, mask), _real(expected, mask), rtol=1e-5, atol=1e-5)
    r_tokens, r_mask = _pad(_sequences(c.vocab_size), left=False)
    right_vals = _values_and_hidden(model.config, value_params, r_tokens, r_mask)[0]
    np.testing.assert_allclose(_real(right_vals, r_mask), _real(vals, mask), atol=1e-5)
    # the critic starts from a copy of the policy backbone in its own buffers
    np.testing.assert_array_equal(value_params["embed"]["embedding"], model.params["embed"]["embedding"])
    assert value_params["embed"]["embedding"] is not model.params["embed"]["embedding"]


def test_model_config_from_base_config():
    section = base_config.get_config().model
    config = models.ModelConfig.from_config(section, vocab_size=300)
    assert (config.vocab_size, config.d_model, config.head_dim, config.num_kv_heads) == (300, 128, 32, 2)
    with pytest.raises(ValueError, match="num_heads"):
        models.ModelConfig(vocab_size=8, d_model=8, num_layers=1, num_heads=3, num_kv_heads=2, head_dim=4,
                           mlp_dim=8)
    with pytest.raises(ValueError, match="compute_dtype"):
        models.ModelConfig(vocab_size=8, d_model=8, num_layers=1, num_heads=2, num_kv_heads=2, head_dim=4,
                           mlp_dim=8, compute_dtype="float16")
    with pytest.raises(ValueError, match="max_len"):
        models.init_cache(config, 1, config.max_seq_len + 1)


def _numpy_attention(q, k, v, mask):
    """Reference grouped-query attention: query head h uses kv head h // (H // K)."""
    B, T, H, hd = q.shape
    kv_head = np.arange(H) // (H // k.shape[2])
    scores = np.einsum("bthd,bshd->bhts", q, k[:, :, kv_head]) / np.sqrt(hd)
    scores = np.where(mask[:, None], scores, -1e30)
    probs = np.exp(scores - scores.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    return np.einsum("bhts,bshd->bthd", probs, v[:, :, kv_head]).reshape(B, T, H * hd)


def test_blocked_causal_attention_equals_reference():
    """Self-attention long enough to run in several query blocks, on a left-padded causal mask."""
    B, T, H, K, hd = 2, 150, 4, 2, 8
    rng = np.random.default_rng(7)
    q, k, v = (rng.normal(size=(B, T, n, hd)).astype(np.float32) for n in (H, K, K))
    pad = np.arange(T)[None, :] >= np.array([0, 37])[:, None]  # row 1 has 37 left pads
    mask = np.tril(np.ones((T, T), bool))[None] & pad[:, None, :] & pad[:, :, None]
    out = jax.jit(tfm.causal_attention)(q, k.swapaxes(1, 2), v.swapaxes(1, 2), mask)  # kv-head-major
    np.testing.assert_allclose(np.asarray(out)[pad], _numpy_attention(q, k, v, mask)[pad], atol=1e-5)


def test_cached_attention_in_row_blocks_equals_reference(monkeypatch):
    """Layer 1's first 32 of 40 cached slots, rows in blocks (the CPU's cache-sized passes, forced small here), for
    decode and chunk queries; rows without new tokens are skipped, so the others come in other blocks."""
    monkeypatch.setattr(tfm, "_CPU_BLOCK_BYTES", 4 * 4 * 32 * 8 * 2)  # two rows per block for one-token decode
    B, H, K, hd, S, width = 6, 4, 2, 8, 40, 32
    rng = np.random.default_rng(11)
    k_buf, v_buf = (rng.normal(size=(2, B, K, S, hd)).astype(np.float32) for _ in range(2))
    for T in (1, 12):
        q = rng.normal(size=(B, T, H, hd)).astype(np.float32)
        lengths = rng.integers(0, width - T, size=B)
        mask = np.asarray(kv_cache.cache_attention_mask(jnp.asarray(lengths), T, width))
        blocked = functools.partial(tfm.cached_attention, q, k_buf, v_buf, jnp.int32(1), width)
        assert "while" in str(jax.make_jaxpr(blocked)(lengths))  # blocks of 2 (T = 1) or 1 row(s), one after another
        k, v = (buf[1, :, :, :width].swapaxes(1, 2) for buf in (k_buf, v_buf))  # [B, width, K, hd]
        expected = _numpy_attention(q, k, v, mask)
        np.testing.assert_allclose(np.asarray(jax.jit(blocked)(lengths)), expected, atol=1e-5)
        num_new = np.array([0, T, 0, 0, 1, T])
        out = jax.jit(lambda lengths, num_new: blocked(lengths, num_new=num_new))(lengths, num_new)
        np.testing.assert_allclose(np.asarray(out)[num_new > 0], expected[num_new > 0], atol=1e-5)

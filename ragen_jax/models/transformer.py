"""Decoder-only transformer (Qwen2 / Llama-3 family) and PPO value head, as pure functions of a params pytree.

Architecture (matches HF `Qwen2ForCausalLM` / `LlamaForCausalLM`): token embedding; per block
`x += o_proj(attn(rope(q), rope(k), v))` on `rmsnorm(x)` and `x += down(silu(gate(h)) * up(h))` on
`rmsnorm(x)`; final RMSNorm; LM head (tied to the embedding or not). RoPE uses HF's rotate_half convention
(the two halves of a head, not interleaved pairs); attention is grouped-query (query head h uses kv head
h // (num_heads // num_kv_heads)).

Parameter tree (float32 always; kernels are `[in, out]`, i.e. the TRANSPOSE of torch `Linear.weight`).
Layers are STACKED: every leaf under "layers" has a leading `[num_layers]` axis and the blocks run under
`lax.scan` (one compiled block, fast compiles). HF names in brackets (i = layer index):

    "embed":      {"embedding": [V, D]}                                  [model.embed_tokens.weight]
    "layers": {
      "input_norm":     {"scale": [L, D]}                                [model.layers.i.input_layernorm.weight]
      "q_proj":         {"kernel": [L, D, H*hd], "bias": [L, H*hd]}      [model.layers.i.self_attn.q_proj.*]
      "k_proj":         {"kernel": [L, D, K*hd], "bias": [L, K*hd]}      [... k_proj.*]
      "v_proj":         {"kernel": [L, D, K*hd], "bias": [L, K*hd]}      [... v_proj.*]
      "o_proj":         {"kernel": [L, H*hd, D]}                         [... o_proj.weight]
      "post_attn_norm": {"scale": [L, D]}                                [model.layers.i.post_attention_layernorm.weight]
      "gate_proj":      {"kernel": [L, D, F]}                            [model.layers.i.mlp.gate_proj.weight]
      "up_proj":        {"kernel": [L, D, F]}                            [... up_proj.weight]
      "down_proj":      {"kernel": [L, F, D]}                            [... down_proj.weight]
    }
    "final_norm": {"scale": [D]}                                         [model.norm.weight]
    "lm_head":    {"kernel": [D, V]}      only when not tie_embeddings   [lm_head.weight]

q/k/v "bias" leaves exist only when `config.qkv_bias`. The value model (critic) has its OWN copy of the
backbone ("embed", "layers", "final_norm") plus "value_head": {"kernel": [D, 1], "bias": [1]}, and no "lm_head".

Sequences: `tokens` int32[B, T]; `attention_mask` [B, T] (1/True = real token) for padded batches (left or
right padding); `positions` int32[B, T] default to the count of real tokens before each one (HF's
`cumsum(mask) - 1`), so padded and unpadded rows give the same logits for their real tokens.
The cached forward (`apply_with_cache`) appends right-padded chunks to a `KVCache` (see kv_cache.py).
`DecoderLM` is this architecture behind the package's model seam (`ragen_jax.models.lm.CausalLM`), registered as
`model.arch = "transformer"`; `Model` bundles a config with its params for checkpoint I/O (`ragen_jax.models.hf`).
"""
from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ragen_jax import sharding
from ragen_jax.config import MODEL_ARCHS
from ragen_jax.models import cpu_kernels
from ragen_jax.models import kv_cache as kv
from ragen_jax.models import lm
from ragen_jax.models.config import ModelConfig

Params = dict[str, Any]
_INIT_STD = 0.02  # HF initializer_range
_MIN_QUERY_BLOCK = 64  # causal_attention splits longer sequences into query blocks of at least this size
# cached_attention's scores per block: about a core's L2 cache (2 MiB here); with finished rows skipped, smaller blocks
# skip more of them (docs/performance.md#cache-sized-attention-blocks)
_CPU_BLOCK_BYTES = 2 << 20


# ----------------------------------------------------------------------------------------------- initialisation
def init_params(config: ModelConfig, key: jax.Array) -> Params:
    """Random float32 parameters: normal(0.02) matrices, unit norm scales, zero biases."""
    c = config
    keys = iter(jax.random.split(key, 9))

    def normal(shape):
        return _INIT_STD * jax.random.normal(next(keys), shape, jnp.float32)

    L, D, F = c.num_layers, c.d_model, c.mlp_dim
    q_dim, kv_dim = c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim
    layers = {
        "input_norm": {"scale": jnp.ones((L, D), jnp.float32)},
        "q_proj": {"kernel": normal((L, D, q_dim))},
        "k_proj": {"kernel": normal((L, D, kv_dim))},
        "v_proj": {"kernel": normal((L, D, kv_dim))},
        "o_proj": {"kernel": normal((L, q_dim, D))},
        "post_attn_norm": {"scale": jnp.ones((L, D), jnp.float32)},
        "gate_proj": {"kernel": normal((L, D, F))},
        "up_proj": {"kernel": normal((L, D, F))},
        "down_proj": {"kernel": normal((L, F, D))},
    }
    if c.qkv_bias:
        for name, width in (("q_proj", q_dim), ("k_proj", kv_dim), ("v_proj", kv_dim)):
            layers[name]["bias"] = jnp.zeros((L, width), jnp.float32)
    params = {"embed": {"embedding": normal((c.vocab_size, D))}, "layers": layers,
              "final_norm": {"scale": jnp.ones((D,), jnp.float32)}}
    if not c.tie_embeddings:
        params["lm_head"] = {"kernel": normal((D, c.vocab_size))}
    return params


def init_value_params(config: ModelConfig, key: jax.Array, backbone: Params | None = None) -> Params:
    """Critic parameters: a copy of `backbone`'s embed/layers/final_norm (fresh random ones if None) + value head.

    The head starts at zero output (zero kernel and bias), as in RAGEN's critic built from the base LM.
    """
    backbone_key, _ = jax.random.split(key)
    source = init_params(config, backbone_key) if backbone is None else backbone
    params = {name: jax.tree.map(jnp.array, source[name]) for name in ("embed", "layers", "final_norm")}
    params["value_head"] = {"kernel": jnp.zeros((config.d_model, 1), jnp.float32),
                            "bias": jnp.zeros((1,), jnp.float32)}
    return params


# ------------------------------------------------------------------------------------------------- components
def rms_norm(x: jax.Array, scale: jax.Array, eps: float) -> jax.Array:
    """HF RMSNorm: normalise in float32, cast back, multiply by the (float32) scale cast to x's dtype."""
    x32 = x.astype(jnp.float32)
    normed = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps)
    return scale.astype(x.dtype) * normed.astype(x.dtype)


def rope_inv_freq(config: ModelConfig) -> np.ndarray:
    """float32[head_dim // 2] inverse frequencies, with Llama-3 rescaling when configured (as HF computes them)."""
    dim = config.head_dim
    inv_freq = (1.0 / (config.rope_theta ** (np.arange(0, dim, 2, dtype=np.float32) / dim))).astype(np.float32)
    s = config.rope_scaling
    if s is None:
        return inv_freq
    wavelen = 2 * np.pi / inv_freq
    low_wavelen = s.original_max_position_embeddings / s.low_freq_factor
    high_wavelen = s.original_max_position_embeddings / s.high_freq_factor
    scaled = np.where(wavelen > low_wavelen, inv_freq / s.factor, inv_freq)
    smooth = (s.original_max_position_embeddings / wavelen - s.low_freq_factor) / (
        s.high_freq_factor - s.low_freq_factor)
    smoothed = (1 - smooth) * scaled / s.factor + smooth * scaled
    medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
    return np.where(medium, smoothed, scaled).astype(np.float32)


def apply_rope(x: jax.Array, positions: jax.Array, inv_freq: np.ndarray) -> jax.Array:
    """Rotates x [B, T, heads, hd] by positions [B, T] (rotate_half convention), in float32 then back."""
    freqs = positions.astype(jnp.float32)[..., None] * inv_freq  # [B, T, hd/2]
    emb = jnp.concatenate([freqs, freqs], axis=-1)[:, :, None, :]
    cos, sin = jnp.cos(emb).astype(x.dtype), jnp.sin(emb).astype(x.dtype)
    half = x.shape[-1] // 2
    rotated = jnp.concatenate([-x[..., half:], x[..., :half]], axis=-1)
    return x * cos + rotated * sin


def _dense(x: jax.Array, p: Params) -> jax.Array:
    # a 2-D matmul: XLA:CPU's backward of a [B, T, D] x [D, F] contraction adds transposes
    kernel = p["kernel"].astype(x.dtype)
    y = (x.reshape(-1, x.shape[-1]) @ kernel).reshape(*x.shape[:-1], kernel.shape[-1])
    return y + p["bias"].astype(x.dtype) if "bias" in p else y


def attention(q: jax.Array, k: jax.Array, v: jax.Array, mask: jax.Array,
              prior: tuple[jax.Array, jax.Array] | None = None) -> jax.Array:
    """Grouped-query attention without materialising repeated kv heads.

    q: [B, T, H, hd]; k, v: [B, K, S, hd] (kv-head-major, the KV cache layout); mask: bool[B, T, S]
    (True = may attend). Returns [B, T, H*hd]. Scores and softmax in float32; a fully masked query row
    attends uniformly (no NaN).
    prior: the same queries' attention over other keys, as `shared_prefix_attention` returns it (log-sum-exp of its
    scaled scores float32[B, K, G, T], output [B, K, G, T, hd], G = H // K): merged in as one more key whose score is
    that log-sum-exp and whose value is that output, which makes the result the attention over both sets of keys.
    """
    B, T, H, hd = q.shape
    K, S = k.shape[1], k.shape[2]
    q = jnp.transpose(q.reshape(B, T, K, H // K, hd), (0, 2, 3, 1, 4))  # [B, K, G, T, hd]
    if T == 1:
        # one-token decode: broadcast-multiply + reduce fuses with the read of a cache layer slice, where a batch
        # of [G, hd] x [hd, S] dots first copies the slice (XLA:CPU)
        scores = jnp.sum(q.astype(jnp.float32) * k[:, :, None].astype(jnp.float32), axis=-1)[:, :, :, None]
    else:
        scores = jnp.einsum("bkgtd,bksd->bkgts", q, k, preferred_element_type=jnp.float32)
    scores = jnp.where(mask[:, None, None], scores * (hd ** -0.5), jnp.finfo(jnp.float32).min)
    if prior is not None:
        scores = jnp.concatenate([scores, prior[0][..., None]], axis=-1)
    # softmax with the division after the value product: [.., hd] outputs instead of [.., S] probabilities, one pass
    # over the scores fewer (XLA:CPU runs each pass separately)
    top = jax.lax.stop_gradient(jnp.max(scores, axis=-1, keepdims=True))
    weights = jnp.exp(scores - top)
    total = jnp.sum(weights, axis=-1, keepdims=True).astype(v.dtype)
    weights = weights.astype(v.dtype)
    if T == 1:
        out = jnp.sum(weights[:, :, :, 0, :S, None] * v[:, :, None], axis=3)[:, :, :, None]
    else:
        out = jnp.einsum("bkgts,bksd->bkgtd", weights[..., :S], v)
    if prior is not None:
        out = out + weights[..., S:] * prior[1].astype(v.dtype)
    out = out / total
    return jnp.transpose(out, (0, 3, 1, 2, 4)).reshape(B, T, H * hd)


def group_prefix_attention(q: jax.Array, k: jax.Array, v: jax.Array, key_mask: jax.Array, group_size: int
                           ) -> tuple[jax.Array, jax.Array]:
    """Attention of q [B, T, H, hd] over keys k, v [B/n, K, S, hd] that each group of n = `group_size` consecutive rows
    shares, with the group's queries in one product (a cascade attention); key_mask bool[B/n or 1, S] (True = may
    attend, the same for every query of the group). Returns `attention`'s `prior`: (log-sum-exp float32[B, K, G, T],
    output [B, K, G, T, hd]); a group without visible keys gets a log-sum-exp near float32's minimum, which merges in
    as no keys."""
    B, T, H, hd = q.shape
    K, n = k.shape[1], group_size
    G = H // K
    q = jnp.transpose(q.reshape(B // n, n, T, K, G, hd), (0, 3, 1, 4, 2, 5)).reshape(B // n, K, n * G * T, hd)
    scores = jnp.einsum("bkqd,bksd->bkqs", q, k, preferred_element_type=jnp.float32) * (hd ** -0.5)
    scores = jnp.where(key_mask[:, None, None, :], scores, jnp.finfo(jnp.float32).min)
    top = jax.lax.stop_gradient(jnp.max(scores, axis=-1, keepdims=True))
    weights = jnp.exp(scores - top)
    total = jnp.sum(weights, axis=-1, keepdims=True)
    out = jnp.einsum("bkqs,bksd->bkqd", weights.astype(v.dtype), v) / total.astype(v.dtype)
    lse = (top + jnp.log(total))[..., 0]

    def per_row(x):  # [B/n, K, n*G*T, ...] -> [B, K, G, T, ...]
        x = jnp.moveaxis(x.reshape(B // n, K, n, G, T, *x.shape[3:]), 2, 1)
        return x.reshape(B, K, G, T, *x.shape[5:])

    return per_row(lse), per_row(out)


def shared_prefix_attention(q: jax.Array, k_buf: jax.Array, v_buf: jax.Array, layer: jax.Array, width: int,
                            shared: jax.Array, group_size: int) -> tuple[jax.Array, jax.Array]:
    """Attention of q [B, T, H, hd] over the first `shared` slots (i32 scalar, at most the static `width`) of layer
    `layer` of the KV cache buffers [L, B, K, S, hd], which each group of `group_size` consecutive rows holds alike
    (`KVCache.shared`): read once per group, from its first row (`group_prefix_attention`). Returns `attention`'s
    `prior`."""
    first_rows = jnp.arange(q.shape[0] // group_size) * group_size
    k, v = (buf[layer, first_rows, :, :width] for buf in (k_buf, v_buf))  # [B/n, K, width, hd]
    return group_prefix_attention(q, k, v, (jnp.arange(width) < shared)[None], group_size)


def cached_attention(q: jax.Array, k_buf: jax.Array, v_buf: jax.Array, layer: jax.Array, width: int,
                     lengths: jax.Array, start: jax.Array | int = 0, first: jax.Array | int = 0,
                     prior: tuple[jax.Array, jax.Array] | None = None, num_new: jax.Array | None = None) -> jax.Array:
    """`attention` of q [B, T, H, hd], the new tokens at slots lengths[b] + t (lengths i32[B]), over the `width`
    (static) slots from slot `start` (i32 scalar) of layer `layer` (i32 scalar) of the KV cache buffers k_buf, v_buf
    [L, B, K, S, hd], seeing slots `first` .. lengths[b] + t (`kv.cache_attention_mask`); `prior` as in `attention`.
    num_new: i32[B] the rows' real new tokens (default all): a row with none may get any output. Returns
    [B, T, H*hd].

    The XLA path: `hidden_states_with_cache` calls `cpu_kernels.cached_attention` instead on an unsharded CPU batch
    where that kernel is available. On an unsharded CPU batch the rows go in blocks, one after another, each reading
    its own rows of the buffers:
    XLA:CPU materialises the [rows, heads, T, width] scores (for one-token decode, a [rows, heads, width, hd]
    product) and passes over them several times, and a block that stays in a core's cache makes those passes
    several times faster (docs/performance.md#cache-sized-attention-blocks). Only the blocks holding rows with new
    tokens run (rows whose episode or response has ended are skipped). A sharded batch or an accelerator reads the
    whole batch in one pass.
    """
    B, T, H, hd = q.shape
    K = k_buf.shape[2]

    def block(row_ids):
        def read(buf):  # the rows' `width` slots from `start`: [rows, K, width, hd]
            return jax.vmap(lambda r: jax.lax.dynamic_slice(buf, (layer, r, 0, start, 0), (1, 1, K, width, hd))[0, 0])(
                row_ids)

        rows_of = lambda x: jnp.take(x, row_ids, axis=0)  # noqa: E731
        # each block builds its own mask: a whole [B, T, width] one would be written, then read block by block
        mask = kv.cache_attention_mask(rows_of(lengths), T, width, start, first)
        return attention(rows_of(q), read(k_buf), read(v_buf), mask,
                         None if prior is None else jax.tree.map(rows_of, prior))

    rows = B
    if jax.default_backend() == "cpu" and sharding.batch_shards() == 1:
        row_bytes = 4 * H * width * max(T, hd)
        rows = max([n for n in range(1, B + 1) if B % n == 0 and n * row_bytes <= _CPU_BLOCK_BYTES], default=1)
    if rows == B:  # plain slices: a gather of every row would move a sharded batch across devices
        k, v = (jax.lax.dynamic_slice(buf, (layer, 0, 0, start, 0), (1, B, K, width, hd))[0] for buf in (k_buf, v_buf))
        return attention(q, k, v, kv.cache_attention_mask(lengths, T, width, start, first), prior)
    adding = jnp.ones((B,), bool) if num_new is None else num_new > 0
    order = jnp.argsort(~adding, stable=True)  # the rows with new tokens first

    def run_block(i, out):
        row_ids = jax.lax.dynamic_slice_in_dim(order, i * rows, rows)
        return out.at[row_ids].set(block(row_ids), unique_indices=True)

    blocks = (jnp.sum(adding) + rows - 1) // rows
    return jax.lax.fori_loop(0, blocks, run_block, jnp.zeros((B, T, H * hd), q.dtype))


def causal_attention(q: jax.Array, k: jax.Array, v: jax.Array, mask: jax.Array,
                     prior: tuple[jax.Array, jax.Array] | None = None) -> jax.Array:
    """Self-attention over one sequence (S == T) in query blocks that skip the keys after the block.

    Causality makes those keys invisible anyway; up to 8 blocks roughly halve the attention work. Same
    arguments and result as `attention`.
    """
    T = q.shape[1]
    blocks = min(8, -(-T // _MIN_QUERY_BLOCK))
    size = -(-T // blocks)

    def block_prior(lo):
        return None if prior is None else (prior[0][..., lo:lo + size], prior[1][..., lo:lo + size, :])

    outs = [attention(q[:, lo:lo + size], k[:, :, :lo + size], v[:, :, :lo + size],
                      mask[:, lo:lo + size, :lo + size], block_prior(lo)) for lo in range(0, T, size)]
    return outs[0] if len(outs) == 1 else jnp.concatenate(outs, axis=1)


def _qkv(config: ModelConfig, layer: Params, h: jax.Array, positions: jax.Array, inv_freq: np.ndarray):
    B, T, _ = h.shape
    q = _dense(h, layer["q_proj"]).reshape(B, T, config.num_heads, config.head_dim)
    k = _dense(h, layer["k_proj"]).reshape(B, T, config.num_kv_heads, config.head_dim)
    v = _dense(h, layer["v_proj"]).reshape(B, T, config.num_kv_heads, config.head_dim)
    return apply_rope(q, positions, inv_freq), apply_rope(k, positions, inv_freq), v


def _mlp(config: ModelConfig, layer: Params, x: jax.Array) -> jax.Array:
    h = rms_norm(x, layer["post_attn_norm"]["scale"], config.norm_eps)
    gated = jax.nn.silu(_dense(h, layer["gate_proj"])) * _dense(h, layer["up_proj"])
    return x + _dense(gated, layer["down_proj"])


def _embed(config: ModelConfig, params: Params, tokens: jax.Array) -> jax.Array:
    return jnp.take(params["embed"]["embedding"], tokens, axis=0).astype(config.dtype)


# ---------------------------------------------------------------------------------------------- uncached forward
def default_positions(tokens: jax.Array, attention_mask: jax.Array | None) -> jax.Array:
    """int32[B, T]: 0..T-1, or the number of earlier real tokens when a mask is given (HF convention)."""
    if attention_mask is None:
        return jnp.broadcast_to(jnp.arange(tokens.shape[1], dtype=jnp.int32), tokens.shape)
    return jnp.maximum(jnp.cumsum(attention_mask.astype(jnp.int32), axis=1) - 1, 0)


def hidden_states(config: ModelConfig, params: Params, tokens: jax.Array, positions: jax.Array | None = None,
                  attention_mask: jax.Array | None = None) -> jax.Array:
    """Final-norm hidden states float32[B, T, D] (the input of the LM head and of the value head)."""
    return _forward(config, params, tokens, positions, attention_mask)[0]


def _forward(config: ModelConfig, params: Params, tokens: jax.Array, positions: jax.Array | None,
             attention_mask: jax.Array | None, keep_kv: bool = False):
    """(final-norm hidden states float32[B, T, D], each layer's (k, v) [L, B, K, T, hd] when `keep_kv`, else None)."""
    if positions is None:
        positions = default_positions(tokens, attention_mask)
    T = tokens.shape[1]
    mask = jnp.broadcast_to(jnp.tril(jnp.ones((T, T), bool))[None], (tokens.shape[0], T, T))
    if attention_mask is not None:
        mask = mask & attention_mask.astype(bool)[:, None, :]
    inv_freq = rope_inv_freq(config)

    def block(x, layer):
        h = rms_norm(x, layer["input_norm"]["scale"], config.norm_eps)
        q, k, v = _qkv(config, layer, h, positions, inv_freq)
        k, v = jnp.swapaxes(k, 1, 2), jnp.swapaxes(v, 1, 2)
        x = x + _dense(causal_attention(q, k, v, mask), layer["o_proj"])
        return _mlp(config, layer, x), (k, v) if keep_kv else None

    if config.remat:
        block = jax.checkpoint(block, prevent_cse=False)
    x, kv_per_layer = jax.lax.scan(block, _embed(config, params, tokens), params["layers"])
    return rms_norm(x, params["final_norm"]["scale"], config.norm_eps).astype(jnp.float32), kv_per_layer


def grouped_hidden_states(config: ModelConfig, params: Params, tokens: jax.Array, positions: jax.Array,
                          attention_mask: jax.Array, group_size: int, starts: jax.Array, width: int
                          ) -> tuple[jax.Array, jax.Array]:
    """`hidden_states` of rows in groups of n = `group_size` consecutive rows, group g's rows agreeing on their first
    starts[g] positions (i32[B/n], each at most T - width), computing those positions once per group.

    tokens, positions int32[B, T], attention_mask [B, T]. Each group's first row runs the forward over the first
    T - width positions (its keys and values before its start are the group's); every row then runs the `width`
    (static) positions from its group's start on, attending to the group's keys before it (`group_prefix_attention`,
    merged as `attention`'s prior) and causally to its own. Returns (the groups' hidden states float32[B/n, T - width,
    D], exact before their starts; the rows' windows float32[B, width, D]), equal to `hidden_states` up to float
    rounding.
    """
    T = tokens.shape[1]
    n, shared = group_size, T - width
    attention_mask = attention_mask.astype(bool)
    group_hidden, (k_group, v_group) = _forward(config, params, tokens[::n, :shared], positions[::n, :shared],
                                                attention_mask[::n, :shared], keep_kv=True)
    group_keys = attention_mask[::n, :shared] & (jnp.arange(shared)[None] < starts[:, None])
    window_tokens, window_positions, window_mask = (lm.row_windows(x, jnp.repeat(starts, n), width)
                                                    for x in (tokens, positions, attention_mask))
    own = jnp.tril(jnp.ones((width, width), bool))[None] & window_mask[:, None, :]
    inv_freq = rope_inv_freq(config)

    def block(x, xs):
        layer, k_layer, v_layer = xs
        h = rms_norm(x, layer["input_norm"]["scale"], config.norm_eps)
        q, k, v = _qkv(config, layer, h, window_positions, inv_freq)
        prior = group_prefix_attention(q, k_layer, v_layer, group_keys, n)
        attended = causal_attention(q, jnp.swapaxes(k, 1, 2), jnp.swapaxes(v, 1, 2), own, prior)
        x = x + _dense(attended, layer["o_proj"])
        return _mlp(config, layer, x), None

    if config.remat:
        block = jax.checkpoint(block, prevent_cse=False)
    x, _ = jax.lax.scan(block, _embed(config, params, window_tokens), (params["layers"], k_group, v_group))
    return group_hidden, rms_norm(x, params["final_norm"]["scale"], config.norm_eps).astype(jnp.float32)


def logits_from_hidden(config: ModelConfig, params: Params, hidden: jax.Array) -> jax.Array:
    """LM head: float32[..., D] hidden states -> float32[..., V] logits."""
    h = hidden.astype(config.dtype)
    if config.tie_embeddings:
        return jnp.einsum("...d,vd->...v", h, params["embed"]["embedding"].astype(h.dtype),
                          preferred_element_type=jnp.float32)
    return jnp.einsum("...d,dv->...v", h, params["lm_head"]["kernel"].astype(h.dtype),
                      preferred_element_type=jnp.float32)


def apply(config: ModelConfig, params: Params, tokens: jax.Array, positions: jax.Array | None = None,
          attention_mask: jax.Array | None = None) -> jax.Array:
    """Logits float32[B, T, V] for tokens int32[B, T]."""
    return logits_from_hidden(config, params, hidden_states(config, params, tokens, positions, attention_mask))


def value_from_hidden(params: Params, hidden: jax.Array) -> jax.Array:
    """Value head: float32[..., D] -> float32[...]."""
    head = params["value_head"]
    return (hidden @ head["kernel"] + head["bias"])[..., 0]


def values(config: ModelConfig, params: Params, tokens: jax.Array, positions: jax.Array | None = None,
           attention_mask: jax.Array | None = None) -> jax.Array:
    """Critic values float32[B, T] (one scalar per token) from value-model params."""
    return value_from_hidden(params, hidden_states(config, params, tokens, positions, attention_mask))


# ------------------------------------------------------------------------------------------------ cached forward
def hidden_states_with_cache(config: ModelConfig, params: Params, tokens: jax.Array, cache: kv.KVCache,
                             num_new: jax.Array | None = None,
                             positions: jax.Array | None = None) -> tuple[jax.Array, kv.KVCache]:
    """Appends a right-padded chunk tokens int32[B, T] to `cache`; returns (float32[B, T, D] hidden, cache).

    num_new: int32[B] real tokens at the start of each row (default T; 0 leaves a row's cache unchanged).
    positions: int32[B, T], default `cache.lengths[b] + t` (a row's positions are its cache slots).
    Hidden states at padded steps (t >= num_new[b]) are meaningless.
    """
    B, T = tokens.shape
    num_new = jnp.full((B,), T, jnp.int32) if num_new is None else num_new.astype(jnp.int32)
    lengths = cache.lengths
    if positions is None:
        positions = lengths[:, None] + jnp.arange(T, dtype=jnp.int32)[None, :]
    inv_freq = rope_inv_freq(config)
    widths = kv.attended_widths(cache.max_len)
    # every query's visible slots lie below max(lengths) + T: attention reads only a static prefix holding them
    needed = jnp.max(lengths) + T
    # an unsharded CPU batch runs the fused kernel (cpu_kernels.py); otherwise one-token decode over groups of rows
    # that share a prefix (`KVCache.shared`) reads that prefix once per group (`shared_prefix_attention`) and each
    # row's own slots after it
    fused = sharding.batch_shards() == 1 and cpu_kernels.applies(config.dtype, config.head_dim)
    grouped = T == 1 and cache.group_size > 1

    def attend(operands, width):
        q, k_buf, v_buf, index = operands
        return cached_attention(q, k_buf, v_buf, index, width, lengths, num_new=num_new)

    def attend_shared(operands, width):
        q, k_buf, v_buf, index = operands
        return shared_prefix_attention(q, k_buf, v_buf, index, width, cache.shared, cache.group_size)

    def attend_after_shared(operands, width):
        q, k_buf, v_buf, index, prior = operands
        start = jnp.minimum(cache.shared, cache.max_len - width)
        return cached_attention(q, k_buf, v_buf, index, width, lengths, start, cache.shared, prior, num_new)

    def block(carry, xs):
        x, k_buf, v_buf = carry
        layer, index = xs
        h = rms_norm(x, layer["input_norm"]["scale"], config.norm_eps)
        q, k, v = _qkv(config, layer, h, positions, inv_freq)
        k_buf = kv.write_layer(k_buf, index, lengths, k)
        v_buf = kv.write_layer(v_buf, index, lengths, v)
        if fused:
            attended = cpu_kernels.cached_attention(q, k_buf, v_buf, index, lengths, num_new, cache.shared,
                                                    cache.group_size)
        elif grouped:
            prior = sharding.tiered(cache.shared, widths, attend_shared, (q, k_buf, v_buf, index))
            attended = sharding.tiered(needed - cache.shared, kv.half_octave_widths(cache.max_len), attend_after_shared,
                                       (q, k_buf, v_buf, index, prior))
        else:
            attended = sharding.tiered(needed, widths, attend, (q, k_buf, v_buf, index))
        x = x + _dense(attended, layer["o_proj"])
        return (_mlp(config, layer, x), k_buf, v_buf), None

    carry = (_embed(config, params, tokens), cache.k, cache.v)
    (x, k_buf, v_buf), _ = jax.lax.scan(block, carry, (params["layers"], jnp.arange(config.num_layers)))
    new_cache = cache.replace(k=k_buf, v=v_buf, lengths=jnp.minimum(lengths + num_new, cache.max_len))
    return rms_norm(x, params["final_norm"]["scale"], config.norm_eps).astype(jnp.float32), new_cache


def apply_with_cache(config: ModelConfig, params: Params, tokens: jax.Array, cache: kv.KVCache,
                     num_new: jax.Array | None = None,
                     positions: jax.Array | None = None) -> tuple[jax.Array, kv.KVCache]:
    """Cached forward: (float32[B, T, V] logits of the appended chunk, updated cache). See hidden_states_with_cache."""
    hidden, cache = hidden_states_with_cache(config, params, tokens, cache, num_new, positions)
    return logits_from_hidden(config, params, hidden), cache


# ---------------------------------------------------------------------------------------------- object boundary
@MODEL_ARCHS.register("transformer")
@dataclasses.dataclass(frozen=True)
class DecoderLM(lm.CausalLM):
    """This module's decoder behind the model seam (`lm.CausalLM`, `model.arch = "transformer"`): each method is
    the function of the same name with `config` bound. Hashable by its config: a static argument of `jax.jit`."""

    def init_params(self, key):
        return init_params(self.config, key)

    def init_value_params(self, key, backbone=None):
        return init_value_params(self.config, key, backbone)

    def hidden_states(self, params, tokens, positions=None, attention_mask=None):
        return hidden_states(self.config, params, tokens, positions, attention_mask)

    def grouped_hidden_states(self, params, tokens, positions, attention_mask, group_size, starts, width):
        return grouped_hidden_states(self.config, params, tokens, positions, attention_mask, group_size, starts, width)

    def logits_from_hidden(self, params, hidden):
        return logits_from_hidden(self.config, params, hidden)

    def values(self, value_params, tokens, positions=None, attention_mask=None):
        return values(self.config, value_params, tokens, positions, attention_mask)

    def init_cache(self, batch_size, max_len=None):
        return kv.init_cache(self.config, batch_size, max_len)

    def hidden_states_with_cache(self, params, tokens, cache, num_new=None, positions=None):
        return hidden_states_with_cache(self.config, params, tokens, cache, num_new, positions)


@dataclasses.dataclass(frozen=True, eq=False)
class Model:
    """A config plus its params pytree: what `ragen_jax.models.hf` loads and saves. Computing goes through
    `DecoderLM(model.config)`; `init_cache` and `init_value_params` are its, the latter copying these params."""

    config: ModelConfig
    params: Params

    def init_value_params(self, key, backbone=None):
        """Critic params whose backbone copies `backbone` (default: this model's params)."""
        return init_value_params(self.config, key, self.params if backbone is None else backbone)

    def init_cache(self, batch_size: int, max_len: int | None = None) -> kv.KVCache:
        return kv.init_cache(self.config, batch_size, max_len)

"""Preallocated key/value cache with per-row lengths, extendable across turns.

Layout: `k`, `v` are `[num_layers, B, num_kv_heads, max_len, head_dim]` (the per-layer buffers stacked, so the
decoder's `lax.scan` over layers updates them in place; kv-head-major so attention reads a layer's slice without
a transpose) in the compute dtype; `lengths` is `int32[B]`.
Row b is *compact*: slots `0 .. lengths[b]-1` hold its real tokens in order (keys already rotated by RoPE),
everything from `lengths[b]` on is free (stale values there are never attended to). Appending a chunk of T
tokens of which the first `num_new[b]` are real (right padding) writes them at slots `lengths[b] ..` and
advances `lengths[b] += num_new[b]`; writes past `max_len` are dropped, so callers keep
`lengths + num_new <= max_len` (the sampler stops a row whose cache is full).

Reusing one prefix for many continuations (e.g. scoring many reasoning strings against one prompt):
prefill the prefixes once, then `take_rows(cache, row_ids)` (or `repeat_rows(cache, n)`) gives a cache with
one row per continuation, which is then extended independently. `repeat_rows` also records the groups of copies
(`KVCache.shared`, `group_size`), and one-token decode then reads the shared slots once per group (a cascade
attention). See `ragen_jax.models.transformer`.
"""
from __future__ import annotations

import flax.struct
import jax
import jax.numpy as jnp

from ragen_jax import sharding
from ragen_jax.models.config import ModelConfig


@flax.struct.dataclass
class KVCache:
    """k, v: [L, B, K, S, hd] compute dtype; lengths: int32[B] valid slots per row.

    shared: int32 scalar, group_size: static int. The rows come in groups of `group_size` consecutive rows whose
    first `shared` slots hold the same keys and values (`shared <= lengths`); `repeat_rows` makes such groups and
    one-token decode then reads those slots once per group (`transformer.hidden_states_with_cache`). A cache
    without groups has group_size 1 and shared 0.
    """

    k: jax.Array
    v: jax.Array
    lengths: jax.Array
    shared: jax.Array
    group_size: int = flax.struct.field(pytree_node=False, default=1)

    @property
    def max_len(self) -> int:
        return self.k.shape[3]

    @property
    def batch_size(self) -> int:
        return self.k.shape[1]


def init_cache(config: ModelConfig, batch_size: int, max_len: int | None = None) -> KVCache:
    """An empty cache (all lengths 0) holding up to `max_len` tokens per row (default `config.max_seq_len`)."""
    max_len = config.max_seq_len if max_len is None else max_len
    if max_len > config.max_seq_len:
        raise ValueError(f"KV cache max_len = {max_len} exceeds ModelConfig.max_seq_len = {config.max_seq_len}")
    shape = (config.num_layers, batch_size, config.num_kv_heads, max_len, config.head_dim)
    return KVCache(k=jnp.zeros(shape, config.dtype), v=jnp.zeros(shape, config.dtype),
                   lengths=jnp.zeros((batch_size,), jnp.int32), shared=jnp.int32(0))


def shard_rows(cache: KVCache) -> KVCache:
    """`sharding.shard_batch` for a cache: its rows (axis 1 of k/v) split over the ambient mesh's batch axes."""
    return cache.replace(k=sharding.shard_batch(cache.k, axis=1), v=sharding.shard_batch(cache.v, axis=1),
                         lengths=sharding.shard_batch(cache.lengths))


def take_rows(cache: KVCache, row_ids: jax.Array) -> KVCache:
    """A cache whose row i is a copy of `cache` row `row_ids[i]` (int32[B']); B' may differ from B. No groups."""
    return KVCache(k=jnp.take(cache.k, row_ids, axis=1), v=jnp.take(cache.v, row_ids, axis=1),
                   lengths=jnp.take(cache.lengths, row_ids, axis=0), shared=jnp.int32(0))


def repeat_rows(cache: KVCache, repeats: int) -> KVCache:
    """Each row repeated `repeats` times consecutively: row b becomes rows b*repeats .. b*repeats+repeats-1, a group
    sharing its first min(lengths) slots (`KVCache.shared`)."""
    rows = take_rows(cache, jnp.repeat(jnp.arange(cache.batch_size), repeats))
    if repeats == 1:
        return rows
    return rows.replace(shared=jnp.min(cache.lengths), group_size=repeats)


def truncate(cache: KVCache, max_len: int) -> KVCache:
    """The first `max_len` slots of every row (static); rows longer than that keep only those slots."""
    return cache.replace(k=cache.k[:, :, :, :max_len], v=cache.v[:, :, :, :max_len],
                         lengths=jnp.minimum(cache.lengths, max_len), shared=jnp.minimum(cache.shared, max_len))


def write_layer(buffer: jax.Array, layer: jax.Array, lengths: jax.Array, new: jax.Array) -> jax.Array:
    """Writes `new` [B, T, K, hd] into `buffer` [L, B, K, S, hd] at layer `layer`, row b slots lengths[b]+t.

    Out-of-range slots are dropped (never clamped onto valid history).
    """
    batch, steps = new.shape[:2]
    rows = jnp.arange(batch)[:, None]
    slots = lengths[:, None] + jnp.arange(steps)[None, :]
    # advanced indices (layer, rows, slots) around a slice: the update is indexed [B, T, K, hd], like `new`
    return buffer.at[layer, rows, :, slots].set(new.astype(buffer.dtype), mode="drop")


MIN_ATTENDED_WIDTH = 128  # the narrowest prefix of a cache that attention reads (see `attended_widths`)


def attended_widths(max_len: int) -> tuple[int, ...]:
    """The static prefix widths attention over a cache of `max_len` slots can read: 128, 256, 512, ... below
    `max_len`, then `max_len`. Reading the smallest one that holds every row's slots costs under twice the slots in
    use, where reading the whole preallocated cache costs `max_len` however short the rows are. The sampler pads a
    prompt chunk to these widths of the chunk's own width the same way."""
    widths = [MIN_ATTENDED_WIDTH]
    while widths[-1] < max_len:
        widths.append(widths[-1] * 2)
    return tuple(w for w in widths if w < max_len) + (max_len,)


def half_octave_widths(max_len: int) -> tuple[int, ...]:
    """`attended_widths(max_len)` with 1.5x each one between them: 128, 192, 256, 384, ... For a count of slots that
    starts mid-cache (the rows' own slots after a group's shared prefix, `KVCache.shared`), which is rarely just
    below a power of two: these read up to a third less than the octave widths there."""
    widths = attended_widths(max_len)
    return tuple(sorted({*widths, *(w * 3 // 2 for w in widths if w * 3 // 2 < max_len)}))


def cache_attention_mask(lengths: jax.Array, steps: int, width: int, start: jax.Array | int = 0,
                         first: jax.Array | int = 0) -> jax.Array:
    """bool[B, T, width] over slots start .. start+width-1: new token t of row b (at slot lengths[b]+t) sees slots
    first .. lengths[b]+t."""
    query_slot = lengths[:, None] + jnp.arange(steps)[None, :]
    slots = start + jnp.arange(width)[None, None, :]
    return (slots >= first) & (slots <= query_slot[:, :, None])

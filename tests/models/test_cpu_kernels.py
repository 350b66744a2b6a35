"""The fused CPU attention kernel (cpu_kernels.py) against the XLA path (`transformer.cached_attention`)."""
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ragen_jax.models import cpu_kernels
from ragen_jax.models import transformer as tfm

pytestmark = pytest.mark.skipif(not cpu_kernels.available(), reason="no C++ compiler: the XLA path runs instead")

_kernel = jax.jit(cpu_kernels.cached_attention, static_argnames="group_size")


def _problem(rng, B, T, H, K, S, hd, group_size, shared):
    """Random queries and cache (layer 1 of 2), groups of rows alike in their first `shared` slots, lengths from
    `shared` to past the cache's end (lengths + t beyond S - 1 sees the whole cache), a mix of new-token counts."""
    q = rng.normal(size=(B, T, H, hd)).astype(np.float32)
    k, v = (rng.normal(size=(2, B, K, S, hd)).astype(np.float32) for _ in range(2))
    for b in range(B):
        first = b - b % group_size
        k[:, b, :, :shared], v[:, b, :, :shared] = k[:, first, :, :shared], v[:, first, :, :shared]
    lengths = rng.integers(shared, S - T + 3, size=B).astype(np.int32)
    num_new = rng.integers(0, T + 1, size=B).astype(np.int32)
    num_new[0], num_new[-1] = T, 0
    return q, k, v, lengths, num_new


@pytest.mark.parametrize("B,T,H,K,S,hd,group_size,shared", [
    (8, 1, 4, 2, 300, 16, 1, 0),      # one-token decode
    (8, 1, 4, 2, 300, 16, 4, 100),    # decode, groups sharing 100 slots (not a multiple of the 64-slot tile)
    (6, 37, 4, 2, 200, 16, 3, 64),    # a chunk, groups
    (4, 5, 8, 2, 150, 32, 1, 0),      # 4 query heads per kv head
    (4, 70, 4, 4, 260, 64, 2, 77),
    (2, 3, 2, 1, 130, 128, 1, 0),     # one kv head
])
def test_kernel_equals_the_xla_path(B, T, H, K, S, hd, group_size, shared):
    """Real queries match `transformer.cached_attention` over the whole cache; queries past a row's new tokens and rows
    without any are zero; the shared slots are read from a group's first row only (the other rows' copies hold
    garbage in the kernel's input)."""
    rng = np.random.default_rng(hd + T)
    q, k, v, lengths, num_new = _problem(rng, B, T, H, K, S, hd, group_size, shared)
    expected = np.asarray(tfm.cached_attention(jnp.asarray(q), k, v, jnp.int32(1), S, jnp.asarray(lengths)))
    followers = (np.arange(B) % group_size > 0)[None, :, None, None, None] & (np.arange(S) < shared)[:, None]
    k_in, v_in = np.where(followers, 1e3, k), np.where(followers, -1e3, v)
    out = np.asarray(_kernel(q, k_in, v_in, 1, lengths, num_new, shared, group_size=group_size))
    real = np.arange(T)[None, :] < num_new[:, None]
    np.testing.assert_allclose(out[real], expected[real], atol=2e-6, rtol=1e-5)
    np.testing.assert_array_equal(out[~real], 0.0)


def test_kernel_ignores_slots_past_each_query():
    """NaN in every slot after a query's own (its visible slots end at lengths[b] + t) changes nothing."""
    rng = np.random.default_rng(3)
    B, T, H, K, S, hd = 4, 9, 4, 2, 160, 16
    q, k, v, _, _ = _problem(rng, B, T, H, K, S, hd, 1, 0)
    lengths, num_new = np.array([0, 50, 130, 140], np.int32), np.array([9, 4, 9, 1], np.int32)
    expected = np.asarray(tfm.cached_attention(jnp.asarray(q), k, v, jnp.int32(1), S, jnp.asarray(lengths)))
    past = np.arange(S)[None, :] >= (lengths + num_new)[:, None]  # [B, S]
    k_nan, v_nan = (np.where(past[None, :, None, :, None], np.nan, x) for x in (k, v))
    out = np.asarray(_kernel(q, k_nan, v_nan, 1, lengths, num_new, 0, group_size=1))
    real = np.arange(T)[None, :] < num_new[:, None]
    np.testing.assert_allclose(out[real], expected[real], atol=2e-6, rtol=1e-5)


def test_kernel_under_vmap_runs_each_member():
    rng = np.random.default_rng(5)
    members = [_problem(rng, 4, 3, 4, 2, 90, 16, 2, 20) for _ in range(2)]
    stacked = [np.stack(x) for x in zip(*members)]
    batched = jax.vmap(lambda q, k, v, lengths, num_new: cpu_kernels.cached_attention(
        q, k, v, 1, lengths, num_new, 20, 2))(*stacked)
    for i, (q, k, v, lengths, num_new) in enumerate(members):
        np.testing.assert_array_equal(np.asarray(batched[i]),
                                      np.asarray(_kernel(q, k, v, 1, lengths, num_new, 20, group_size=2)))


def test_build_is_cached_and_failures_are_explained(tmp_path, monkeypatch):
    """A second build finds the first one's library; a missing compiler is named; the switch turns the kernel off."""
    path = cpu_kernels.build(folder=str(tmp_path))
    stamp = os.stat(path).st_mtime_ns
    assert cpu_kernels.build(folder=str(tmp_path)) == path and os.stat(path).st_mtime_ns == stamp
    with pytest.raises(RuntimeError, match="no-such-c"):
        cpu_kernels.build(compiler="no-such-c++", folder=str(tmp_path / "other"))
    monkeypatch.setenv(cpu_kernels.SWITCH, "0")
    assert cpu_kernels.available.__wrapped__() is False

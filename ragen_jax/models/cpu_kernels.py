"""A fused attention kernel for XLA:CPU, built from C++ with the package (`cpu_attention.cc`, an XLA FFI handler).

    if cpu_kernels.applies(config.dtype, config.head_dim):
        out = cpu_kernels.cached_attention(q, k_buf, v_buf, layer, lengths, num_new, shared, group_size)

XLA:CPU makes of a cached attention a chain of kernels, each a pass over materialised scores, and copies every block
of the cache it reads (docs/performance.md); the kernel here reads each visible slot once per (row, kv head), a
group's shared slots once per (group, kv head), and keeps only a tile of scores, skips the padding after a row's new tokens and rows without any, and runs the rows on
XLA's intra-op threads. `transformer.hidden_states_with_cache` uses it on an unsharded CPU batch; every other backend,
a sharded batch, or a machine where it is not available runs the XLA path (`transformer.cached_attention`), which
is the reference the tests hold it to.

The source is compiled on first use with the system's C++ compiler ($CXX, else `c++`) against jaxlib's FFI headers,
into `~/.cache/ragen_jax/kernels` (under $XDG_CACHE_HOME when set): one file per source, jaxlib version, flags and CPU
(`-march=native`), built once per machine in about 3 s, then loaded and registered as the custom call target
`ragen_cached_attention`. Without a compiler (a one-line warning says why), or with RAGEN_JAX_CPU_KERNELS=0,
`available()` is False and the model runs the XLA path.
"""
from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import shutil
import subprocess
import tempfile
import warnings

import jax
import jax.numpy as jnp
import jaxlib
import numpy as np

from ragen_jax import compile_cache

SOURCE = os.path.join(os.path.dirname(__file__), "cpu_attention.cc")
TARGET = "ragen_cached_attention"
HEAD_DIMS = (16, 32, 64, 128)  # the head sizes the kernel is instantiated for
FLAGS = ("-O3", "-march=native", "-std=c++17", "-shared", "-fPIC")
SWITCH = "RAGEN_JAX_CPU_KERNELS"  # "0" turns the kernel off


def kernel_dir() -> str:
    """Where built kernels live: `kernels` next to the default XLA compilation cache (`compile_cache.default_dir`)."""
    return os.path.join(os.path.dirname(compile_cache.default_dir()), "kernels")


def _cpu_features() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            return next((line for line in f if line.startswith("flags")), "")
    except OSError:
        return ""


def build(compiler: str | None = None, folder: str | None = None) -> str:
    """Compiles `SOURCE` (unless a build of this source, jaxlib, flags and CPU exists); returns the library's path.
    Raises RuntimeError with the compiler's message on failure."""
    compiler = compiler or os.environ.get("CXX") or "c++"
    folder = folder or kernel_dir()
    with open(SOURCE, "rb") as f:
        source = f.read()
    key = hashlib.sha256(b"\0".join([source, jaxlib.__version__.encode(), " ".join(FLAGS).encode(),
                                     _cpu_features().encode(), compiler.encode()])).hexdigest()[:16]
    path = os.path.join(folder, f"cpu_attention-{key}.so")
    if os.path.exists(path):
        return path
    if shutil.which(compiler) is None:
        raise RuntimeError(f"no C++ compiler {compiler!r} on PATH")
    os.makedirs(folder, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=folder) as tmp:  # built aside, then renamed: concurrent builds are safe
        built = os.path.join(tmp, "lib.so")
        result = subprocess.run([compiler, *FLAGS, "-isystem", jax.ffi.include_dir(), SOURCE, "-o", built],
                                capture_output=True, text=True)
        if result.returncode != 0:
            raise RuntimeError(f"{compiler} failed: {result.stderr.strip()[-2000:]}")
        os.replace(built, path)
    return path


@functools.cache
def available() -> bool:
    """Whether the kernel is built and registered in this process (building it on the first call)."""
    if os.environ.get(SWITCH, "1") == "0":
        return False
    try:
        library = ctypes.cdll.LoadLibrary(build())
        jax.ffi.register_ffi_target(TARGET, jax.ffi.pycapsule(library.RagenCachedAttention), platform="cpu")
    except (RuntimeError, OSError) as error:
        warnings.warn(f"ragen_jax: the fused CPU attention is not available, the XLA path runs instead ({error})",
                      RuntimeWarning, stacklevel=2)
        return False
    return True


def applies(dtype, head_dim: int) -> bool:
    """Whether `cached_attention` serves a model computing in `dtype` with heads of `head_dim` on this process's
    default backend (float32 on the CPU, a supported head size, the kernel available)."""
    return (jax.default_backend() == "cpu" and jnp.dtype(dtype) == jnp.float32 and head_dim in HEAD_DIMS
            and available())


def cached_attention(q: jax.Array, k_buf: jax.Array, v_buf: jax.Array, layer: jax.Array, lengths: jax.Array,
                     num_new: jax.Array, shared: jax.Array, group_size: int) -> jax.Array:
    """Attention of the new tokens q float32[B, T, H, hd] (token t of row b at slot lengths[b] + t, already written)
    over layer `layer` (i32 scalar) of the cache buffers k_buf, v_buf float32[L, B, K, S, hd]: token t of row b sees
    slots 0 .. min(lengths[b] + t, S - 1). num_new int32[B]: the rows' real new tokens; queries from num_new[b] on
    (and rows with none) get zeros. shared (i32 scalar), group_size (static): `KVCache.shared` and `group_size`
    (slots below `shared` are read from the group's first row). Returns float32[B, T, H*hd], equal to
    `transformer.cached_attention` over the whole cache up to float32 rounding. Under `vmap` one call serves every
    member (`broadcast_all`: the kernel treats each index of the leading batch dimensions as a problem of its own and
    runs all members' work items on the threads together).
    """
    B, T, H, hd = q.shape
    call = jax.ffi.ffi_call(TARGET, jax.ShapeDtypeStruct((B, T, H * hd), jnp.float32), vmap_method="broadcast_all")
    return call(q, k_buf, v_buf, jnp.asarray(layer, jnp.int32), lengths.astype(jnp.int32), num_new.astype(jnp.int32),
                jnp.asarray(shared, jnp.int32), group_size=np.int64(group_size))

"""The device mesh and the sharding rules of the training step (sharding, not pmap: docs/architecture.md, rule 4).

One `jax.sharding.Mesh` with named axes `("sweep", "data", "fsdp")` (sizes from `config.mesh`):

- the BATCH (environments, trajectories, update rows) is split over `data` x `fsdp` (as in MaxText, the fsdp axis
  also splits the batch, so every device holds a different slice of it);
- PARAMETERS and optimizer states are split over `fsdp` along their largest dimension that `fsdp` divides, and
  replicated over `data` (fsdp = 1 means plain data parallelism);
- `sweep` carries the members of a vectorised sweep (`ragen_jax.train.sweep`); a single run uses sweep = 1.

Library code marks batch-major values with `shard_batch(x)`: inside `with jax.set_mesh(mesh)` that is a sharding
constraint over the batch axes, and without an ambient mesh (or with batch axes of size 1) it returns `x`
unchanged, so the same functions run sharded and unsharded. Sharding never changes results beyond float reduction
order: random draws are sharding-invariant (threefry is partitionable) and GSPMD inserts the collectives.
"""
from __future__ import annotations

import contextvars
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec

from environments.pytrees import tree_select

MESH_AXES = ("sweep", "data", "fsdp")
BATCH_AXES = ("data", "fsdp")
SWEEP_AXIS = "sweep"  # also the vmap axis name of a vectorised sweep (`vmap_members`)
_TRACING_MEMBERS = contextvars.ContextVar("tracing_sweep_members", default=False)


def mesh_shape(config, num_devices: int) -> tuple[int, int, int]:
    """(sweep, data, fsdp) sizes of `config.mesh` with `data = -1` resolved against `num_devices`."""
    from ragen_jax.config import mesh_data_size  # deferred: config imports nothing heavy, this keeps it so

    m = config.mesh
    return m.sweep, mesh_data_size(config, num_devices), m.fsdp


def make_mesh(config, devices: Sequence[jax.Device] | None = None) -> Mesh:
    """The mesh of `config.mesh` over the first sweep*data*fsdp of `devices` (default: all devices).

    Axis types are Auto so GSPMD propagates shardings from the constraints (`jax.make_mesh` defaults to Explicit).
    """
    devices = list(jax.devices() if devices is None else devices)
    shape = mesh_shape(config, len(devices))
    grid = np.array(devices[: int(np.prod(shape))]).reshape(shape)
    return Mesh(grid, MESH_AXES, axis_types=(AxisType.Auto,) * len(MESH_AXES))


def batch_shards() -> int:
    """How many ways the ambient mesh splits the batch (data x fsdp); 1 outside a mesh."""
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty or not set(BATCH_AXES) <= set(mesh.axis_names):
        return 1
    return int(np.prod([mesh.shape[a] for a in BATCH_AXES]))


def shard_batch(tree: Any, axis: int = 0) -> Any:
    """Constrains every array leaf of `tree` to be split over the batch axes along `axis` (see module doc).

    Leaves with fewer than `axis + 1` dimensions, or whose `axis` is not divisible by data*fsdp, are left as they are
    (GSPMD places them); outside an ambient mesh this is the identity.
    """
    parts = batch_shards()
    if parts == 1:
        return tree

    def constrain(x):
        if not hasattr(x, "ndim") or x.ndim <= axis or x.shape[axis] % parts:
            return x
        return jax.lax.with_sharding_constraint(x, PartitionSpec(*([None] * axis), BATCH_AXES))

    return jax.tree.map(constrain, tree)


def vmap_members(fn: Callable, in_axes: Any = 0, out_axes: Any = 0) -> Callable:
    """`jax.vmap(fn)` over the members of a vectorised sweep: the vmap axis and the mesh axis it is split over are
    both `SWEEP_AXIS`, and while `fn` traces, `sweep_max` (and what uses it) reduces over the members."""
    def traced(*args):
        marker = _TRACING_MEMBERS.set(True)
        try:
            return fn(*args)
        finally:
            _TRACING_MEMBERS.reset(marker)

    return jax.vmap(traced, in_axes=in_axes, out_axes=out_axes, axis_name=SWEEP_AXIS, spmd_axis_name=SWEEP_AXIS)


def sweep_max(x: jax.Array) -> jax.Array:
    """`x`'s maximum over the members of a vectorised sweep (`vmap_members`); `x` itself outside one.

    Under a vmap a branch index or loop condition that differs per member turns `lax.switch` / `lax.cond` into
    computing every branch and `lax.while_loop` into selecting the whole carry each iteration. Taking the maximum
    over members makes it one value (vmap keeps real branches and loops); callers must make the wider choice correct
    for every member (e.g. a wider padding tier, extra no-op loop iterations, or a per-member select inside the
    branch).
    """
    return jax.lax.pmax(x, SWEEP_AXIS) if _TRACING_MEMBERS.get() else x


def sweep_any(pred: jax.Array) -> jax.Array:
    """bool: `pred` holds for some member of a vectorised sweep (`pred` itself outside one); see `sweep_max`."""
    return sweep_max(jnp.asarray(pred).astype(jnp.int32)) > 0


def sweep_cond(pred: jax.Array, true_fn, false_fn, *operands):
    """`lax.cond(pred, true_fn, false_fn, *operands)` that stays one real branch in a vectorised sweep: `true_fn`
    runs when `pred` holds for any member, and members whose `pred` is false take `false_fn`'s result by a select.
    Outside a sweep it is the plain cond (the select then always picks `true_fn`'s result)."""
    taken = lambda *ops: tree_select(pred, true_fn(*ops), false_fn(*ops))  # noqa: E731
    return jax.lax.cond(sweep_any(pred), taken, false_fn, *operands)


def tiered(needed: jax.Array, tiers: tuple[int, ...], fn, operand):
    """`fn(operand, w)` at the smallest static width w of ascending `tiers` that is >= `needed` (an i32 scalar; the
    largest tier when none is): one compiled branch per tier, of which one runs, also in a vectorised sweep."""
    if len(tiers) == 1:
        return fn(operand, tiers[0])
    return tier_switch(jnp.minimum(jnp.searchsorted(jnp.asarray(tiers), needed), len(tiers) - 1), tiers, fn, operand)


def tier_switch(index: jax.Array, tiers: tuple, fn, operand):
    """`fn(operand, tiers[index])` for an i32 scalar `index` (in a vectorised sweep the largest over the members, so
    later tiers must serve every member that asks for an earlier one): one compiled branch per static tier."""
    if len(tiers) == 1:
        return fn(operand, tiers[0])
    return jax.lax.switch(sweep_max(index), [lambda x, t=t: fn(x, t) for t in tiers], operand)


def fsdp_spec(shape: tuple[int, ...], fsdp: int) -> PartitionSpec:
    """PartitionSpec of one parameter-like array: its largest dimension divisible by `fsdp` split over `fsdp`
    (the first such on ties); replicated when none is, or when fsdp = 1."""
    if fsdp > 1:
        candidates = [i for i, n in enumerate(shape) if n % fsdp == 0 and n >= fsdp]
        if candidates:
            dim = max(candidates, key=lambda i: (shape[i], -i))
            return PartitionSpec(*([None] * dim), "fsdp")
    return PartitionSpec()


def state_shardings(state: Any, mesh: Mesh, stacked: bool = False) -> Any:
    """NamedShardings for a TrainState-like pytree (arrays or ShapeDtypeStructs): `fsdp_spec` per leaf, and with
    `stacked=True` (a sweep's stacked states) the leading member axis over `sweep`."""
    fsdp = mesh.shape["fsdp"]

    def sharding(x):
        shape = tuple(x.shape)
        if stacked:
            inner = fsdp_spec(shape[1:], fsdp)
            return NamedSharding(mesh, PartitionSpec(SWEEP_AXIS, *inner))
        return NamedSharding(mesh, fsdp_spec(shape, fsdp))

    return jax.tree.map(sharding, state)


def with_shardings(abstract: Any, shardings: Any) -> Any:
    """`jax.ShapeDtypeStruct`s of `abstract` carrying `shardings` (a restore target that lands sharded)."""
    return jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), abstract, shardings)


def replicated(mesh: Mesh) -> NamedSharding:
    return NamedSharding(mesh, PartitionSpec())

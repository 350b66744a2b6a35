"""The mesh and sharding rules (ragen_jax.sharding) on the 8 fake CPU devices, and the sweep-uniform branch helpers."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from configs import base
from ragen_jax import sharding
from ragen_jax.config import apply_overrides


def test_mesh_shape_and_devices():
    config = apply_overrides(base.get_config(), {"mesh.fsdp": 2, "mesh.sweep": 2})
    mesh = sharding.make_mesh(config)
    assert dict(mesh.shape) == {"sweep": 2, "data": 2, "fsdp": 2}
    subset = sharding.make_mesh(apply_overrides(base.get_config(), {"mesh.data": 2}))
    assert list(subset.devices.ravel()) == jax.devices()[:2]  # an explicit smaller mesh takes the first devices


@pytest.mark.parametrize("shape, fsdp, spec", [((64, 32), 2, P("fsdp")), ((6, 32), 4, P(None, "fsdp")),
                                               ((3, 5), 2, P()), ((8,), 1, P()), ((), 2, P()),
                                               ((16, 16), 4, P("fsdp"))])
def test_fsdp_spec_splits_the_largest_divisible_dimension(shape, fsdp, spec):
    assert sharding.fsdp_spec(shape, fsdp) == spec


def test_shard_batch_constrains_inside_a_mesh_only():
    x = {"rows": jnp.arange(16.0).reshape(8, 2), "odd": jnp.ones((3, 2)), "scalar": jnp.float32(1)}
    assert sharding.shard_batch(x) is x  # no ambient mesh: the identity
    mesh = sharding.make_mesh(apply_overrides(base.get_config(), {"mesh.fsdp": 2}))
    with jax.set_mesh(mesh):
        out = jax.jit(lambda t: sharding.shard_batch(jax.tree.map(lambda a: a * 2, t)))(x)
    assert out["rows"].sharding.spec == P(("data", "fsdp"))  # 8 rows over data 4 x fsdp 2
    np.testing.assert_array_equal(out["rows"], x["rows"] * 2)
    np.testing.assert_array_equal(out["odd"], x["odd"] * 2)  # 3 rows do not split: placed by GSPMD, same values


def test_sweep_helpers_keep_real_branches_under_a_sweep_vmap():
    def f(x):
        return jax.lax.cond(sharding.sweep_any(x > 0), lambda v: v * 2, lambda v: v, x), sharding.sweep_max(x)

    xs = jnp.array([-1.0, 3.0])
    jaxpr = str(jax.make_jaxpr(sharding.vmap_members(f))(xs))
    assert "cond[" in jaxpr and "pmax" in jaxpr  # one branch taken for all members, not a select of both
    doubled, top = sharding.vmap_members(f)(xs)
    np.testing.assert_array_equal(doubled, [-2.0, 6.0])  # the branch runs for every member once any needs it
    np.testing.assert_array_equal(top, [3.0, 3.0])
    assert "pmax" not in str(jax.make_jaxpr(jax.vmap(f))(xs))  # another vmap: no sweep axis, plain per-member
    # a vmap that merely names its axis "sweep" is not a sweep's: only vmap_members marks one
    assert "pmax" not in str(jax.make_jaxpr(jax.vmap(f, axis_name=sharding.SWEEP_AXIS))(xs))
    np.testing.assert_array_equal(f(jnp.float32(-1.0))[0], -1.0)  # outside a sweep: the value itself


def test_sweep_cond_is_one_branch_with_per_member_results():
    def f(x):
        return sharding.sweep_cond(x > 0, lambda v: v * 2, lambda v: -v, x)

    xs = jnp.array([-1.0, 3.0])
    jaxpr = str(jax.make_jaxpr(sharding.vmap_members(f))(xs))
    assert "cond[" in jaxpr
    np.testing.assert_array_equal(sharding.vmap_members(f)(xs), [1.0, 6.0])  # each its own branch
    np.testing.assert_array_equal(sharding.vmap_members(f)(jnp.array([-1.0, -3.0])), [1.0, 3.0])
    assert float(f(jnp.float32(2.0))) == 4.0 and float(f(jnp.float32(-2.0))) == 2.0  # outside a sweep: a plain cond


def test_tiered_runs_the_narrowest_width_holding_every_member():
    def f(needed, row):  # the width the branch ran at, and the row's sum over that width
        return sharding.tiered(needed, (4, 8, 12), lambda r, w: (jnp.int32(w), r[:w].sum()), row)

    rows = jnp.arange(24.0).reshape(2, 12)
    widths, sums = jax.vmap(f)(jnp.array([3, 6]), rows)  # another vmap: each member its own width
    np.testing.assert_array_equal(widths, [4, 8])
    np.testing.assert_array_equal(sums, [rows[0, :4].sum(), rows[1, :8].sum()])
    swept = sharding.vmap_members(f)
    assert "cond[" in str(jax.make_jaxpr(swept)(jnp.array([3, 6]), rows))
    np.testing.assert_array_equal(swept(jnp.array([3, 6]), rows)[0], [8, 8])  # a sweep: the widest member's width
    assert int(f(jnp.int32(9), rows[0])[0]) == 12 and int(f(jnp.int32(20), rows[0])[0]) == 12  # past the last: last
    assert int(f(jnp.int32(8), rows[0])[0]) == 8  # a width equal to the need holds it

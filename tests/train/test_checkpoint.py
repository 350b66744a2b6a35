"""Checkpointer: which steps are kept, bitwise round trip of a real TrainState (optax NamedTuples, None fields,
int/bool leaves, shardings), the JSON extra, donation right after an asynchronous save, and early errors."""
import errno
import os

import jax
import jax.numpy as jnp
import numpy as np
import optax
import orbax.checkpoint as ocp
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from ragen_jax.diagnostics import families
from ragen_jax.models import ModelConfig
from ragen_jax.models.transformer import init_params, init_value_params
from ragen_jax.train.checkpoint import Checkpointer, CheckpointWriteError
from ragen_jax.train.step import TrainState
from ragen_jax.train.update import UpdateConfig, optimizer_init

MODEL = ModelConfig(vocab_size=64, d_model=16, num_layers=1, num_heads=2, num_kv_heads=1, head_dim=8, mlp_dim=32,
                    max_seq_len=64)


@pytest.fixture(scope="module")
def base_state() -> TrainState:
    """A GAE-style state: actor + critic with AdamW states, no reference model (ref=None)."""
    key_actor, key_critic = jax.random.split(jax.random.key(0))
    actor = init_params(MODEL, key_actor)
    critic = init_value_params(MODEL, key_critic, actor)
    update_config = UpdateConfig()
    return TrainState(step=jnp.int32(0), actor=actor, actor_opt=optimizer_init(actor, update_config), critic=critic,
                      critic_opt=optimizer_init(critic, update_config), ref=None, collapse=families.init_state())


def state_at(base: TrainState, step: int) -> TrainState:
    """A distinct state per step: random floats everywhere (moments included), ints = step, bools = step odd."""
    rng = np.random.default_rng(step)

    def fill(leaf):
        if jnp.issubdtype(leaf.dtype, jnp.floating):
            return jnp.asarray(rng.normal(size=leaf.shape), leaf.dtype)
        if leaf.dtype == jnp.bool_:
            return jnp.full(leaf.shape, step % 2 == 1)
        return jnp.full(leaf.shape, step, leaf.dtype)

    return jax.tree.map(fill, base)


def assert_bitwise_equal(restored, expected):
    assert jax.tree.structure(restored) == jax.tree.structure(expected)
    for got, want in zip(jax.tree.leaves(restored), jax.tree.leaves(expected)):
        assert got.dtype == want.dtype and got.shape == want.shape
        assert np.asarray(got).tobytes() == np.asarray(want).tobytes()


def test_keeps_multiples_of_save_every_and_the_forced_final_step(tmp_path, base_state):
    with Checkpointer(tmp_path / "ckpt", max_to_keep=2, save_every=2) as ckpt:
        saved = [ckpt.save(s, state_at(base_state, s), {"step": s}, force=(s == 5)) for s in range(1, 6)]
        assert saved == [False, True, False, True, True]
        assert not ckpt.save(5, state_at(base_state, 5), {"step": 5}, force=True)  # never overwrites
        ckpt.wait()
        assert ckpt.all_steps() == [4, 5] and ckpt.latest_step() == 5
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir() if p.name.isdigit()) == ["4", "5"]


def test_restore_is_bitwise_with_the_original_structure(tmp_path, base_state):
    directory = str(tmp_path / "ckpt")
    extra = {"config": {"algo": {"kl_coef": 0.001, "name": "ppo"}, "sizes": [1, 2]}, "seed": 7,
             "metrics": {"success": 0.25, "nan": float("nan")}, "loader_position": 12}
    with Checkpointer(directory, max_to_keep=3, save_every=1) as ckpt:
        for s in (1, 2):
            ckpt.save(s, state_at(base_state, s), {**extra, "step": s})

    abstract = jax.eval_shape(lambda: base_state)
    with Checkpointer(directory) as ckpt:  # a new process resuming
        state, got_extra = ckpt.restore_latest(abstract)
        assert_bitwise_equal(state, state_at(base_state, 2))
        assert state.ref is None and isinstance(state.actor_opt[0], optax.ScaleByAdamState)
        assert isinstance(state.critic_opt[1], optax.EmptyState)
        nan = got_extra["metrics"].pop("nan")
        assert np.isnan(nan) and got_extra == {**extra, "step": 2, "metrics": {"success": 0.25}}
        older, older_extra = ckpt.restore(1, abstract)
        assert_bitwise_equal(older, state_at(base_state, 1))
        assert older_extra["step"] == 1


def test_restore_keeps_the_target_sharding(tmp_path, base_state):
    mesh = Mesh(np.array(jax.devices()[:8]), ("data",))
    shard_rows = NamedSharding(mesh, PartitionSpec("data"))
    replicated = NamedSharding(mesh, PartitionSpec())
    state = state_at(base_state, 3)
    state = jax.tree.map(lambda x: jax.device_put(x, shard_rows if x.shape[:1] == (64,) else replicated), state)
    with Checkpointer(tmp_path / "ckpt", save_every=1) as ckpt:
        ckpt.save(3, state, {})
        abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), state)
        restored, _ = ckpt.restore(3, abstract)
    assert_bitwise_equal(restored, state)
    embedding = restored.actor["embed"]["embedding"]
    assert embedding.sharding == shard_rows and len(embedding.addressable_shards) == 8
    assert all(r.sharding == s.sharding for r, s in zip(jax.tree.leaves(restored), jax.tree.leaves(state)))


def test_state_can_be_donated_right_after_save(tmp_path, base_state):
    state = state_at(base_state, 4)
    host_copy = jax.device_get(state)
    next_step = jax.jit(lambda s: jax.tree.map(lambda x: x + 1 if x.dtype != jnp.bool_ else ~x, s), donate_argnums=0)
    with Checkpointer(tmp_path / "ckpt", save_every=1) as ckpt:
        assert ckpt.save(4, state, {})
        # orbax holds host copies (zero-copy views on CPU, where XLA then copies instead of donating).
        stepped = next_step(state)
        restored, _ = ckpt.restore(4, jax.eval_shape(lambda: base_state))
    assert_bitwise_equal(restored, host_copy)
    np.testing.assert_array_equal(stepped.actor_opt[0].mu["embed"]["embedding"],
                                  host_copy.actor_opt[0].mu["embed"]["embedding"] + 1)


def test_restore_from_an_empty_or_missing_directory_names_it(tmp_path, base_state):
    directory = tmp_path / "never_written"
    with Checkpointer(directory) as ckpt:
        assert ckpt.latest_step() is None
        with pytest.raises(FileNotFoundError, match=str(directory)):
            ckpt.restore_latest(jax.eval_shape(lambda: base_state))
        with pytest.raises(FileNotFoundError, match=r"step 3 .*saved steps: \[\]"):
            ckpt.restore(3, jax.eval_shape(lambda: base_state))


def test_mismatched_target_names_the_differing_paths(tmp_path, base_state):
    with Checkpointer(tmp_path / "ckpt", save_every=1) as ckpt:
        ckpt.save(1, state_at(base_state, 1), {})
        abstract = jax.eval_shape(lambda: base_state)
        without_critic = abstract.replace(critic=None, critic_opt=None)
        with pytest.raises(ValueError, match=r"in the checkpoint but not in the target: critic/"):
            ckpt.restore(1, without_critic)
        with_ref = abstract.replace(ref=abstract.actor)
        with pytest.raises(ValueError, match=r"missing from the checkpoint: ref/embed/embedding"):
            ckpt.restore(1, with_ref)
        wider = jax.ShapeDtypeStruct((64, 32), jnp.float32)
        with pytest.raises(ValueError, match=r"actor/embed/embedding: checkpoint float32\[64, 16\], target float32"
                                             r"\[64, 32\]"):
            ckpt.restore(1, abstract.replace(actor={**abstract.actor, "embed": {"embedding": wider}}))
        with pytest.raises(ValueError, match=r"step: checkpoint int32\[\], target float32\[\]"):
            ckpt.restore(1, abstract.replace(step=jax.ShapeDtypeStruct((), jnp.float32)))


def test_bad_arguments_fail_early(tmp_path, base_state):
    with pytest.raises(ValueError, match="save_every"):
        Checkpointer(tmp_path, save_every=0)
    with pytest.raises(ValueError, match="max_to_keep"):
        Checkpointer(tmp_path, max_to_keep=0)
    with Checkpointer(tmp_path / "ckpt", save_every=1) as ckpt:
        with pytest.raises(TypeError, match=r"extra\['seed'\]"):
            ckpt.save(1, base_state, {"seed": np.int64(3)})
        assert ckpt.all_steps() == []


def test_a_full_disk_during_a_save_is_one_line_and_keeps_the_previous_checkpoint(tmp_path, base_state, monkeypatch):
    """The disk fills while step 2 is written (simulated: its JSON item's write raises ENOSPC after the arrays'
    write began): the error surfaces once, as one line naming the step, the folder and the newest complete step; the
    cut save stays a temporary folder, and a new Checkpointer (a restarted run) lists and restores step 1 exactly."""
    directory = str(tmp_path / "ckpt")

    async def disk_full(self, *args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    ckpt = Checkpointer(directory, save_every=1)
    ckpt.save(1, state_at(base_state, 1), {"step": 1})
    ckpt.wait()
    monkeypatch.setattr(ocp.JsonCheckpointHandler, "async_save", disk_full)
    with pytest.raises(CheckpointWriteError) as error:  # raised by the save or, once asynchronous, the next wait
        ckpt.save(2, state_at(base_state, 2), {"step": 2})
        ckpt.wait()
    assert str(error.value) == (f"checkpoint step 2 could not be written to {directory}: [Errno 28] No space left on "
                                "device (the newest complete checkpoint: step 1)")
    ckpt.close()  # reported once
    monkeypatch.undo()
    assert any(name.startswith("2.") and "tmp" in name for name in os.listdir(directory))
    with Checkpointer(directory) as restarted:
        assert restarted.all_steps() == [1]
        state, extra = restarted.restore_latest(jax.eval_shape(lambda: base_state))
        assert_bitwise_equal(state, state_at(base_state, 1)) and extra == {"step": 1}

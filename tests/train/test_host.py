"""The host loop's files (`train.host.RunFiles`): closed on any exit, so a run that fails mid-way leaves its newest
checkpoint loadable and its metrics on disk, and the same run started again resumes from it."""
from __future__ import annotations

import os

import flax
import jax.numpy as jnp
import numpy as np
import pytest

from configs import base
from ragen_jax.algos import presets
from ragen_jax.train.host import RunFiles
from ragen_jax.train.metrics import read_metrics


@flax.struct.dataclass
class State:
    step: jnp.ndarray
    w: jnp.ndarray


def test_an_exception_mid_run_leaves_a_loadable_checkpoint_and_closed_files(tmp_path):
    config = presets.apply_overrides(base.get_config(), {
        "checkpoint.dir": str(tmp_path / "checkpoints"), "checkpoint.save_freq": 1, "logging.dir": str(tmp_path),
        "logging.tensorboard": False, "logging.progress_bar": True})
    fresh = State(step=jnp.array(0), w=jnp.zeros(3))
    with pytest.raises(RuntimeError, match="step 2 failed"):
        with RunFiles(config, [config.logging.dir]) as files:
            state, extra = files.restore_or_start(fresh, lambda: fresh, log=None)
            assert extra is None
            bar = files.progress_bar(0, "train")
            assert not bar.disable
            state = State(step=jnp.array(1), w=jnp.arange(3.0))
            files.writers[0].write(1, {"loss": 0.5})
            files.checkpointer.save(1, state, {"early_stop": {}})  # asynchronous: completes on the way out
            raise RuntimeError("step 2 failed")
    assert files.writers[0]._file is None and bar.disable  # both closed (tqdm disables a closed bar)
    assert read_metrics(tmp_path) == [{"step": 1, "loss": 0.5}]

    lines = []
    with RunFiles(config, [config.logging.dir]) as files:
        state, extra = files.restore_or_start(fresh, lambda: fresh, log=lines.append)
    assert extra == {"early_stop": {}} and int(state.step) == 1
    np.testing.assert_array_equal(state.w, np.arange(3.0))
    assert lines == [f"resumed from step 1 in {os.path.join(tmp_path, 'checkpoints')}"]

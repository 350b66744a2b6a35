"""The host loop's files (`train.host.RunFiles`): closed on any exit, so a run that fails mid-way leaves its newest
checkpoint loadable and its metrics on disk, and the same run started again resumes from it; the host loop
(`train.loop.HostLoop`) keeps them so for a sweep too."""
from __future__ import annotations

import io
import os

import flax
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from configs import base
from ragen_jax import config as config_lib
from ragen_jax import sharding
from ragen_jax.train import sweep as sweep_lib
from ragen_jax.train.checkpoint import Checkpointer
from ragen_jax.train.host import RunFiles
from ragen_jax.train.metrics_log import read_metrics


class Terminal(io.StringIO):
    """A console that says it is a terminal (tqdm draws its bar into it)."""

    def isatty(self) -> bool:
        return True


@flax.struct.dataclass
class State:
    step: jnp.ndarray
    w: jnp.ndarray


def test_an_exception_mid_run_leaves_a_loadable_checkpoint_and_closed_files(tmp_path):
    config = config_lib.apply_overrides(base.get_config(), {
        "checkpoint.dir": str(tmp_path / "checkpoints"), "checkpoint.save_freq": 1, "logging.dir": str(tmp_path),
        "logging.tensorboard": False, "logging.progress_bar": True})
    fresh = State(step=jnp.array(0), w=jnp.zeros(3))
    with pytest.raises(RuntimeError, match="step 2 failed"):
        with RunFiles(config, [config.logging.dir]) as files:
            state, extra = files.restore_or_start(fresh, lambda: fresh, log=None)
            assert extra is None
            bar = files.progress(0, "train", log=None, file=Terminal()).bar
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


def test_progress_is_a_bar_with_the_step_postfix_on_a_terminal_and_one_line_per_step_elsewhere(tmp_path):
    config = config_lib.apply_overrides(base.get_config(), {"env.name": "bandit", "train.total_steps": 4,
                                                         "logging.progress_bar": True})
    steps = [{"bandit/success": 0.5, "rollout/in_group_reward_std": 0.25, "rollout/filter_kept_ratio": 0.875,
              "collapse_first_turn_sample/mi_zscore": 1.5, "timing_s/step": 2.0},
             {"bandit/success": 0.75, "rollout/in_group_reward_std": 0.125, "rollout/filter_kept_ratio": 1.0,
              "collapse_first_turn_sample/mi_zscore": float("nan"), "timing_s/step": 3.0}]
    console, lines = Terminal(), []
    with RunFiles(config, [None]) as files:
        progress = files.progress(1, "train", log=lines.append, file=console)
        progress.update(steps[0], "step 2 | ...")
        progress.update(steps[1], "step 3 | val-env/bandit/success 0.5", validated=True)
        assert progress.bar.n == 3 and progress.bar.total == 4
    text = console.getvalue()
    # the last postfix: the newest values, the MI z-score of the step before (NaN: not computed this step)
    assert "success=0.75, reward_std=0.125, kept=1, mi_z=1.5, s/step=3" in text
    assert "step 3 | val-env/bandit/success 0.5" in text and "step 2 | ..." not in text and lines == []

    plain = io.StringIO()  # not a terminal: no bar, every step's summary line to the log
    with RunFiles(config, [None]) as files:
        progress = files.progress(1, "train", log=lines.append, file=plain)
        progress.update(steps[0], "step 2 | ...")
        progress.write("early stop at step 2")
    assert progress.bar is None and plain.getvalue() == "" and lines == ["step 2 | ...", "early stop at step 2"]


class FailingSweep(sweep_lib.Sweep):
    """A sweep whose step only counts (nothing compiles but that) and fails on its `fail_at`-th call."""

    fail_at, calls = None, 0

    def step_fn(self, abstract_state):
        def step(state, *_):  # (state, metrics, training transcripts: none here, samples_every 0)
            return state.replace(step=state.step + 1), {"rollout/filter_kept_count": jnp.ones(self.size)}, {}
        replicated = sharding.replicated(self.mesh)
        return jax.jit(step, out_shardings=(self.state_sharding(abstract_state), replicated, replicated),
                       donate_argnums=0)

    def step_args(self, stopped):
        self.calls += 1
        if self.calls == self.fail_at:
            raise RuntimeError(f"step {self.calls} failed")
        return super().step_args(stopped)


def test_a_sweep_that_fails_mid_run_leaves_a_loadable_checkpoint_and_closed_files(tmp_path):
    config = config_lib.apply_overrides(base.get_config(), {
        "env.name": "bandit", "model.d_model": 32, "model.num_layers": 1, "model.num_heads": 2,
        "model.num_kv_heads": 1, "model.mlp_dim": 64, "train.sft_steps": 0, "train.total_steps": 3,
        "train.test_freq": 0, "logging.samples_every": 0, "mesh.sweep": 2, "checkpoint.save_freq": 1,
        "checkpoint.dir": str(tmp_path / "ckpt"), "logging.dir": str(tmp_path), "logging.tensorboard": False})
    points = [{"train.seed": 0}, {"train.seed": 1}]
    failing = FailingSweep(config, points, log=None)
    failing.fail_at = 2
    with pytest.raises(RuntimeError, match="step 2 failed"):
        failing.run()
    assert Checkpointer(str(tmp_path / "ckpt")).all_steps() == [1]  # the asynchronous save completed
    for name in failing.names:
        assert [r["step"] for r in read_metrics(tmp_path / name)] == [1]

    lines = []
    state, histories = FailingSweep(config, points, log=lines.append).run()  # the same sweep again: resumes
    assert f"resumed from step 1 in {tmp_path / 'ckpt'}" in lines and int(state.step) == 3
    assert [[r["rollout/filter_kept_count"] for r in h] for h in histories] == [[1.0, 1.0]] * 2
    for name in failing.names:
        assert [r["step"] for r in read_metrics(tmp_path / name)] == [1, 2, 3]

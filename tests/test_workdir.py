"""The run's workdir (`ragen_jax.workdir`): the dirs it defaults, the config.json it writes, the configs it refuses,
and what starting over drops (`train.host.start_over`). A real run in a workdir, resumed by the same command: tests/train/test_loop.py."""
from __future__ import annotations

import json
import os

import numpy as np
import pytest

from configs import base
from ragen_jax import workdir
from ragen_jax.train.checkpoint import Checkpointer
from ragen_jax.train.host import start_over
from ragen_jax.train.metrics_log import MetricsWriter, read_metrics


def test_dirs_and_resume_default_to_the_workdir_unless_the_command_line_sets_them(tmp_path):
    run = str(tmp_path / "run")
    config = base.get_config()
    config.checkpoint.resume = False  # a config file's setting gives way to the workdir
    placed = workdir.prepare(config, run)
    assert placed.logging.dir == run and placed.checkpoint.dir == os.path.join(run, "checkpoints")
    assert placed.checkpoint.resume
    kept = workdir.with_dirs(config, run, overridden={"checkpoint.dir", "checkpoint.resume"})
    assert kept.logging.dir == run and kept.checkpoint.dir == "" and not kept.checkpoint.resume
    with open(os.path.join(run, "config.json"), encoding="utf-8") as f:
        assert json.load(f) == json.loads(json.dumps(placed.to_dict()))
    assert workdir.read_config(run) == placed
    moved = str(tmp_path / "moved")
    os.rename(run, moved)
    assert workdir.read_config(moved).checkpoint.dir == os.path.join(moved, "checkpoints")


def test_another_config_is_refused_naming_its_keys_unless_it_starts_over(tmp_path):
    run = str(tmp_path / "run")
    workdir.prepare(base.get_config(), run)
    other = base.get_config()
    other.train.seed, other.filter.value = 3, 0.5
    with pytest.raises(workdir.WorkdirError, match=r"another config: filter.value \(1.0 -> 0.5\), train.seed \(0 -> 3\); "
                                                   r"rerun with its config, use a fresh --workdir, or pass "
                                                   r"--config.checkpoint.resume=False to start over"):
        workdir.prepare(other, run)
    other.checkpoint.resume = False
    workdir.prepare(other, run, overridden={"checkpoint.resume"})  # starts over: config.json rewritten
    assert workdir.read_config(run).train.seed == 3


def test_how_far_where_and_on_how_many_devices_may_change_on_resume(tmp_path):
    run = str(tmp_path / "run")
    workdir.prepare(base.get_config(), run)
    longer = base.get_config()
    longer.train.total_steps, longer.checkpoint.save_freq, longer.logging.every, longer.mesh.data = 400, 5, 2, 4
    assert workdir.prepare(longer, run).train.total_steps == 400
    assert workdir.read_config(run).train.total_steps == 400


def test_a_sweep_stores_its_members_next_to_the_config(tmp_path):
    run = str(tmp_path / "sweep")
    workdir.prepare(base.get_config(), run, extra={"sweep": [{"filter.value": 0.5}, {"filter.value": 1.0}]})
    with pytest.raises(workdir.WorkdirError, match=r"sweep \(\[\{\"filter.value\": 0.5\}, \{\"filter.value\": 1.0\}\] "
                                                   r"-> \[\{\"filter.value\": 0.5\}\]\)"):
        workdir.prepare(base.get_config(), run, extra={"sweep": [{"filter.value": 0.5}]})
    with pytest.raises(workdir.WorkdirError, match="holds a sweep"):
        workdir.read_config(run)
    with pytest.raises(workdir.WorkdirError, match="config.json does not exist"):
        workdir.read_config(str(tmp_path / "nothing"))


def test_starting_over_drops_the_earlier_runs_checkpoints_and_metrics(tmp_path):
    checkpointer = Checkpointer(tmp_path / "checkpoints")
    checkpointer.save(1, {"w": np.zeros(2)}, {}, force=True)
    writer = MetricsWriter(tmp_path, tensorboard=False)
    writer.write(1, {"loss": 1.0})
    start_over(checkpointer, [writer, MetricsWriter(None)])
    writer.write(1, {"loss": 2.0})
    writer.close()
    assert checkpointer.all_steps() == [] and read_metrics(tmp_path) == [{"step": 1, "loss": 2.0}]
    checkpointer.close()

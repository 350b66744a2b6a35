"""Vectorised sweeps: every member of one vmapped, sharded step (mesh sweep 2 x data 2 x fsdp 2 on the 8 fake
devices) computes what the plain single-device step computes for that member's config; structural keys are
refused."""
from __future__ import annotations

import json
import os
import shutil

import jax
import numpy as np
import pytest

from configs import base
from experiments import report
from ragen_jax import config as config_lib
from ragen_jax import metrics as metrics_lib
from ragen_jax.algos import presets
from ragen_jax.train import sweep as sweep_lib
from ragen_jax.train import transcripts
from ragen_jax.train.metrics_log import read_metrics
from tests.tiny import TINY_FROZEN_LAKE

TINY = {**TINY_FROZEN_LAKE, "diagnostics.num_samples": 4, "diagnostics.score_width_tiers": 1,
        "algo.score_width_tiers": 2, "train.sft_steps": 0, "train.total_steps": 2, "logging.tensorboard": False,
        "rollout.val_num_groups": 2, "train.test_freq": 1, "mesh.sweep": 2, "mesh.data": 2, "mesh.fsdp": 2,
        "logging.samples_every": 1}
CHECKPOINTS = {"checkpoint.save_freq": 1, "checkpoint.resume": False}
TIMED = ("timing_s/", "perf/generated_tokens_per_s")  # the metrics that depend on the machine's speed
# member 1's success is below a floor of 1.0 at the validations of steps 0 and 1: with patience 2 it stops at step 1
POINTS = [{"filter.value": 1.0, "train.seed": 0},
          {"filter.value": 0.5, "rollout.temperature": 0.7, "env.success_rate": 0.5, "train.seed": 1,
           "filter.val_success_floor": 1.0, "filter.val_success_patience": 2}]
NAMES = ["filter.value=1.0,train.seed=0",
         "filter.value=0.5,rollout.temperature=0.7,env.success_rate=0.5,train.seed=1,filter.val_success_floor=1.0,"
         "filter.val_success_patience=2"]


def config_for(run_dir: str, **overrides):
    config = presets.preset_config(base.get_config(), "grpo", filter="paper")
    return config_lib.apply_overrides(config, {**TINY, "logging.dir": run_dir,
                                            "checkpoint.dir": os.path.join(run_dir, "ckpt") if run_dir else "",
                                            **overrides})


def test_members_match_the_plain_step(tmp_path):
    run_dir = str(tmp_path / "run")
    sweep = sweep_lib.Sweep(config_for(run_dir, **CHECKPOINTS), POINTS, log=None)
    # the reference: the plain single-device step, run per member with that member's state, key and hyper
    plain = jax.jit(sweep.train_step)
    expected, states_after_1 = [], []
    for state, keys, hyper in zip(sweep.initial_states(), sweep.keys, sweep.hypers):
        rows = []
        for _ in range(2):
            state, metrics = plain(state, keys[2], hyper)
            rows.append({k: float(v) for k, v in metrics.items()})
            states_after_1.append(state) if len(rows) == 1 else None
        expected.append(rows)
    assert expected[0][0]["actor/entropy"] != expected[1][0]["actor/entropy"]  # the members do differ
    assert all(rows[0]["actor/grad_norm"] > 0 for rows in expected)  # and their updates are not empty

    final, histories = sweep.run()
    assert int(final.step) == 2 and jax.tree.leaves(final.actor)[0].shape[0] == 2
    leaf = max(jax.tree.leaves(final.actor), key=lambda x: x.size)
    assert leaf.sharding.spec[0] == "sweep" and "fsdp" in leaf.sharding.spec  # members over sweep, params over fsdp
    assert [len(h) for h in histories] == [2, 1]  # member 1 stopped at step 1
    for member, got_rows in enumerate(histories):
        for step, (want, got) in enumerate(zip(expected[member], got_rows), start=1):
            for key, value in want.items():
                np.testing.assert_allclose(got[key], value, rtol=2e-4, atol=2e-5,
                                           err_msg=f"member {member} step {step} {key}")
            assert "val-env/frozen_lake/success" in got  # validated every step (test_freq 1)
    # the stopped member's state is held at step 1: what its separate run would have ended with
    for got, want in zip(jax.tree.leaves(sweep_lib.unstack(final.actor, 1)), jax.tree.leaves(states_after_1[1].actor)):
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=2e-4, atol=2e-5)

    for name, history in zip(sweep.names, histories):
        rows = read_metrics(os.path.join(run_dir, name))
        assert [r["step"] for r in rows] == list(range(len(history) + 1))
        assert rows[1]["actor/pg_loss"] == pytest.approx(history[0]["actor/pg_loss"])
        # timings in every row, the shared step's compile time in the first step's; a member's own token count
        assert "timing_s/compile_testing" in rows[0] and "timing_s/compile_step" in rows[1]
        assert rows[1]["perf/generated_tokens"] == round(rows[1]["response_length/mean"] * 4 *
                                                         rows[1]["frozen_lake/num_turns"])
        # each validated step's transcripts: the member's whole validation batch (2 trajectories), so their
        # rewards average to the row's validation reward; from step 1 also the member's whole training batch (4)
        assert sorted(os.listdir(os.path.join(run_dir, name, "samples"))) == sorted(
            [f"step_{r['step']}.jsonl" for r in rows] + [f"train_step_{r['step']}.jsonl" for r in rows[1:]])
        for row in rows:
            for batch, key in (("val", "val-env/frozen_lake/episode_reward"), ("train", "frozen_lake/episode_reward")):
                if batch == "train" and row["step"] == 0:
                    continue
                with open(transcripts.path(os.path.join(run_dir, name), row["step"], batch), encoding="utf-8") as f:
                    samples = [json.loads(line) for line in f]
                assert np.mean([t["episode_reward"] for t in samples]) == pytest.approx(row[key], abs=1e-6), batch
    with open(os.path.join(run_dir, "sweep.json"), encoding="utf-8") as f:
        summary = json.load(f)
    assert summary["names"] == NAMES and summary["early_stop"][0] == {}
    assert summary["early_stop"][1]["step"] == 1 and "validation success" in summary["early_stop"][1]["reason"]
    members = metrics_lib.sweep_rows(run_dir)
    assert list(members) == sweep.names and report.env_name(members[sweep.names[0]]) == "frozen_lake"
    columns = metrics_lib.load(run_dir)  # the notebook view: one dict of columns per member
    assert list(columns) == sweep.names and list(columns[sweep.names[1]]["step"]) == [0, 1]
    assert columns[sweep.names[0]]["actor/pg_loss"][2] == pytest.approx(histories[0][1]["actor/pg_loss"])
    assert os.path.getsize(report.plot_members(members, str(tmp_path / "report.png"))) > 10_000

    # interrupted after step 1: the resumed sweep repeats step 2 exactly (same compiled program, restored state and
    # stop records: member 1 stays stopped)
    resumed_dir = str(tmp_path / "resumed")
    shutil.copytree(run_dir, resumed_dir)
    shutil.rmtree(os.path.join(resumed_dir, "ckpt", "2"))
    # Fresh trace caches, as a resumed process would have: with the caches this process has filled (the plain step,
    # two sweep programs), JAX's LRU trace caches evict mid-trace and the validator lowers with a few nested functions
    # duplicated, a different module that misses the compilation cache (~30 s to compile again).
    jax.clear_caches()
    _, resumed = sweep_lib.Sweep(config_for(resumed_dir, **{**CHECKPOINTS, "checkpoint.resume": True}), POINTS,
                                 log=None).run()
    assert [len(h) for h in resumed] == [1, 0]
    drop_time = lambda m: {k: v for k, v in m.items() if not k.startswith(TIMED)}  # noqa: E731
    np.testing.assert_equal(drop_time(resumed[0][0]), drop_time(histories[0][1]))
    assert [r["step"] for r in read_metrics(os.path.join(resumed_dir, sweep.names[0]))] == [0, 1, 2]


def test_grid_and_refusals():
    assert sweep_lib.grid({"filter.value": [0.5, 1.0], "train.seed": [0, 1]}) == [
        {"filter.value": 0.5, "train.seed": 0}, {"filter.value": 0.5, "train.seed": 1},
        {"filter.value": 1.0, "train.seed": 0}, {"filter.value": 1.0, "train.seed": 1}]
    config = config_for("")
    with pytest.raises(config_lib.ConfigError, match="config.filter.strategy = 'top_k' is invalid: not sweepable"):
        sweep_lib.Sweep(config, [{"filter.strategy": "top_k"}], log=None)
    with pytest.raises(config_lib.ConfigError, match="config.mesh.sweep = 2 is invalid: must divide the 3 sweep members"):
        sweep_lib.Sweep(config, [{"train.seed": s} for s in range(3)], log=None)
    with pytest.raises(config_lib.ConfigError, match="config.filter.value = 1.5"):
        sweep_lib.Sweep(config, [{"filter.value": 1.5}, {"filter.value": 1.0}], log=None)
    with pytest.raises(config_lib.ConfigError, match="config.logging.phase_timings = True is invalid: a vectorised"):
        sweep_lib.Sweep(config_for("", **{"logging.phase_timings": True}), [{}, {}], log=None)


def test_a_looped_phase_computes_what_the_vmapped_one_does():
    """`Sweep.over_members`: a phase looped over the members (`mesh.sweep_loop_phases`) gives each member what vmap
    gives it: stacked state parts, per-member keys and inputs indexed, shared hyperparameters (here the learning
    rate, the same for both members) passed whole, and the update phase's step counter kept unbatched."""
    config = config_for("", **{"mesh.sweep": 1, "mesh.sweep_loop_phases": "update"})
    sweep = sweep_lib.Sweep(config, [{"train.seed": 0}, {"train.seed": 1, "filter.value": 0.5}], log=None)
    stacked = sweep.stack_states(sweep.initial_states())
    axes = sweep._state_axes(stacked)
    hyper, hyper_axes, _ = sweep.hyper()
    keys, inputs = sweep._step_inputs[0], np.array([[1.0, 2.0], [3.0, 4.0]], np.float32)

    def update(state, key, hyper, x):
        noise = jax.random.uniform(key, ())
        actor = jax.tree.map(lambda p: p * (1.0 + hyper.actor.lr * x.sum()) + noise * hyper.filter_value, state.actor)
        return state.replace(actor=actor, step=state.step + 1), {"m": x.sum() * noise}

    def run(loop_phases):
        sweep.loop_phases = loop_phases
        return jax.jit(sweep.over_members("update", update, axes, hyper_axes))(stacked, keys, hyper, inputs)

    assert hyper_axes.actor.lr is None and hyper_axes.filter_value == 0  # one shared leaf, one stacked
    (looped, looped_metrics), (vmapped, vmapped_metrics) = run(("update",)), run(())
    assert looped.step.shape == () and int(looped.step) == int(stacked.step) + 1
    np.testing.assert_allclose(looped_metrics["m"], vmapped_metrics["m"], rtol=1e-6)
    for a, b in zip(jax.tree.leaves(looped.actor), jax.tree.leaves(vmapped.actor)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-6, atol=1e-7)
    with pytest.raises(config_lib.ConfigError, match="sweep_loop_phases = 'update' is invalid: loops over the"):
        config_lib.validate(config_for("", **{"mesh.sweep_loop_phases": "update"}))
    with pytest.raises(config_lib.ConfigError, match="allowed values are 'rollout'"):
        config_lib.validate(config_for("", **{"mesh.sweep": 1, "mesh.sweep_loop_phases": "prepare,updates"}))

"""The host loop: SFT warm start, steps, metrics.jsonl and checkpoints; a resumed run repeats an uninterrupted one
exactly (docs/architecture.md, design rule 10); the demo config and the report script work."""
from __future__ import annotations

import inspect
import json
import os
import re
import shutil
import socket
import subprocess
import sys

import jax
import numpy as np
import pytest

from configs import base
from environments import axis_words
from environments.faithfulness import cell_fact, score
from experiments import evaluate as evaluate_cli
from experiments import report
from experiments import train as train_cli
from ragen_jax import config as config_lib
from ragen_jax import distributed
from ragen_jax.algos import presets
from ragen_jax.train import sft, transcripts
from ragen_jax.train.checkpoint import Checkpointer
from ragen_jax.train.loop import run_keys, train
from ragen_jax.train.metrics_log import read_metrics
from tests.tiny import TINY_FROZEN_LAKE

TINY = {**TINY_FROZEN_LAKE, "diagnostics.num_samples": 4, "diagnostics.score_width_tiers": 1,
        "algo.score_width_tiers": 1, "train.sft_steps": 3, "train.sft_batch_size": 2, "train.total_steps": 2,
        "checkpoint.save_freq": 1, "logging.tensorboard": False, "rollout.val_num_groups": 2, "train.test_freq": 2,
        "mesh.data": 2,  # 2 devices: each holds half the batch
        "logging.samples_every": 0}
TIMED = ("timing_s/", "perf/generated_tokens_per_s")  # the metrics that depend on the machine's speed
WARM_START = sft.warm_start


def config_for(run_dir: str, **overrides):
    config = presets.preset_config(base.get_config(), "grpo", filter="paper")
    return config_lib.apply_overrides(config, {**TINY, "checkpoint.dir": os.path.join(run_dir, "ckpt"),
                                            "logging.dir": run_dir, **overrides})


def test_resumed_run_repeats_the_uninterrupted_one(tmp_path, monkeypatch):
    full, resumed = str(tmp_path / "full"), str(tmp_path / "resumed")
    lines = []
    # The SFT warm start (train.sft_steps 3) is recorded, not run (its programs would be compiled for this test
    # alone): what it computes is tested by tests/test_warm_start.py (through the loop's `initial_params`) and
    # tests/train/test_learning.py. Here: the run hands it the config's settings and its SFT key, once; the resumed
    # run, restored from its checkpoint, does not warm-start again.
    warm_starts = []

    def recorded_warm_start(*args, **kwargs):
        warm_starts.append(inspect.signature(WARM_START).bind(*args, **kwargs).arguments)
        return warm_starts[-1]["params"], []

    monkeypatch.setattr(sft, "warm_start", recorded_warm_start)
    state, history = train(config_for(full, **SAMPLED), log=lines.append)
    assert [(w["steps"], w["batch_size"], w["oracle_prob"]) for w in warm_starts] == [(3, 2, 1.0)]
    np.testing.assert_array_equal(jax.random.key_data(warm_starts[0]["key"]), jax.random.key_data(run_keys(0)[1]))
    assert int(state.step) == 2 and len(history) == 2
    rows = read_metrics(full)
    assert [r["step"] for r in rows] == [0, 1, 2] and np.isfinite(rows[1]["frozen_lake/episode_reward"])
    # validation before training and at the last step (test_freq 2), on the same fixed prompts
    assert "val-env/frozen_lake/success" in rows[0] and "val-env/frozen_lake/success" in rows[2]
    assert "val-env/frozen_lake/success" not in rows[1]
    assert rows[0]["val-env/frozen_lake/num_turns"] > 0
    check_timings(rows, lines)
    # transcripts at steps 0 and 2 (samples_every 2): the validation rollout's first trajectories, and at step 2 the
    # training batch's (no training batch at step 0)
    assert sorted(os.listdir(os.path.join(full, "samples"))) == ["step_0.jsonl", "step_2.jsonl", "train_step_2.jsonl"]
    step, samples = transcripts.newest(full)
    assert step == 2 and len(samples) == 2 and samples[0]["chat"].startswith("<|system|>")  # val batch: 2 x 1
    rewards = [t["episode_reward"] for t in samples]  # the whole validation batch: its mean is the row's
    assert np.mean(rewards) == pytest.approx(rows[2]["val-env/frozen_lake/episode_reward"], abs=1e-6)
    assert [t["turn"] for t in samples[0]["turns"]] == list(range(1, len(samples[0]["turns"]) + 1))
    check_training_transcripts(full, rows[2])
    check_faithfulness(full, rows)
    assert any(line.startswith("mesh {'sweep': 1, 'data': 2, 'fsdp': 1} over 2 of 8 devices") for line in lines)
    assert Checkpointer(os.path.join(full, "ckpt")).all_steps() == [1, 2]

    # interrupt after step 1: keep its checkpoint and metrics, then resume to step 2
    shutil.copytree(full, resumed)
    shutil.rmtree(os.path.join(resumed, "ckpt", "2"))
    os.remove(os.path.join(resumed, "samples", "step_2.jsonl"))
    os.remove(os.path.join(resumed, "samples", "train_step_2.jsonl"))
    resumed_state, resumed_history = train(config_for(resumed, **SAMPLED, **{"checkpoint.resume": True}),
                                           log=lines.append)
    assert any(line.startswith("resumed from step 1") for line in lines)
    assert len(warm_starts) == 1  # no second warm start
    assert len(resumed_history) == 1 and "timing_s/compile_step" in resumed_history[0]  # this process's first step
    assert transcripts.newest(resumed) == (2, samples)  # the resumed run writes the same transcripts
    assert transcripts.newest(resumed, "train") == transcripts.newest(full, "train")
    drop_time = lambda m: {k: v for k, v in m.items() if not k.startswith(TIMED)}  # noqa: E731
    np.testing.assert_equal(drop_time(resumed_history[0]), drop_time(history[1]))  # NaN == NaN here
    for a, b in zip(jax.tree.leaves(state.actor), jax.tree.leaves(resumed_state.actor)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert [r["step"] for r in read_metrics(resumed)] == [0, 1, 2]

    png = report.plot(read_metrics(resumed), str(tmp_path / "report.png"))
    assert os.path.getsize(png) > 10_000


SAMPLED = {"logging.samples_every": 2, "diagnostics.faithfulness_prompts": 2}


def check_faithfulness(run_dir: str, rows: list[dict]):
    """val-faithfulness/ at the validation steps only, and equal to the score of the validation transcripts (the whole
    batch of 2) against the facts of the observation in their chat text."""
    assert "val-faithfulness/frozen_lake" not in rows[1]
    for row in (rows[0], rows[2]):
        with open(transcripts.path(run_dir, row["step"]), encoding="utf-8") as f:
            samples = [json.loads(line) for line in f]
        scores = []
        for sample in samples:
            observation = sample["chat"][sample["chat"].index("Turn 1:"):]
            player, goal = (tuple(int(x) for x in re.search(label + r": \((\d+), (\d+)\)", observation).groups())
                            for label in ("Player", "Goal"))
            facts = (cell_fact("Player", player), cell_fact("Goal", goal), *axis_words.tail_facts(player, goal))
            scores.append(score(facts, sample["turns"][0]["reasoning"] if sample["turns"] else ""))
        assert row["val-faithfulness/frozen_lake"] == pytest.approx(np.mean(scores))


def check_training_transcripts(run_dir: str, row: dict):
    """The training batch's transcripts of `row`'s step: the whole batch (2 groups x 2 = transcripts.COUNT), so their
    rewards and success average to the row's; each decodes to a chat holding its turns' responses in order."""
    step, samples = transcripts.newest(run_dir, "train")
    assert step == row["step"] and [t["group"] for t in samples] == [0, 0, 1, 1]
    assert np.mean([t["episode_reward"] for t in samples]) == pytest.approx(row["frozen_lake/episode_reward"], abs=1e-6)
    assert np.mean([t["success"] for t in samples]) == pytest.approx(row["frozen_lake/success"], abs=1e-6)
    for sample in samples:
        assert sample["chat"].startswith("<|system|>") and 1 <= len(sample["turns"]) <= 2
        position = 0
        for turn in sample["turns"]:
            position = sample["chat"].index("<think>" + turn["response"], position) + 1


def check_timings(rows, lines):
    """RAGEN's timing_s/* family and the throughput (docs: train/loop.py): the step and validation times in their
    rows, each program's compile time in the row of its first call (and a console line), generated tokens."""
    val, first, second = rows
    assert val["timing_s/testing"] > 0 and val["timing_s/compile_testing"] > 0 and val["timing_s/lower_testing"] > 0
    assert first["timing_s/compile_step"] > 0 and first["timing_s/lower_step"] > 0 and first["timing_s/step"] > 0
    assert "timing_s/compile_step" not in second and "timing_s/compile_testing" not in second
    assert second["timing_s/step"] > 0 and second["timing_s/testing"] > 0 and "timing_s/testing" not in first
    assert sum(line.startswith("compiled step in ") for line in lines) == 1
    # tokens sampled: per taken turn x taken turns x B = 4 trajectories (2 groups x 2), at most 16 per turn
    for row in (first, second):
        tokens = row["response_length/mean"] * row["frozen_lake/num_turns"] * 4
        assert row["perf/generated_tokens"] == round(tokens) and 0 < tokens <= 4 * 2 * 16
        assert row["perf/generated_tokens_per_s"] == pytest.approx(row["perf/generated_tokens"] / row["timing_s/step"])


EMPTY_FILTER = {"rollout.temperature": 0.0, "filter.include_zero": False, "filter.empty_stop_steps": 1,
                "train.total_steps": 3, "train.sft_steps": 0, "train.test_freq": 0, "mesh.data": 1, "mesh.fsdp": 2,
                "diagnostics.collapse_every": 0}  # a smaller program: compiled three times (once per process)


@pytest.fixture(scope="module")
def empty_filter_run(tmp_path_factory):
    """Greedy rollouts give every member of a group the same trajectory (zero reward variance); with zero-variance
    groups excluded the filter keeps nothing, and one such step is enough to stop (docs/filtering.md). fsdp = 2 over 2
    devices: parameters split, the batch split over both."""
    run_dir, lines = str(tmp_path_factory.mktemp("empty_filter")), []
    state, history = train(config_for(run_dir, **EMPTY_FILTER), log=lines.append)
    return run_dir, state, history, lines


def test_empty_filter_stops_early(empty_filter_run):
    run_dir, state, history, lines = empty_filter_run
    assert len(history) == 1 and int(state.step) == 1 and history[0]["rollout/filter_kept_count"] == 0
    assert any(line.startswith("early stop at step 1: the filter kept no group") for line in lines)
    assert Checkpointer(os.path.join(run_dir, "ckpt")).all_steps() == [1]
    # every parameter with an even dimension is split over the fsdp axis, the rest replicated
    specs = [leaf.sharding.spec for leaf in jax.tree.leaves(state.actor)]
    assert any("fsdp" in spec for spec in specs) and all(leaf.sharding.mesh.shape["fsdp"] == 2
                                                         for leaf in jax.tree.leaves(state.actor))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_processes_repeat_the_one_process_run(empty_filter_run, tmp_path):
    """The same run as two processes of one CPU device each (jax.distributed over gloo, design rule 4): fsdp now
    splits the parameters across processes. Both processes see the one-process run's metrics; only process 0
    writes metrics and prints; the checkpoint is written by both together."""
    _, _, expected, _ = empty_filter_run
    worker = os.path.join(os.path.dirname(os.path.abspath(__file__)), "multihost_worker.py")
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    env.update({distributed.COORDINATOR: f"127.0.0.1:{_free_port()}", distributed.NUM_PROCESSES: "2",
                "JAX_COMPILATION_CACHE_DIR": str(tmp_path / "xla")})  # kept by logging.compilation_cache "auto"
    procs = [subprocess.Popen([sys.executable, worker, str(tmp_path), json.dumps(EMPTY_FILTER)],
                              env={**env, distributed.PROCESS_ID: str(i)}, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True) for i in range(2)]
    try:
        outputs = [p.communicate(timeout=400)[0] for p in procs]
    finally:
        for p in procs:
            p.kill()  # a process whose peer died would wait for it
    assert all(p.returncode == 0 for p in procs), outputs
    histories = [json.loads(line[len("HISTORY "):]) for out in outputs for line in out.splitlines()
                 if line.startswith("HISTORY ")]
    assert len(histories) == 2 and len(histories[0]) == len(expected) == 1
    drop_time = lambda m: {k: v for k, v in m.items() if not k.startswith(TIMED)}  # noqa: E731
    assert drop_time(histories[0][0]) == drop_time(histories[1][0])  # one global program: identical values
    for key, value in drop_time(expected[0]).items():
        np.testing.assert_allclose(histories[0][0][key], value, rtol=1e-4, atol=1e-5, err_msg=key)
    assert "early stop at step 1" in outputs[0] and "early stop at step 1" not in outputs[1]
    assert [r["step"] for r in read_metrics(str(tmp_path))] == [1]
    assert Checkpointer(os.path.join(str(tmp_path), "ckpt")).all_steps() == [1]


def test_low_validation_success_stops_before_training(tmp_path):
    """The untrained policy's success rates are below a floor of 1.0, so with patience 1 the evaluation before
    training stops the run (docs/filtering.md#early-stops, rule 3): no step runs, and the step-0 row holds the
    validation metrics."""
    lines = []
    config = config_for(str(tmp_path), **{"filter.val_success_floor": 1.0, "filter.val_success_patience": 1,
                                          "train.sft_steps": 0, "checkpoint.dir": ""})
    state, history = train(config, log=lines.append)
    assert int(state.step) == 0 and history == []
    assert any("early stop at step 0: validation success below 1.0" in line for line in lines)
    assert [r["step"] for r in read_metrics(str(tmp_path))] == [0]


def test_workdir_run_resumes_when_run_again_and_refuses_another_config(tmp_path, capsys):
    """`ragen-train --workdir=DIR` (ragen_jax/workdir.py) on the config above (its compiled programs are cached;
    one step, no SFT or validation, to keep it short): config.json, metrics and checkpoints/ land in DIR; the same
    command again resumes (at its last step: nothing left to run); another config is refused naming its keys;
    ragen-eval restores a checkpoint and writes its evaluation and transcripts. The loop's resume itself: the test
    above."""
    jax.clear_caches()  # as in a new process: the trace caches filled by the tests above would change the lowered
    # step (tests/conftest.py, fresh_jax_caches) and miss its compiled program in the cache
    config_file = tmp_path / "tiny.py"
    config_file.write_text("from configs import base\nfrom ragen_jax import config as config_lib\n"
                           "from ragen_jax.algos import presets\n\n\ndef get_config():\n"
                           "    config = presets.preset_config(base.get_config(), 'grpo', filter='paper')\n"
                           f"    return config_lib.apply_overrides(config, {TINY!r})\n")
    run = str(tmp_path / "run")
    command = ["ragen-train", f"--config={config_file}", f"--workdir={run}", "--config.train.sft_steps=0",
               "--config.train.test_freq=0", "--config.train.total_steps=1"]
    train_cli.main(command)
    with open(os.path.join(run, "config.json"), encoding="utf-8") as f:
        stored = json.load(f)
    assert stored["logging"]["dir"] == run and stored["checkpoint"]["dir"] == os.path.join(run, "checkpoints")
    checkpoints = lambda: Checkpointer(os.path.join(run, "checkpoints")).all_steps()  # noqa: E731
    assert [r["step"] for r in read_metrics(run)] == [1] and checkpoints() == [1]

    train_cli.main(command)  # resumes at its last step: nothing left to run
    assert "resumed from step 1" in capsys.readouterr().out
    assert [r["step"] for r in read_metrics(run)] == [1] and checkpoints() == [1]

    with pytest.raises(SystemExit):
        train_cli.main(command + ["--config.train.seed=1"])
    assert "another config: train.seed (0 -> 1);" in capsys.readouterr().err

    # ragen-eval: checkpoint 1, 3 fixed prompts, two temperatures in one compiled program, collapse diagnostics
    evaluate_cli.main(["ragen-eval", f"--workdir={run}", "--step=1", "--num_prompts=3", "--temperatures=0,0.5"])
    out = capsys.readouterr().out
    assert f"restored step 1 from {os.path.join(run, 'checkpoints')}" in out and "temperature 0.5 | success" in out
    assert f"wrote {os.path.join(run, 'eval', 'step_1.json')}" in out
    with open(os.path.join(run, "eval", "step_1.json"), encoding="utf-8") as f:
        summary = json.load(f)
    assert (summary["step"], summary["env"], summary["num_prompts"]) == (1, "frozen_lake", 3)
    assert list(summary["temperatures"]) == ["0", "0.5"]
    step, rows = transcripts.newest(os.path.join(run, "eval"))
    assert step == 1 and [r["temperature"] for r in rows] == [0.0] * 3 + [0.5] * 3  # the whole batch of 3 each
    for temperature, metrics in summary["temperatures"].items():
        # the untrained policy rarely closes a <think>: the MI estimates may be NaN, their keys are there
        assert 0 <= metrics["collapse/valid_thinking_rate"] <= 1 and "collapse_first_turn_sample/mi_zscore" in metrics
        assert 0 <= metrics["val-env/frozen_lake/pass@1"] <= 1
        rewards = [r["episode_reward"] for r in rows if r["temperature"] == float(temperature)]
        assert np.mean(rewards) == pytest.approx(metrics["val-env/frozen_lake/episode_reward"], abs=1e-6)
    with pytest.raises(SystemExit):
        evaluate_cli.main(["ragen-eval", f"--workdir={run}", "--step=5"])
    assert f"no checkpoint of step 5 in {os.path.join(run, 'checkpoints')}: it holds steps 1" in capsys.readouterr().err

"""Preemption: a `ragen-train --workdir` process killed with SIGKILL at random moments (during the SFT warm start,
inside a step, while a checkpoint is being written) and started again each time resumes from its newest complete
checkpoint, never from a partly written one, and ends with exactly the metrics of an uninterrupted run
(docs/architecture.md, design rule 10). The processes share the suite's compilation cache (tests/conftest.py), so a
restart loads its programs instead of compiling them."""
from __future__ import annotations

import os
import random
import re
import signal
import subprocess
import sys
import time

import jax
import numpy as np

from configs import base
from ragen_jax import config as config_lib
from ragen_jax.algos import presets
from ragen_jax.train.checkpoint import Checkpointer
from ragen_jax.train.loop import train
from ragen_jax.train.metrics_log import read_metrics
from tests.tiny import TINY_BATCH, TINY_MODEL

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TINY = {"env.name": "bandit", **TINY_BATCH, "rollout.max_turn": 1, "rollout.max_actions_per_turn": 1,
        "rollout.max_model_len": 720, "algo.score_width_tiers": 1, "diagnostics.collapse_every": 0,
        **TINY_MODEL, "model.d_model": 16, "model.mlp_dim": 32, "model.max_seq_len": 736,  # half the usual width
        "train.sft_steps": 12, "optim.actor_lr": 1e-2, "train.sft_batch_size": 2, "train.total_steps": 10,
        "train.test_freq": 0, "checkpoint.save_freq": 1, "logging.tensorboard": False, "logging.samples_every": 0,
        "mesh.data": 1}
TIMED = ("timing_s/", "perf/")  # the metrics that depend on the machine's speed
KILLS = ("sft", "step", "checkpoint")  # the moment each process is killed at; a final process then runs to the end


def config_file(folder) -> str:
    path = os.path.join(folder, "tiny.py")
    with open(path, "w", encoding="utf-8") as f:
        f.write("from configs import base\nfrom ragen_jax import config as config_lib\n"
                "from ragen_jax.algos import presets\n\n\ndef get_config():\n"
                "    config = presets.preset_config(base.get_config(), 'grpo', filter='paper')\n"
                f"    return config_lib.apply_overrides(config, {TINY!r})\n")
    return path


def temporary_folders(folder: str) -> set[str]:
    """orbax's folders of saves in progress (`<step>.orbax-checkpoint-tmp-<n>`), or left by a killed process."""
    return {name for name in os.listdir(folder) if "tmp" in name} if os.path.isdir(folder) else set()


def start(command: list[str], env: dict) -> subprocess.Popen:
    return subprocess.Popen(command, env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            bufsize=1)


def kill_at(process: subprocess.Popen, moment: str, checkpoints: str, rng: random.Random) -> list[str]:
    """Reads the process's lines until `moment`, then SIGKILLs it: "sft" a random 0-1 s after the run's banner (the
    warm start is loading its programs or running its 12 steps), "step" a random 0-0.5 s after a step's line (the next
    step, or the checkpoint of this one, is running), "checkpoint" as soon as a new checkpoint is being written.
    Returns the lines."""
    lines, left_over = [], temporary_folders(checkpoints)
    os.set_blocking(process.stdout.fileno(), False)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and process.poll() is None:
        line = process.stdout.readline()
        if line:
            lines.append(line.rstrip("\n"))
        if moment == "sft" and line.startswith("mesh "):
            time.sleep(rng.uniform(0, 1))
            break
        if moment == "step" and re.match(r"step \d+ \|", line):
            time.sleep(rng.uniform(0, 0.5))
            break
        if moment == "checkpoint" and temporary_folders(checkpoints) - left_over:
            break
        if not line:
            time.sleep(0.005)
    assert process.poll() is None, f"the run ended before the {moment!r} kill:\n" + "\n".join(lines)
    process.send_signal(signal.SIGKILL)
    process.wait()
    return lines


def test_sigkilled_runs_resume_to_the_uninterrupted_metrics(tmp_path):
    expected_config = config_lib.apply_overrides(presets.preset_config(base.get_config(), "grpo", filter="paper"),
                                              {**TINY, "logging.dir": str(tmp_path / "full"), "checkpoint.dir": ""})
    train(expected_config, log=None)  # compiles the programs into the shared cache
    expected = read_metrics(str(tmp_path / "full"))

    run = str(tmp_path / "run")
    checkpoints = os.path.join(run, "checkpoints")
    command = [sys.executable, "-m", "experiments.train", f"--config={config_file(tmp_path)}", f"--workdir={run}"]
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "JAX_COMPILATION_CACHE_DIR": jax.config.jax_compilation_cache_dir,
           "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0", "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "0"}
    rng = random.Random(0)
    newest, partial = None, []  # the newest complete checkpoint when the last process was killed; cut saves' steps
    for moment in KILLS:
        lines = kill_at(start(command, env), moment, checkpoints, rng)
        resumed = [int(m.group(1)) for m in map(re.compile(r"resumed from step (\d+)").match, lines) if m]
        assert resumed == ([] if newest is None else [newest]), lines
        if moment == "sft":
            assert not any(line.startswith("sft 12/12") or line.startswith("step ") for line in lines), lines
        newest = Checkpointer(checkpoints).latest_step()  # a partly written step is not listed
        cut = [int(name.split(".")[0]) for name in temporary_folders(checkpoints)]
        partial += [step for step in cut if step > (newest or 0)]  # the next process must not resume from these
    assert partial, "no kill caught a checkpoint being written"
    final = start(command, env)
    output = final.communicate(timeout=300)[0]
    assert final.returncode == 0, output
    assert f"resumed from step {newest} in {checkpoints}" in output
    drop_time = lambda row: {k: v for k, v in row.items() if not k.startswith(TIMED)}  # noqa: E731
    rows = read_metrics(run)
    assert [r["step"] for r in rows] == [r["step"] for r in expected] == list(range(1, 11))
    for got, want in zip(rows, expected):
        np.testing.assert_equal(drop_time(got), drop_time(want))  # exactly; NaN == NaN here

"""Bad input through the installed console scripts (issue 12 item 2): exit code 2, one line on stderr naming the
file, tensor or key, no traceback, and an existing workdir's files left exactly as they were. The four commands
run side by side, as each start imports JAX; the in-process cases: tests/test_bad_input.py."""
from __future__ import annotations

import os
import subprocess
import sys

from ragen_jax import config as config_lib
from ragen_jax import workdir
from ragen_jax.models import hf
from tests.test_bad_input import TENSOR, _drop_a_shard, _snapshot, _tokenizer_file, save_tiny_model

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.path.dirname(sys.executable)
TINY_RUN = "--config=configs/bandit.py:tiny"


def _old_run(folder: str, seed: int) -> str:
    """A workdir holding a TINY_RUN with `train.seed` = seed: its config.json, a metrics line and a checkpoint file."""
    workdir.prepare(config_lib.load(["ragen-train", TINY_RUN, f"--config.train.seed={seed}"]), folder)
    with open(os.path.join(folder, "metrics.jsonl"), "w", encoding="utf-8") as f:
        f.write('{"step": 1, "success": 0.5}\n')
    os.makedirs(os.path.join(folder, workdir.CHECKPOINTS, "1"))
    with open(os.path.join(folder, workdir.CHECKPOINTS, "1", "state"), "wb") as f:
        f.write(b"\x00" * 64)
    return folder


def test_bad_input_exits_2_with_one_line_and_leaves_the_workdir_untouched(tmp_path):
    model = save_tiny_model(str(tmp_path / "sharded_model"), max_shard_size=2000)
    _drop_a_shard(model)
    tokenizer = _tokenizer_file(tmp_path / "tokenizer", ["<|im_end|>"])  # no <|im_start|> for ChatML
    runs = {name: _old_run(str(tmp_path / name), seed) for name, seed in (("started_over", 0), ("other_seed", 3))}
    before = {name: _snapshot(run) for name, run in runs.items()}
    fresh = str(tmp_path / "fresh")
    commands = {  # (the script and its arguments, what the one line names)
        # starting over would drop the old run's checkpoints and metrics: the folder is refused before that
        "model": (["ragen-train", TINY_RUN, f"--config.model.pretrained_path={model}", f"--workdir={runs['started_over']}",
                   "--config.checkpoint.resume=False"],
                  [os.path.join(model, hf.INDEX_FILE), repr(TENSOR), "which is not a file of"]),
        "workdir": (["ragen-train", TINY_RUN, f"--workdir={runs['other_seed']}"],
                    [os.path.join(runs["other_seed"], workdir.CONFIG_FILE), "train.seed (3 -> 0)"]),
        "tokenizer": (["ragen-eval", TINY_RUN, "--config.tokenizer.kind=json", f"--config.tokenizer.path={tokenizer}",
                       "--config.tokenizer.chat_format=chatml"], [tokenizer, "'<|im_start|>'"]),
        "config": (["ragen-train", TINY_RUN, "--config.diagnostics.grad_analysis_group_size=1", f"--workdir={fresh}"],
                   ["config.diagnostics.grad_analysis_group_size = 1 is invalid"]),
    }
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    procs = {name: subprocess.Popen([os.path.join(BIN, argv[0]), *argv[1:]], stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, text=True, cwd=REPO_ROOT, env=env)
             for name, (argv, _) in commands.items()}
    for name, proc in procs.items():
        _, err = proc.communicate(timeout=180)
        lines = err.strip().splitlines()
        assert proc.returncode == 2 and len(lines) == 1 and "Traceback" not in err, (name, err)
        script = commands[name][0][0]
        assert lines[0].startswith(f"{script}: error: ") and all(p in lines[0] for p in commands[name][1]), (name, err)
    assert {name: _snapshot(run) for name, run in runs.items()} == before
    assert not os.path.exists(fresh)

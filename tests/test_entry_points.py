"""Command-line pieces of the entry points: the installed console scripts and `python -m experiments.*` with their
`--help`, sweep axes, one-line user errors, the --distributed switch and its environment variables."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from experiments import cli
from experiments import sweep as sweep_cli
from experiments import train as train_cli
from ragen_jax import distributed
from ragen_jax.train import sweep as sweep_lib

SCRIPTS = {"ragen-train": "--workdir", "ragen-sweep": "--sweep", "ragen-eval": "--temperatures",
           "ragen-report": "--group-by"}
REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_console_scripts_and_modules_print_their_flags():
    """Each installed script (setup.py's console_scripts) and `python -m experiments.train` prints a usage naming
    its flags and exits 0; run side by side, as each start imports JAX."""
    bin_dir = os.path.dirname(sys.executable)
    commands = [[os.path.join(bin_dir, script), "--help"] for script in SCRIPTS]
    commands.append([sys.executable, "-m", "experiments.train", "--help"])
    procs = [subprocess.Popen(c, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=REPO_ROOT)
             for c in commands]
    outputs = [p.communicate(timeout=120)[0] for p in procs]
    for command, proc, out, flag in zip(commands, procs, outputs, [*SCRIPTS.values(), "--workdir"]):
        assert proc.returncode == 0 and out.startswith("usage:") and flag in out, (command, out)
    assert all("--config.KEY=VALUE" in out for out in outputs[:3] + outputs[4:])


def test_sweep_axes_parse_as_python_literals():
    assert sweep_cli.parse_axis("filter.value=1.0,0.9,0.5") == ("filter.value", [1.0, 0.9, 0.5])
    assert sweep_cli.parse_axis("algo.kl_loss_coef=0,1e-3") == ("algo.kl_loss_coef", [0, 0.001])
    assert sweep_cli.parse_axis("train.seed=3") == ("train.seed", [3])
    for bad in ("filter.value", "=1,2", "filter.value="):
        with pytest.raises(ValueError, match="expected --sweep=KEY=V1,V2"):
            sweep_cli.parse_axis(bad)
    # a zipped axis: the keys vary together, then the grid crosses it with the other axes
    arms = sweep_cli.parse_axis("filter.value/filter.include_zero=1.0/True,0.9/False")
    assert arms == ("filter.value/filter.include_zero", [(1.0, True), (0.9, False)])
    assert sweep_lib.grid(dict([arms, ("train.seed", [0, 1])])) == [
        {"filter.value": 1.0, "filter.include_zero": True, "train.seed": 0},
        {"filter.value": 1.0, "filter.include_zero": True, "train.seed": 1},
        {"filter.value": 0.9, "filter.include_zero": False, "train.seed": 0},
        {"filter.value": 0.9, "filter.include_zero": False, "train.seed": 1}]
    with pytest.raises(ValueError, match="needs 2 values per member, joined by /"):
        sweep_cli.parse_axis("filter.value/filter.include_zero=1.0/True,0.9")
    with pytest.raises(ValueError, match="each value must be a tuple of 2"):
        sweep_lib.grid({"filter.value/filter.include_zero": [1.0]})


@pytest.mark.parametrize("main, argv, message", [
    (train_cli.main, [], "error: config.--config = None is invalid: pass --config=configs/<task>.py"),
    (train_cli.main, ["--config=configs/demo.py", "--config.train.nonexistent=1"],
     "error: --config.KEY=VALUE names a key the config does not have: 'nonexistent'"),
    (train_cli.main, ["--config=configs/demo.py", "--config.trian.seed=1"],
     "names a key the config does not have: 'trian'; Did you mean \"train\" instead of \"trian\"?"),
    (train_cli.main, ["--config=configs/missing.py"], "No such file or directory: 'configs/missing.py'"),
    (train_cli.main, ["--config=configs/bandit.py:bogus"], "error: ValueError: configs/bandit.py:bogus: unknown setting"),
    (sweep_cli.main, ["--config=configs/demo.py"], "error: give at least one --sweep=KEY=V1,V2,... axis"),
    (sweep_cli.main, ["--config=configs/demo.py", "--sweep=filter.value"], "error: --sweep=filter.value: expected"),
])
def test_user_mistakes_exit_with_one_line(main, argv, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["ragen", *argv])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and "Traceback" not in err
    assert err.strip().splitlines()[-1].startswith("ragen: error: ") and message in err.strip().splitlines()[-1]


def test_distributed_switch_and_partial_environment():
    argv = ["train", "--config=configs/demo.py", "--config.filter.value=0.5"]
    args, config_argv = cli.parse(cli.parser("doc"), argv)
    assert config_argv == argv and not args.distributed and args.workdir is None  # nothing initialised
    assert cli.overridden(config_argv) == {"filter.value"}
    with pytest.raises(ValueError, match="RAGEN_COORDINATOR set but RAGEN_NUM_PROCESSES, RAGEN_PROCESS_ID missing"):
        distributed.initialize({distributed.COORDINATOR: "127.0.0.1:1234"})
    assert distributed.is_main_process()  # a single-process run is its own process 0

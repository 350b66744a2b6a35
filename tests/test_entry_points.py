"""Command-line pieces of the entry points: sweep axes, the --distributed switch and its environment variables."""
from __future__ import annotations

import pytest

from experiments import sweep as sweep_cli
from ragen_jax import distributed


def test_sweep_axes_parse_as_python_literals():
    assert sweep_cli.parse_axis("filter.value=1.0,0.9,0.5") == ("filter.value", [1.0, 0.9, 0.5])
    assert sweep_cli.parse_axis("algo.kl_loss_coef=0,1e-3") == ("algo.kl_loss_coef", [0, 0.001])
    assert sweep_cli.parse_axis("train.seed=3") == ("train.seed", [3])
    for bad in ("filter.value", "=1,2", "filter.value="):
        with pytest.raises(ValueError, match="expected --sweep=KEY=V1,V2"):
            sweep_cli.parse_axis(bad)


def test_distributed_switch_and_partial_environment():
    argv = ["train", "--config=configs/demo.py"]
    assert distributed.from_command_line(argv) == argv  # no switch: nothing initialised, argv unchanged
    with pytest.raises(ValueError, match="RAGEN_COORDINATOR set but RAGEN_NUM_PROCESSES, RAGEN_PROCESS_ID missing"):
        distributed.initialize({distributed.COORDINATOR: "127.0.0.1:1234"})
    assert distributed.is_main_process()  # a single-process run is its own process 0

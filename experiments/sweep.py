"""Run a vectorised sweep (`ragen_jax.train.sweep`): every member in one compiled step.

    .venv/bin/python experiments/sweep.py --config=configs/demo.py --config.logging.dir=runs/sweep \
        --sweep=filter.value=0.25,0.5,1.0 --sweep=train.seed=0,1 [--config.mesh.sweep=2]

Each `--sweep=KEY=V1,V2,...` adds a grid axis (values parsed as Python literals); the members are the cartesian
product. Metrics land in `<logging.dir>/<member>/metrics.jsonl`, one folder per member, which
`experiments/report.py` plots like any run. `--distributed`: multi-host, as in experiments/train.py.
"""
from __future__ import annotations

import ast
import sys

from ragen_jax import config as config_lib
from ragen_jax import distributed
from ragen_jax.train.sweep import Sweep, grid

FLAG = "--sweep="


def parse_axis(text: str) -> tuple[str, list]:
    """`KEY=V1,V2,...` -> (KEY, [values]); values are Python literals (1e-3, 0.5, True) or plain strings."""
    key, sep, values = text.partition("=")
    if not sep or not key or not values:
        raise ValueError(f"{FLAG}{text}: expected {FLAG}KEY=V1,V2,...")

    def literal(v: str):
        try:
            return ast.literal_eval(v)
        except (ValueError, SyntaxError):
            return v

    return key, [literal(v) for v in values.split(",")]


def main(argv: list[str]) -> None:
    axes = dict(parse_axis(a[len(FLAG):]) for a in argv[1:] if a.startswith(FLAG))
    if not axes:
        raise SystemExit(f"give at least one {FLAG}KEY=V1,V2,... axis")
    argv = distributed.from_command_line(argv)
    config = config_lib.load([a for a in argv if not a.startswith(FLAG)])
    Sweep(config, grid(axes)).run()


if __name__ == "__main__":
    main(sys.argv)

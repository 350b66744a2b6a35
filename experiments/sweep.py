"""Run a vectorised sweep (`ragen_jax.train.sweep`): every member in one compiled step.

    ragen-sweep --config=configs/demo.py --workdir=runs/sweep \
        --sweep=filter.value=0.25,0.5,1.0 --sweep=train.seed=0,1 [--config.mesh.sweep=2]
    .venv/bin/python -m experiments.sweep ...            # the same

Each `--sweep=KEY=V1,V2,...` adds a grid axis (values parsed as Python literals); the members are the cartesian
product. A zipped axis varies keys together, e.g. three filter arms:
`--sweep=filter.value/filter.include_zero=1.0/True,1.0/False,0.9/False`. Metrics land in
`<logging.dir>/<member>/metrics.jsonl`, one folder per member, which `experiments/report.py` plots like any run.
`--workdir=DIR` as in experiments/train.py (its config.json also holds the sweep's members: a rerun with other axes
is refused); `--distributed`: multi-host, as there.
"""
from __future__ import annotations

import ast
import sys

from experiments import cli
from ragen_jax.train.sweep import ZIP, Sweep, grid

FLAG = "--sweep="


def parse_axis(text: str) -> tuple[str, list]:
    """`KEY=V1,V2,...` -> (KEY, [values]); values are Python literals (1e-3, 0.5, True) or plain strings. A zipped
    axis `K1/K2=A1/A2,B1/B2` -> ("K1/K2", [(A1, A2), (B1, B2)]): K1 and K2 vary together (`sweep.grid`)."""
    key, sep, values = text.partition("=")
    if not sep or not key or not values:
        raise ValueError(f"{FLAG}{text}: expected {FLAG}KEY=V1,V2,...")

    def literal(v: str):
        try:
            return ast.literal_eval(v)
        except (ValueError, SyntaxError):
            return v

    width = len(key.split(ZIP))
    if width == 1:
        return key, [literal(v) for v in values.split(",")]
    members = [tuple(literal(part) for part in v.split(ZIP)) for v in values.split(",")]
    if any(len(m) != width for m in members):
        raise ValueError(f"{FLAG}{text}: the zipped axis {key} needs {width} values per member, joined by {ZIP}")
    return key, members


def main(argv: list[str] | None = None) -> None:
    parser = cli.parser(__doc__)
    parser.add_argument("--sweep", action="append", default=[], metavar="KEY=V1,V2,...",
                        help="a grid axis (repeatable; at least one): the members are the cartesian product")
    args, config_argv = cli.parse(parser, sys.argv if argv is None else argv)
    try:
        axes = dict(parse_axis(axis) for axis in args.sweep)
    except ValueError as error:
        parser.error(str(error))
    if not axes:
        parser.error(f"give at least one {FLAG}KEY=V1,V2,... axis")
    points = grid(axes)
    config = cli.load_config(parser, args, config_argv, extra={"sweep": points})
    with cli.one_line_errors(parser):  # a key that cannot be swept, a mesh.sweep not dividing the members
        sweep = Sweep(config, points)
    sweep.run()


if __name__ == "__main__":
    main()

"""Copies a finished sweep's metrics into a study's folder, in the layout analyse.py reads.

    .venv/bin/python -m experiments.studies.collect runs/filter_vs_none/ppo_01 \
        experiments/studies/filter_vs_none/ppo --sweep-name seeds_01

Each member's `metrics.jsonl` goes to `<dest>/<member>/metrics.jsonl.gz` (gzip, byte-identical content once
unzipped); the sweep's `config.json` and `sweep.json` go to `<dest>/sweeps/<sweep name>/`. Checkpoints and
transcripts stay behind. A member already in `<dest>` is refused, so one run cannot be collected twice under one name.
"""
from __future__ import annotations

import argparse
import gzip
import os
import shutil
import sys

from ragen_jax import metrics as metrics_lib

SWEEP_FILES = ("config.json", "sweep.json")


def collect(run_dir: str, dest: str, sweep_name: str) -> list[str]:
    """Copies the members of the sweep in `run_dir` to `dest` (see the module doc); returns the member names."""
    if not metrics_lib.is_sweep(run_dir):
        raise ValueError(f"{run_dir} is not a sweep's folder (no sweep.json)")
    members = metrics_lib.sweep_names(run_dir)
    taken = [m for m in members if os.path.exists(os.path.join(dest, m))]
    if taken:
        raise ValueError(f"{dest} already holds {', '.join(taken)}")
    for member in members:
        os.makedirs(os.path.join(dest, member))
        with open(os.path.join(run_dir, member, "metrics.jsonl"), "rb") as src, \
                open(os.path.join(dest, member, "metrics.jsonl.gz"), "wb") as raw, \
                gzip.GzipFile(fileobj=raw, mode="wb", mtime=0) as out:  # no timestamp: the same bytes every time
            shutil.copyfileobj(src, out)
    sweep_dest = os.path.join(dest, "sweeps", sweep_name)
    os.makedirs(sweep_dest)
    for name in SWEEP_FILES:
        shutil.copy(os.path.join(run_dir, name), sweep_dest)
    return members


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run_dir")
    parser.add_argument("dest")
    parser.add_argument("--sweep-name", required=True, help="the folder under <dest>/sweeps/ for config and sweep.json")
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    try:
        members = collect(args.run_dir, args.dest, args.sweep_name)
    except (ValueError, FileNotFoundError) as error:
        parser.error(str(error))
    print(f"collected {len(members)} members into {args.dest}")


if __name__ == "__main__":
    main()

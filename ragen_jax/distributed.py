"""Multi-host runs: one process per host, every process runs the same program (docs/architecture.md, design rule 4).

    from ragen_jax import distributed
    distributed.initialize()                  # before any other JAX call; then train(config) as usual

With `RAGEN_COORDINATOR` ("host:port" of process 0), `RAGEN_NUM_PROCESSES` and `RAGEN_PROCESS_ID` set (e.g.
several processes on one machine, or a launcher of your own) those are used; otherwise
`jax.distributed.initialize()` detects Cloud TPU pods, SLURM and Open MPI by itself. The mesh then spans every
process's devices (`jax.devices()`), the step runs as one global program, and only process 0 writes metrics and
prints; checkpoints are written by all processes together (orbax).
"""
from __future__ import annotations

import os
from typing import Mapping

import jax

COORDINATOR, NUM_PROCESSES, PROCESS_ID = "RAGEN_COORDINATOR", "RAGEN_NUM_PROCESSES", "RAGEN_PROCESS_ID"


def initialize(environ: Mapping[str, str] = os.environ) -> None:
    """Starts JAX's distributed runtime (see module doc). Raises ValueError naming a missing variable when only
    some of the RAGEN_* variables are set."""
    names = (COORDINATOR, NUM_PROCESSES, PROCESS_ID)
    given = [n for n in names if environ.get(n)]
    if not given:
        jax.distributed.initialize()
        return
    missing = [n for n in names if n not in given]
    if missing:
        raise ValueError(f"{', '.join(given)} set but {', '.join(missing)} missing: set all three or none")
    jax.distributed.initialize(coordinator_address=environ[COORDINATOR],
                               num_processes=int(environ[NUM_PROCESSES]), process_id=int(environ[PROCESS_ID]))


def is_main_process() -> bool:
    """True on the process that writes metrics and prints (process 0; always true in a single-process run)."""
    return jax.process_index() == 0

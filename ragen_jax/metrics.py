"""Metric histories as columns, for notebooks and plots.

    history = ragen_jax.metrics.load("runs/demo")   # {"step": int64[N], "bandit/success": float64[N], ...}
    members = ragen_jax.metrics.load("experiments/results/bandit_filter")   # a sweep: {member name: columns}
    plt.plot(history["step"], history["val-env/bandit/success"], "o")   # NaN where a step was not validated

A run folder (or its `metrics.jsonl`) gives one dict of columns; a sweep folder (one holding `sweep.json`, written by
`ragen_jax.train.sweep`) gives one per member, in the sweep's member order.
"""
from __future__ import annotations

import json
import os

import numpy as np

from ragen_jax.train.metrics_log import read_metrics

SWEEP_FILE = "sweep.json"


def columns(rows: list[dict]) -> dict[str, np.ndarray]:
    """{"step": int64[N], name: float64[N] per metric (NaN in the rows without it)} of metrics rows."""
    names = list(dict.fromkeys(k for row in rows for k in row if k != "step"))
    out = {"step": np.array([row["step"] for row in rows], np.int64)}
    out.update({k: np.array([row.get(k, np.nan) for row in rows], np.float64) for k in names})
    return out


def is_sweep(path: str | os.PathLike) -> bool:
    return os.path.isdir(path) and os.path.exists(os.path.join(path, SWEEP_FILE))


def sweep_names(folder: str | os.PathLike) -> list[str]:
    """The member names of a sweep folder, in the sweep's member order."""
    with open(os.path.join(folder, SWEEP_FILE), encoding="utf-8") as f:
        return json.load(f)["names"]


def sweep_rows(folder: str | os.PathLike) -> dict[str, list[dict]]:
    """{member name: metrics rows} of a sweep folder, in the sweep's member order."""
    return {name: read_metrics(os.path.join(folder, name)) for name in sweep_names(folder)}


def load(path: str | os.PathLike) -> dict:
    """Columns of a run folder or metrics.jsonl, or {member name: columns} of a sweep folder."""
    if is_sweep(path):
        return {name: columns(rows) for name, rows in sweep_rows(path).items()}
    return columns(read_metrics(path))

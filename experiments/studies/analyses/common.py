"""What the studies' analyses share: reading a study's runs by arm and seed, and a run's metric at given steps."""
from __future__ import annotations

import os
from typing import Callable

import numpy as np

from experiments.report import member_values
from ragen_jax.train.metrics_log import read_metrics


def validation_points(rows: list[dict], key: str) -> tuple[np.ndarray, np.ndarray]:
    """(steps, values) of the rows that carry validation metric `key`."""
    points = [(row["step"], row[key]) for row in rows if key in row]
    return np.array([p[0] for p in points]), np.array([p[1] for p in points], np.float64)


def load_arms(folder: str, arm_of: Callable[[dict[str, str]], str]) -> dict[str, dict[int, list[dict]]]:
    """{arm: {seed: metric rows}} of the members in `folder` (one sub-folder per member, named by its overrides);
    `arm_of(the member's overrides as strings)` names its arm, `train.seed` is its seed. Arms in first-seen order."""
    arms: dict[str, dict[int, list[dict]]] = {}
    for name in sorted(os.listdir(folder)):
        if not os.path.isdir(os.path.join(folder, name)) or name == "sweeps":
            continue
        overrides = member_values(name)
        arms.setdefault(arm_of(overrides), {})[int(overrides["train.seed"])] = read_metrics(os.path.join(folder, name))
    return arms


def mean_over_steps(rows: list[dict], key: str, steps) -> float:
    """The mean of `key` over the rows of `steps`; ValueError when a step has no row carrying it."""
    values = {row["step"]: row[key] for row in rows if key in row}
    missing = [s for s in steps if s not in values]
    if missing:
        raise ValueError(f"{key} is missing at steps {missing}")
    return float(np.mean([values[s] for s in steps]))


def paired_seeds(arms: dict[str, dict[int, list[dict]]], a: str, b: str) -> list[int]:
    """The seeds both arms ran, sorted."""
    return sorted(set(arms[a]) & set(arms[b]))


def plot_arms(ax, arms: dict[str, dict[int, list[dict]]], key: str) -> None:
    """On matplotlib axes `ax`: per arm with runs, the mean over its seeds of `key` at the steps that carry it, and a
    band from their minimum to their maximum."""
    for arm, runs in arms.items():
        if not runs:
            continue
        curves = [validation_points(runs[s], key) for s in sorted(runs)]
        steps = curves[0][0]
        values = np.array([c[1][:len(steps)] for c in curves])
        ax.plot(steps, values.mean(axis=0), label=f"{arm} (n={len(curves)})")
        ax.fill_between(steps, values.min(axis=0), values.max(axis=0), alpha=0.15)
    ax.legend()

"""Recomputes every number of a study's RESULT.md from its committed metrics (experiments/studies/<name>/).

    .venv/bin/python -m experiments.studies.analyse filter_vs_none [--figure PATH]

Prints the study's result tables in markdown (RESULT.md quotes them verbatim) and writes its figure
(`<study>/figure.png` unless --figure). Each study's PROTOCOL.md defines the endpoint and the test computed here.
"""
from __future__ import annotations

import argparse
import os
import sys
from typing import Callable

import numpy as np

from experiments.report import member_values
from experiments.studies import stats
from ragen_jax.train.metrics import read_metrics

FOLDER = os.path.dirname(os.path.abspath(__file__))


def validation_points(rows: list[dict], key: str) -> tuple[np.ndarray, np.ndarray]:
    """(steps, values) of the rows that carry validation metric `key`."""
    points = [(row["step"], row[key]) for row in rows if key in row]
    return np.array([p[0] for p in points]), np.array([p[1] for p in points], np.float64)


# ----------------------------------------------------------------------------------------- filter_vs_none
ARMS = {("1.0", "True"): "none", ("1.0", "False"): "zero-variance drop", ("0.9", "False"): "top-p 0.9"}
ALGORITHMS = ("ppo", "drgrpo")
SUCCESS = "val-env/frozen_lake/success"
LAST_POINTS = 3
PRIMARY = ("ppo", "top-p 0.9", "none")
COMPARISONS = (("top-p 0.9", "none"), ("zero-variance drop", "none"), ("top-p 0.9", "zero-variance drop"))


def load_arms(folder: str) -> dict[str, dict[int, list[dict]]]:
    """{arm: {seed: metric rows}} of one algorithm's sweep folder."""
    arms: dict[str, dict[int, list[dict]]] = {arm: {} for arm in ARMS.values()}
    for name in sorted(os.listdir(folder)):
        if not os.path.isdir(os.path.join(folder, name)):
            continue
        o = member_values(name)
        arm = ARMS[(o["filter.value"], o["filter.include_zero"])]
        arms[arm][int(o["train.seed"])] = read_metrics(os.path.join(folder, name))
    return arms


def endpoint(rows: list[dict]) -> float:
    """The protocol's primary endpoint: the mean validation success of a run's last 3 validation points."""
    _, values = validation_points(rows, SUCCESS)
    if len(values) < LAST_POINTS:
        raise ValueError(f"a run has {len(values)} validation points, fewer than {LAST_POINTS}")
    return float(values[-LAST_POINTS:].mean())


def filter_vs_none(study: str, figure: str) -> list[str]:
    lines, tests = [], []  # tests: ((algorithm, arm b, arm a), paired differences b - a, sign-flip p)
    data = {a: load_arms(os.path.join(study, a)) for a in ALGORITHMS if os.path.isdir(os.path.join(study, a))}
    lines += ["| algorithm | arm | seeds | endpoint mean | sd |", "|---|---|---|---|---|"]
    for algorithm, arms in data.items():
        for arm, runs in arms.items():
            e = [endpoint(runs[s]) for s in sorted(runs)]
            lines.append(f"| {algorithm} | {arm} | {len(e)} | {np.mean(e):.3f} | {np.std(e, ddof=1):.3f} |")
    lines += ["", "| algorithm | comparison | mean paired difference | 95% bootstrap interval | sign-flip p | "
              "Holm p (secondary) |", "|---|---|---|---|---|---|"]
    for algorithm, arms in data.items():
        for b, a in COMPARISONS:
            seeds = sorted(set(arms[a]) & set(arms[b]))
            d = np.array([endpoint(arms[b][s]) - endpoint(arms[a][s]) for s in seeds])
            tests.append(((algorithm, b, a), d, stats.sign_flip_p(d)))
    secondary = [name for name, _, _ in tests if name != PRIMARY]
    adjusted = dict(zip(secondary, stats.holm([p for name, _, p in tests if name != PRIMARY])))
    for (algorithm, b, a), d, p in tests:
        low, high = stats.bootstrap_interval(d)
        holm_p = f"{adjusted[(algorithm, b, a)]:.4f}" if (algorithm, b, a) in adjusted else "primary"
        lines.append(f"| {algorithm} | {b} - {a} | {d.mean():+.3f} | [{low:+.3f}, {high:+.3f}] | {p:.4f} | "
                     f"{holm_p} |")
    plot_filter_vs_none(data, figure)
    return lines


def plot_filter_vs_none(data: dict, path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(data), figsize=(6 * len(data), 4), squeeze=False)
    for ax, (algorithm, arms) in zip(axes[0], data.items()):
        for arm, runs in arms.items():
            curves = [validation_points(runs[s], SUCCESS) for s in sorted(runs)]
            steps = curves[0][0]
            values = np.array([c[1][:len(steps)] for c in curves])
            ax.plot(steps, values.mean(axis=0), label=f"{arm} (n={len(curves)})")
            ax.fill_between(steps, values.min(axis=0), values.max(axis=0), alpha=0.15)
        ax.set(title=f"FrozenLake mixed, {algorithm}", xlabel="step", ylabel="validation success (256 prompts)")
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


STUDIES: dict[str, Callable[[str, str], list[str]]] = {"filter_vs_none": filter_vs_none}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("study", choices=sorted(STUDIES))
    parser.add_argument("--figure", default=None, help="where to write the figure (default <study>/figure.png)")
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    study = os.path.join(FOLDER, args.study)
    print("\n".join(STUDIES[args.study](study, args.figure or os.path.join(study, "figure.png"))))


if __name__ == "__main__":
    main()

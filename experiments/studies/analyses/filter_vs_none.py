"""Study 1, filter vs none (experiments/studies/filter_vs_none/PROTOCOL.md): per algorithm, the endpoint (mean
validation success of the last 3 validation points) of each arm, and the paired sign-flip tests of the arms'
differences (the primary PPO top-p 0.9 - none; the others Holm-adjusted together)."""
from __future__ import annotations

import os

import numpy as np

from experiments.studies import stats
from experiments.studies.analyses.common import load_arms, paired_seeds, plot_arms, validation_points

ARMS = {("1.0", "True"): "none", ("1.0", "False"): "zero-variance drop", ("0.9", "False"): "top-p 0.9"}
ALGORITHMS = ("ppo", "drgrpo")
SUCCESS = "val-env/frozen_lake/success"
LAST_POINTS = 3
PRIMARY = ("ppo", "top-p 0.9", "none")
COMPARISONS = (("top-p 0.9", "none"), ("zero-variance drop", "none"), ("top-p 0.9", "zero-variance drop"))


def arm_of(overrides: dict[str, str]) -> str:
    return ARMS[(overrides["filter.value"], overrides["filter.include_zero"])]


def load_algorithm(folder: str) -> dict[str, dict[int, list[dict]]]:
    """{arm: {seed: metric rows}} of one algorithm's folder, the arms in ARMS's order."""
    arms = load_arms(folder, arm_of)
    return {arm: arms.get(arm, {}) for arm in ARMS.values()}


def endpoint(rows: list[dict]) -> float:
    """The protocol's primary endpoint: the mean validation success of a run's last 3 validation points."""
    _, values = validation_points(rows, SUCCESS)
    if len(values) < LAST_POINTS:
        raise ValueError(f"a run has {len(values)} validation points, fewer than {LAST_POINTS}")
    return float(values[-LAST_POINTS:].mean())


def analyse(study: str, figure: str) -> list[str]:
    lines, tests = [], []  # tests: ((algorithm, arm b, arm a), paired differences b - a, sign-flip p)
    data = {a: load_algorithm(os.path.join(study, a)) for a in ALGORITHMS if os.path.isdir(os.path.join(study, a))}
    lines += ["| algorithm | arm | seeds | endpoint mean | sd |", "|---|---|---|---|---|"]
    for algorithm, arms in data.items():
        for arm, runs in arms.items():
            e = [endpoint(runs[s]) for s in sorted(runs)]
            lines.append(f"| {algorithm} | {arm} | {len(e)} | {np.mean(e):.3f} | {np.std(e, ddof=1):.3f} |")
    lines += ["", "| algorithm | comparison | mean paired difference | 95% bootstrap interval | sign-flip p | "
              "Holm p (secondary) |", "|---|---|---|---|---|---|"]
    for algorithm, arms in data.items():
        for b, a in COMPARISONS:
            seeds = paired_seeds(arms, a, b)
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
        plot_arms(ax, arms, SUCCESS)
        ax.set(title=f"FrozenLake mixed, {algorithm}", xlabel="step", ylabel="validation success (256 prompts)")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)

"""Study 4, gradient norms by reward-variance bucket (experiments/studies/gradient_buckets/PROTOCOL.md): per analysis
(one analysed step of one run) the least-squares slope of the task-gradient norm on the buckets' mean reward std and
each component's relative spread over the buckets; per algorithm the sign test of the slopes (Holm over the
algorithms), the regularisers' flatness and the protocol's verdict."""
from __future__ import annotations

import os

import numpy as np

from experiments.report import spearman
from experiments.studies import stats
from experiments.studies.analyses.common import load_arms

ALGORITHMS = ("ppo", "drgrpo")
PRIMARY = "ppo"
COMPONENTS = ("task", "kl", "entropy")
REGULARISERS = ("kl", "entropy")
NUM_BUCKETS = 6
FLAT_SPREAD = 0.5  # a regulariser is flat when its median relative spread is at most this ...
FLAT_FRACTION = 0.5  # ... and at most this fraction of the task component's median relative spread
ALPHA = 0.05
# the protocol's units: the analyses at steps 6, 11, ..., 36 (the one at step 1 is left out: the policy equals the KL
# reference there, so the KL component is exactly zero); a sweep logs the analysis keys as NaN on the other steps
ANALYSED_STEPS = range(6, 37, 5)


def key(bucket: int, stat: str) -> str:
    return f"grad_norm/bucket_{bucket}/{stat}"


def analyses(rows: list[dict]) -> list[dict[str, np.ndarray]]:
    """One dict per row of ANALYSED_STEPS in a run: "rv" f64[buckets] (mean reward std) and each component's norms;
    ValueError when such a row lacks the analysis or has an empty bucket."""
    out = []
    for row in rows:
        if row["step"] not in ANALYSED_STEPS:
            continue
        if key(1, "task") not in row:
            raise ValueError(f"step {row['step']}: no gradient analysis")
        buckets = range(1, NUM_BUCKETS + 1)
        unit = {"rv": np.array([row[key(b, "reward_std_mean")] for b in buckets], np.float64)}
        unit.update({c: np.array([row[key(b, c)] for b in buckets], np.float64) for c in COMPONENTS})
        if np.isnan(unit["rv"]).any():
            raise ValueError(f"step {row['step']}: an empty bucket (NaN reward std)")
        out.append(unit)
    return out


def slope(x: np.ndarray, y: np.ndarray) -> float:
    """The least-squares slope of y on x (0 when x is constant)."""
    dx = x - x.mean()
    return float(dx @ (y - y.mean()) / (dx @ dx)) if dx @ dx > 0 else 0.0


def spread(norms: np.ndarray) -> float:
    """(max - min) / mean of a component's norms over the buckets."""
    return float((norms.max() - norms.min()) / norms.mean())


def analyse(study: str, figure: str) -> list[str]:
    units = {}
    for algorithm in ALGORITHMS:
        folder = os.path.join(study, algorithm)
        if os.path.isdir(folder):
            runs = load_arms(folder, lambda _: algorithm)[algorithm]
            units[algorithm] = [u for seed in sorted(runs) for u in analyses(runs[seed])]
    slopes = {a: np.array([slope(u["rv"], u["task"]) for u in us]) for a, us in units.items()}
    p_values = {a: stats.sign_test_p(int((s > 0).sum()), int((s != 0).sum())) for a, s in slopes.items()}
    holm = dict(zip(p_values, stats.holm(list(p_values.values()))))
    lines = ["| algorithm | analyses | reward std range | positive task slopes | mean task slope | "
             "95% bootstrap interval | sign-test p | Holm p |", "|---|---|---|---|---|---|---|---|"]
    for algorithm, s in slopes.items():
        rv = np.concatenate([u["rv"] for u in units[algorithm]])
        low, high = stats.bootstrap_interval(s)
        lines.append(f"| {algorithm} | {len(s)} | {rv.min():.2f} - {rv.max():.2f} | {int((s > 0).sum())} of "
                     f"{int((s != 0).sum())} | {s.mean():+.4f} | [{low:+.4f}, {high:+.4f}] | "
                     f"{p_values[algorithm]:.4f} | {holm[algorithm]:.4f} |")
    lines += ["", "| algorithm | component | median relative spread | mean Spearman rho with reward std | flat |",
              "|---|---|---|---|---|"]
    verdicts = []
    for algorithm, us in units.items():
        spreads = {c: float(np.median([spread(u[c]) for u in us])) for c in COMPONENTS}
        flat = {c: spreads[c] <= FLAT_SPREAD and spreads[c] <= FLAT_FRACTION * spreads["task"] for c in REGULARISERS}
        for c in COMPONENTS:
            rho = np.nanmean([spearman(u["rv"], u[c]) for u in us])
            lines.append(f"| {algorithm} | {c} | {spreads[c]:.3f} | {rho:+.2f} | "
                         f"{flat[c] if c in flat else '(reference)'} |")
        verdicts.append(f"- {algorithm}{' (primary)' if algorithm == PRIMARY else ''}: "
                        f"**{verdict(slopes[algorithm].mean(), holm[algorithm], all(flat.values()))}**")
    lines += ["", "Verdicts (PROTOCOL.md):", *verdicts]
    plot(units, figure)
    return lines


def verdict(mean_slope: float, holm_p: float, regularisers_flat: bool) -> str:
    if holm_p >= ALPHA:
        return "not reproduced here, with this power"
    if mean_slope < 0:
        return "reversed"
    return "reproduced" if regularisers_flat else "task trend only"


def plot(units: dict[str, list[dict]], path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(units), figsize=(6 * len(units), 4), squeeze=False)
    for ax, (algorithm, us) in zip(axes[0], units.items()):
        rv = np.mean([u["rv"] for u in us], axis=0)
        for c in COMPONENTS:
            ax.plot(rv, np.mean([u[c] for u in us], axis=0), marker="o", label=c)
        ax.set(title=f"Sokoban tiny, {algorithm}: {len(us)} analyses", xlabel="bucket's mean reward std",
               ylabel="gradient norm (mean over analyses)", yscale="log")
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)

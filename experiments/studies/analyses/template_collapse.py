"""Study 3, template collapse against a ground truth (experiments/studies/template_collapse/PROTOCOL.md): per arm, the
changes of faithfulness (dF), of the first-turn MI estimate (dMI) and the relative change of H(Z|X) (rH) over the
run, their paired tests and the protocol's verdict; then the filter's effect on dF and dMI (top-p - none, Holm over
the two), and the untested context (per-fact faithfulness, retrieval accuracy, trajectory MI, success, Spearman)."""
from __future__ import annotations

import os

import numpy as np

from experiments.report import spearman
from experiments.studies import stats
from experiments.studies.analyses.common import load_arms, mean_over_steps, paired_seeds, plot_arms

SETTING = "frozen_lake"
ARMS = {"1.0": "none", "0.9": "top-p 0.9"}
FAITHFULNESS = f"val-faithfulness/{SETTING}"
FACTS = ("player", "goal", "rows", "cols")
MI = "collapse_first_turn_sample/mi_estimate"
ENTROPY = "collapse_first_turn_sample/conditional_entropy_est"
CONTEXT = {"retrieval accuracy": "collapse_first_turn_sample/retrieval_accuracy",
           "trajectory MI": "collapse_trajectory_sample/mi_estimate"}
SUCCESS = f"val-env/{SETTING}/success"
VALIDATION_START, VALIDATION_END = (0,), (40, 50, 60)
TRAINING_START, TRAINING_END = tuple(range(1, 6)), tuple(range(56, 61))
ENTROPY_MARGIN = -0.10  # H(Z|X) holds when the interval of its mean relative change lies above this
ALPHA = 0.05


def arm_of(overrides: dict[str, str]) -> str:
    return ARMS[overrides["filter.value"]]


def windows(rows: list[dict], key: str) -> tuple[float, float]:
    """(start, end) of `key` in one run: validation keys over VALIDATION_START / _END, the rest over the training
    windows."""
    start, end = ((VALIDATION_START, VALIDATION_END) if key.startswith("val-")
                  else (TRAINING_START, TRAINING_END))
    return mean_over_steps(rows, key, start), mean_over_steps(rows, key, end)


def changes(rows: list[dict]) -> dict[str, float]:
    """The protocol's per-run endpoints: dF, dMI (end - start) and rH (end / start - 1)."""
    (f0, f1), (m0, m1), (h0, h1) = (windows(rows, k) for k in (FAITHFULNESS, MI, ENTROPY))
    return {"dF": f1 - f0, "dMI": m1 - m0, "rH": h1 / h0 - 1.0}


def verdict(falls_f: bool, falls_mi: bool, holds_h: bool) -> str:
    if not falls_f:
        return "no collapse here, with this power"
    if not falls_mi:
        return "faithfulness falls unseen by MI"
    return "template collapse" if holds_h else "low-entropy collapse"


def analyse(study: str, figure: str) -> list[str]:
    arms = load_arms(os.path.join(study, SETTING), arm_of)
    arms = {arm: arms[arm] for arm in ARMS.values() if arm in arms}
    per_run = {arm: {seed: changes(rows) for seed, rows in runs.items()} for arm, runs in arms.items()}
    lines = ["| arm | seeds | quantity | start | end | mean change | 95% bootstrap interval | sign-flip p |",
             "|---|---|---|---|---|---|---|---|"]
    verdicts = []
    for arm, runs in arms.items():
        seeds = sorted(runs)
        tested = {}
        for name, key, change in (("faithfulness", FAITHFULNESS, "dF"), ("MI", MI, "dMI"),
                                  ("H(Z|X), relative", ENTROPY, "rH")):
            starts, ends = np.array([windows(runs[s], key) for s in seeds]).T
            d = np.array([per_run[arm][s][change] for s in seeds])
            low, high = stats.bootstrap_interval(d)
            p = stats.sign_flip_p(d)
            tested[change] = (d.mean(), low, p)
            lines.append(f"| {arm} | {len(seeds)} | {name} | {starts.mean():.3f} | {ends.mean():.3f} | "
                         f"{d.mean():+.3f} | [{low:+.3f}, {high:+.3f}] | {p:.4f} |")
        falls_f = tested["dF"][0] < 0 and tested["dF"][2] < ALPHA
        falls_mi = tested["dMI"][0] < 0 and tested["dMI"][2] < ALPHA
        holds_h = tested["rH"][1] > ENTROPY_MARGIN
        verdicts.append(f"- {arm}: F falls {falls_f}, MI falls {falls_mi}, H(Z|X) holds {holds_h}: "
                        f"**{verdict(falls_f, falls_mi, holds_h)}**")
    lines += ["", "Verdicts (PROTOCOL.md, question 1; the no-filter arm is the primary):", *verdicts]
    lines += filter_effect(per_run)
    lines += context(arms, per_run)
    plot(arms, figure)
    return lines


def filter_effect(per_run: dict[str, dict[int, dict]]) -> list[str]:
    """Question 2: top-p - none of dF and of dMI, paired by seed, Holm over the two."""
    if len(per_run) < 2:
        return []
    seeds = paired_seeds(per_run, "none", "top-p 0.9")
    tests = []
    for change in ("dF", "dMI"):
        d = np.array([per_run["top-p 0.9"][s][change] - per_run["none"][s][change] for s in seeds])
        tests.append((change, d, stats.sign_flip_p(d)))
    adjusted = stats.holm([p for _, _, p in tests])
    lines = ["", "| top-p 0.9 - none | seeds | mean paired difference | 95% bootstrap interval | sign-flip p | Holm p |",
             "|---|---|---|---|---|---|"]
    for (change, d, p), holm_p in zip(tests, adjusted):
        low, high = stats.bootstrap_interval(d)
        lines.append(f"| {change} | {len(d)} | {d.mean():+.3f} | [{low:+.3f}, {high:+.3f}] | {p:.4f} | {holm_p:.4f} |")
    return lines


def context(arms: dict[str, dict[int, list[dict]]], per_run: dict[str, dict[int, dict]]) -> list[str]:
    """The protocol's untested context: start and end means per arm, and Spearman of dMI with dF over every run."""
    keys = {**{f"faithfulness: {fact}": f"{FAITHFULNESS}/{fact}" for fact in FACTS}, **CONTEXT,
            "validation success": SUCCESS}
    lines = ["", "| arm | " + " | ".join(f"{name} (start -> end)" for name in keys) + " |",
             "|---|" + "---|" * len(keys)]
    for arm, runs in arms.items():
        cells = []
        for key in keys.values():
            starts, ends = np.array([windows(runs[s], key) for s in sorted(runs)]).T
            cells.append(f"{starts.mean():.3f} -> {ends.mean():.3f}")
        lines.append(f"| {arm} | " + " | ".join(cells) + " |")
    d_mi = [c["dMI"] for runs in per_run.values() for c in runs.values()]
    d_f = [c["dF"] for runs in per_run.values() for c in runs.values()]
    lines += ["", f"Spearman rho of dMI with dF over the {len(d_f)} runs: {spearman(d_mi, d_f):+.2f}"]
    return lines


def plot(arms: dict[str, dict[int, list[dict]]], path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = (("faithfulness (256 validation prompts)", FAITHFULNESS), ("first-turn MI estimate", MI),
              ("first-turn H(Z|X) estimate", ENTROPY))
    fig, axes = plt.subplots(1, len(panels), figsize=(6 * len(panels), 4))
    for ax, (title, key) in zip(axes, panels):
        plot_arms(ax, arms, key)
        ax.set(title=title, xlabel="step")
    fig.suptitle("FrozenLake tiny without its KL anchor: mean over seeds, band = min to max")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)

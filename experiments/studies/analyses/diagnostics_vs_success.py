"""Study 2, collapse diagnostics against task success over a designed population of runs
(experiments/studies/diagnostics_vs_success/PROTOCOL.md): per run a window-averaged and an early value of each
diagnostic and the final validation success; Spearman's rho of each diagnostic with success over the runs, and within
each validation step; run-bootstrap intervals and the bootstrap test of |rho(MI)| - |rho(H(Z|X))|."""
from __future__ import annotations

import os

import numpy as np

from experiments.report import spearman
from experiments.studies import stats
from experiments.studies.analyses.common import load_arms, mean_over_steps

SETTING = "frozen_lake"
SUCCESS = f"val-env/{SETTING}/success"
MI, ENTROPY = "collapse_first_turn_sample/mi_estimate", "collapse_first_turn_sample/conditional_entropy_est"
DIAGNOSTICS = {"MI": MI, "H(Z|X)": ENTROPY,
               "retrieval accuracy": "collapse_first_turn_sample/retrieval_accuracy",
               "first-turn MI z-score": "collapse_first_turn_sample/mi_zscore",
               "trajectory MI z-score": "collapse_trajectory_sample/mi_zscore",
               "faithfulness": f"val-faithfulness/{SETTING}"}  # a validation metric: its window holds steps 60-100
FINAL_STEPS = (80, 90, 100)  # validation steps whose mean success is a run's final success
WINDOW = range(51, 101)  # training steps whose diagnostic values average into the window value
EARLY = range(1, 21)  # ... into the early value
VALIDATION_STEPS = tuple(range(10, 101, 10))  # the within-step correlations' steps
KINDS = ("window", "early", "within")
ALPHA = 0.05


def arm_of(overrides: dict[str, str]) -> str:
    return f"entropy {float(overrides['algo.entropy_coeff']):g}, filter {overrides['filter.value']}"


def window_mean(rows: list[dict], key: str, steps: range) -> float:
    """The mean of `key` over the rows of `steps` that carry it (a sweep logs NaN on the steps where a diagnostic
    did not run); ValueError when none does."""
    values = [row[key] for row in rows if row["step"] in steps and key in row and not np.isnan(row[key])]
    if not values:
        raise ValueError(f"{key} has no value at steps {steps.start}..{steps.stop - 1}")
    return float(np.mean(values))


def at_step(rows: list[dict], key: str, step: int) -> float:
    return mean_over_steps(rows, key, (step,))


def features(runs: list[list[dict]]) -> dict[str, np.ndarray]:
    """f64[runs] per feature: "success" (final), "<name>/window", "<name>/early", and "<name>@<step>" and
    "success@<step>" at each validation step."""
    out = {"success": [mean_over_steps(rows, SUCCESS, FINAL_STEPS) for rows in runs]}
    for name, key in DIAGNOSTICS.items():
        out[f"{name}/window"] = [window_mean(rows, key, WINDOW) for rows in runs]
        out[f"{name}/early"] = [window_mean(rows, key, EARLY) for rows in runs]
        for step in VALIDATION_STEPS:
            out[f"{name}@{step}"] = [at_step(rows, key, step) for rows in runs]
    for step in VALIDATION_STEPS:
        out[f"success@{step}"] = [at_step(rows, SUCCESS, step) for rows in runs]
    return {k: np.asarray(v, np.float64) for k, v in out.items()}


def rho_samples(f: dict[str, np.ndarray], name: str, kind: str) -> tuple[float, np.ndarray]:
    """(estimate, run-bootstrap samples) of Spearman's rho of diagnostic `name` with success: kind "window" and
    "early" against the final success, "within" the mean over the validation steps of the rho at that step."""
    if kind == "within":
        estimate = np.nanmean([spearman(f[f"{name}@{s}"], f[f"success@{s}"]) for s in VALIDATION_STEPS])
        samples = np.nanmean([stats.bootstrap_spearman(f[f"{name}@{s}"], f[f"success@{s}"])
                              for s in VALIDATION_STEPS], axis=0)
        return float(estimate), samples
    x, y = f[f"{name}/{kind}"], f["success"]
    return spearman(x, y), stats.bootstrap_spearman(x, y)


def verdict(rho_mi: tuple[float, float, float], gap: tuple[float, float, float]) -> str:
    """rho_mi and gap are (estimate, low, high) of rho(MI) and of |rho(MI)| - |rho(H)|."""
    if gap[1] > 0 and rho_mi[1] > 0:
        return "reproduced: MI tracks success, and better than H(Z|X)"
    if gap[2] < 0:
        return "reversed: H(Z|X) tracks success better than MI"
    return "not resolved with this power"


def load_runs(study: str) -> tuple[list[list[dict]], list[str]]:
    """(metric rows of every run, each run's arm), arm by arm, seeds ascending."""
    arms = load_arms(os.path.join(study, SETTING), arm_of)
    return ([rows for arm in arms.values() for _, rows in sorted(arm.items())],
            [arm for arm, seeds in arms.items() for _ in seeds])


def analyse(study: str, figure: str) -> list[str]:
    runs, labels = load_runs(study)
    arms = list(dict.fromkeys(labels))
    f = features(runs)
    n = len(runs)
    lines = [f"{n} runs in {len(arms)} arms; final success {f['success'].mean():.3f} (min {f['success'].min():.3f}, "
             f"max {f['success'].max():.3f}); success by arm:",
             "", "| arm | seeds | final success, mean | min | max |", "|---|---|---|---|---|"]
    for arm in arms:
        s = f["success"][[i for i, label in enumerate(labels) if label == arm]]
        lines.append(f"| {arm} | {len(s)} | {s.mean():.3f} | {s.min():.3f} | {s.max():.3f} |")
    lines += ["", "| diagnostic | value | Spearman rho with success | 95% run-bootstrap interval |", "|---|---|---|---|"]
    estimates, samples = {}, {}
    for kind in KINDS:
        for name in DIAGNOSTICS:
            estimate, samples[name, kind] = rho_samples(f, name, kind)
            estimates[name, kind] = (estimate, *stats.percentile_interval(samples[name, kind]))
            lines.append(f"| {name} | {kind} | {estimate:+.3f} | [{estimates[name, kind][1]:+.3f}, "
                         f"{estimates[name, kind][2]:+.3f}] |")
    lines += ["", "| |rho(MI)| - |rho(H(Z|X))| | estimate | 95% run-bootstrap interval | bootstrap p |",
              "|---|---|---|---|"]
    gaps = {}
    for kind in KINDS:
        gap = np.abs(samples["MI", kind]) - np.abs(samples["H(Z|X)", kind])  # paired: the same resamples
        estimate = abs(estimates["MI", kind][0]) - abs(estimates["H(Z|X)", kind][0])
        gaps[kind] = (estimate, *stats.percentile_interval(gap))
        role = "primary" if kind == "window" else "secondary"
        lines.append(f"| {kind} ({role}) | {estimate:+.3f} | [{gaps[kind][1]:+.3f}, {gaps[kind][2]:+.3f}] | "
                     f"{stats.bootstrap_p(gap):.4f} |")
    lines += ["", f"Verdict (PROTOCOL.md, the window values): **{verdict(estimates['MI', 'window'], gaps['window'])}**"]
    plot(f, labels, figure)
    return lines


def plot(f: dict[str, np.ndarray], labels: list[str], path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    arms = list(dict.fromkeys(labels))
    colours = plt.get_cmap("viridis")(np.linspace(0, 1, len(arms)))
    for ax, name in zip(axes, ("MI", "H(Z|X)")):
        for arm, colour in zip(arms, colours):
            mask = np.array([label == arm for label in labels])
            ax.scatter(f[f"{name}/window"][mask], f["success"][mask], color=colour, label=arm,
                       marker="o" if arm.endswith("1.0") else "^")
        ax.set(xlabel=f"first-turn {name}, mean over steps {WINDOW.start}-{WINDOW.stop - 1}",
               ylabel="final validation success", title=f"rho = {spearman(f[f'{name}/window'], f['success']):+.2f}")
    axes[1].legend(fontsize=7, loc="best")
    fig.suptitle("One point per run: the window diagnostic against the final success")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)

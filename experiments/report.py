"""Plot a run's metrics: task success next to the collapse diagnostics (spec D), one PNG.

    .venv/bin/python experiments/report.py runs/demo/metrics.jsonl [--out runs/demo/report.png]

Panels: success and episode reward; filter kept ratio; policy entropy; MI estimates of both collapse families
(reasoning's dependence on the input); conditional entropy H(Z|X) of the first-turn family (within-input
diversity). Template collapse shows as H(Z|X) staying up while MI falls. Missing keys leave a panel empty.
"""
from __future__ import annotations

import argparse
import os

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from ragen_jax.train.metrics import read_metrics  # noqa: E402

PANELS = (
    ("task", ("{env}/success", "{env}/episode_reward")),
    ("SNR-aware filter", ("rollout/filter_kept_ratio", "rollout/in_group_reward_std")),
    ("policy entropy", ("actor/entropy",)),
    ("MI estimate I(X;Z)", ("collapse_first_turn_sample/mi_estimate", "collapse_trajectory_sample/mi_estimate")),
    ("H(Z|X) estimate", ("collapse_first_turn_sample/conditional_entropy_est",
                         "collapse_trajectory_sample/conditional_entropy_est")),
    ("retrieval accuracy", ("collapse_first_turn_sample/retrieval_accuracy",
                            "collapse_first_turn_sample/retrieval_chance_level")),
)


def env_name(rows: list[dict]) -> str:
    """The env prefix of the `<env>/success` key."""
    return next((k.split("/")[0] for k in rows[0] if k.endswith("/success")), "env")


def label(key: str) -> str:
    """A short legend entry: the collapse family and metric, or the metric without its section."""
    if key.startswith("collapse_"):
        return key.removeprefix("collapse_").replace("_sample/", "/")
    return key.split("/", 1)[-1]


def plot(rows: list[dict], out: str) -> str:
    if not rows:
        raise ValueError("no metrics to plot: the metrics file is empty")
    env = env_name(rows)
    steps = np.array([r["step"] for r in rows])
    fig, axes = plt.subplots(2, 3, figsize=(13, 6.5), constrained_layout=True)
    for ax, (title, keys) in zip(axes.ravel(), PANELS):
        for key in keys:
            key = key.format(env=env)
            values = np.array([r.get(key, np.nan) for r in rows], float)
            if np.isfinite(values).any():
                ax.plot(steps, values, marker="o", ms=3, label=label(key))
        ax.set_title(title)
        ax.set_xlabel("step")
        if ax.lines:
            ax.legend(fontsize=7)
    fig.suptitle(f"{env}: {len(rows)} steps")
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("metrics", help="a metrics.jsonl written by the training loop")
    parser.add_argument("--out", default=None, help="PNG path (default: report.png beside the metrics)")
    args = parser.parse_args()
    out = args.out or os.path.join(os.path.dirname(os.path.abspath(args.metrics)), "report.png")
    print(f"wrote {plot(read_metrics(args.metrics), out)}")


if __name__ == "__main__":
    main()

"""Plot a run's metrics, or a sweep's members side by side: task success next to the collapse diagnostics
(docs/diagnostics.md).

    ragen-report runs/demo [--out runs/demo/report.png]     # a run's workdir (or its metrics.jsonl)
    .venv/bin/python -m experiments.report runs/demo        # the same
    ragen-report runs/sweep                                 # a sweep folder (sweep.json): one line per member
    ragen-report runs/sweep --group-by filter.value         # mean +- std over the seeds
    ragen-report runs/a runs/b --group-by sweep --out x.png # several sweeps pooled: one group per folder

With `--group-by` it also prints the summary and Spearman tables and, where the runs hold them, writes the
four-regime scatter (`report_regimes.png`), the gradient norms by reward-variance bucket (a table and
`report_gradients_by_KEY.png`) and, for a filter key, a steps x threshold heatmap of training success.

Panels: success, validation success and episode reward; filter kept ratio; policy entropy; MI estimates of both
collapse families (reasoning's dependence on the input); conditional entropy H(Z|X) (within-input diversity);
retrieval accuracy. Template collapse shows as H(Z|X) staying up while MI falls. Missing keys leave a panel empty.
For a sweep each panel draws, once per member, its first key that has values (validation success when validated).
It then prints the markdown of the newest transcripts (`samples/step_N.jsonl`, `ragen_jax.train.transcripts`) of the
run or of each member, when there are any.
"""
from __future__ import annotations

import argparse
import os

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from ragen_jax import metrics as metrics_lib  # noqa: E402
from ragen_jax.train import transcripts  # noqa: E402
from ragen_jax.train.metrics_log import read_metrics  # noqa: E402

PANELS = (
    ("task", ("val-env/{env}/success", "{env}/success", "{env}/episode_reward")),
    ("SNR-aware filter", ("rollout/filter_kept_ratio", "rollout/in_group_reward_std")),
    ("policy entropy", ("actor/entropy",)),
    ("MI estimate I(X;Z)", ("collapse_first_turn_sample/mi_estimate", "collapse_trajectory_sample/mi_estimate")),
    ("H(Z|X) estimate", ("collapse_first_turn_sample/conditional_entropy_est",
                         "collapse_trajectory_sample/conditional_entropy_est")),
    ("retrieval accuracy", ("collapse_first_turn_sample/retrieval_accuracy",
                            "collapse_first_turn_sample/retrieval_chance_level")),
)


def env_name(rows: list[dict]) -> str:
    """The env prefix of the training `<env>/success` key."""
    keys = {k for row in rows for k in row}
    return next((k.split("/")[0] for k in sorted(keys) if k.endswith("/success") and k.count("/") == 1), "env")


def label(key: str) -> str:
    """A short legend entry: the collapse family and metric, or the metric without its section."""
    if key.startswith("val-env/"):
        return "validation " + key.rsplit("/", 1)[-1]
    if key.startswith("collapse_"):
        return key.removeprefix("collapse_").replace("_sample/", "/")
    return key.split("/", 1)[-1]


def _series(rows: list[dict], key: str) -> tuple[np.ndarray, np.ndarray]:
    """(steps, values) of the rows holding a finite `key` (validation runs on some steps only)."""
    points = [(r["step"], r[key]) for r in rows if np.isfinite(r.get(key, np.nan))]
    return np.array([p[0] for p in points]), np.array([p[1] for p in points], float)


def plot(rows: list[dict], out: str) -> str:
    """One run's panels."""
    return plot_members({"": rows}, out)


def plot_members(members: dict[str, list[dict]], out: str) -> str:
    """Panels with one line per (member, key): all keys of a panel for one run, the first key per sweep member."""
    if not members or not all(members.values()):
        raise ValueError("no metrics to plot: a metrics file is empty")
    env = env_name(next(iter(members.values())))
    fig, axes = plt.subplots(2, 3, figsize=(13, 6.5), constrained_layout=True)
    for ax, (title, keys) in zip(axes.ravel(), PANELS):
        for name, rows in members.items():
            series = [(key, *_series(rows, key.format(env=env))) for key in keys]
            series = [s for s in series if len(s[2])]
            for key, steps, values in series[:1] if len(members) > 1 else series:
                ax.plot(steps, values, marker="o", ms=3, label=name or label(key.format(env=env)))
        ax.set_title(title)
        ax.set_xlabel("step")
        if ax.lines and len(members) == 1:
            ax.legend(fontsize=7)
    if len(members) > 1:  # member names are long: one legend under the panels (colours follow member order)
        handles = [plt.Line2D([], [], color=f"C{i}", marker="o", ms=3) for i in range(len(members))]
        fig.legend(handles, list(members), loc="outside lower center", fontsize=7, ncols=1)
    steps = max(len(rows) for rows in members.values())
    fig.suptitle(f"{env}: {steps} rows" + (f", {len(members)} sweep members" if len(members) > 1 else ""))
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def member_values(name: str) -> dict[str, str]:
    """{key: value} of a sweep member's name `key=value,key=value` (`ragen_jax.train.sweep` names members so); a
    member of several sweep folders, `folder/key=value,...`, also has the key `sweep` (the folder's name)."""
    folder, _, name = name.rpartition("/")
    return {**({"sweep": folder} if folder else {}), **dict(part.split("=", 1) for part in name.split(","))}


def pooled_members(folders: list[str]) -> dict[str, list[dict]]:
    """{member name: rows} of one sweep folder, or of several, named `folder/member` (folder: its base name)."""
    if len(folders) == 1:
        return metrics_lib.sweep_rows(folders[0])
    names = [os.path.basename(os.path.normpath(f)) for f in folders]
    if len(set(names)) < len(names):
        raise SystemExit(f"report: sweep folders need distinct names, got {names}")
    return {f"{n}/{member}": rows for n, f in zip(names, folders) for member, rows in metrics_lib.sweep_rows(f).items()}


def group_members(members: dict[str, list[dict]], key: str) -> dict[str, list[list[dict]]]:
    """{values of `key`: [rows of each member with those values]}, e.g. key `filter.value` pools the seeds;
    `key` may name several sweep keys, comma-separated (`filter.value,algo.entropy_coeff`)."""
    keys = key.split(",")
    groups: dict[str, list[list[dict]]] = {}
    for name, rows in members.items():
        values = member_values(name)  # a key one pooled folder did not sweep: its config's own value, unnamed
        groups.setdefault(",".join(f"{k}={values.get(k, 'fixed')}" for k in keys), []).append(rows)
    return groups


def plot_groups(groups: dict[str, list[list[dict]]], out: str) -> str:
    """Panels with one line per group: the mean over its members (e.g. seeds) and a band of +- one std."""
    env = env_name(next(iter(groups.values()))[0])
    fig, axes = plt.subplots(2, 3, figsize=(13, 6.5), constrained_layout=True)
    for ax, (title, keys) in zip(axes.ravel(), PANELS):
        for i, (name, runs) in enumerate(groups.items()):
            key = next((k.format(env=env) for k in keys if len(_series(runs[0], k.format(env=env))[0])), None)
            if key is None:
                continue
            steps, values = _series(runs[0], key)
            stack = np.stack([_series(rows, key)[1][:len(steps)] for rows in runs])
            mean, std = stack.mean(axis=0), stack.std(axis=0)
            ax.plot(steps, mean, marker="o", ms=3, color=f"C{i}", label=f"{name} ({len(runs)} runs)")
            ax.fill_between(steps, mean - std, mean + std, color=f"C{i}", alpha=0.2)
            ax.set_ylabel(label(key), fontsize=7)
        ax.set_title(title)
        ax.set_xlabel("step")
        if ax.lines:
            ax.legend(fontsize=7)
    fig.suptitle(f"{env}: mean and +-1 std over each group's runs")
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def summary_table(groups: dict[str, list[list[dict]]]) -> str:
    """Markdown: per group, validation success at the first and last validation (mean +- std, and per run)."""
    env = env_name(next(iter(groups.values()))[0])
    key = f"val-env/{env}/success"
    lines = ["| group | runs | first validation | last validation | per run (first -> last) |", "|---|---|---|---|---|"]
    for name, runs in groups.items():
        firsts, lasts = zip(*[(v[0], v[-1]) for v in (_series(rows, key)[1] for rows in runs)])
        per_run = ", ".join(f"{a:.3f} -> {b:.3f}" for a, b in zip(firsts, lasts))
        lines.append(f"| {name} | {len(runs)} | {np.mean(firsts):.3f} ± {np.std(firsts):.3f} | "
                     f"{np.mean(lasts):.3f} ± {np.std(lasts):.3f} | {per_run} |")
    return "\n".join(lines)


DIAGNOSTICS = (  # RAGEN-2 Fig. 10's rows: (label, key); success is each checkpoint's validation success
    ("first-turn MI estimate", "collapse_first_turn_sample/mi_estimate"),
    ("trajectory MI estimate", "collapse_trajectory_sample/mi_estimate"),
    ("first-turn MI z-score", "collapse_first_turn_sample/mi_zscore"),
    ("trajectory MI z-score", "collapse_trajectory_sample/mi_zscore"),
    ("retrieval accuracy", "collapse_first_turn_sample/retrieval_accuracy"),
    ("H(Z|X)", "collapse_first_turn_sample/conditional_entropy_est"),
    ("H(Z)", "collapse_first_turn_sample/reasoning_entropy_est"),
    ("policy entropy", "actor/entropy"),
)


def ranks(values: np.ndarray) -> np.ndarray:
    """Ranks 0..n-1 of `values`, ties sharing their mean rank."""
    _, inverse, counts = np.unique(values, return_inverse=True, return_counts=True)
    first = np.cumsum(counts) - counts  # the rank of each distinct value's first copy
    return (first + (counts - 1) / 2.0)[inverse.reshape(-1)]


def spearman(x, y) -> float:
    """Spearman's rank correlation of two equal-length sequences (NaN when either is constant)."""
    rx, ry = ranks(np.asarray(x, float)), ranks(np.asarray(y, float))
    if rx.std() == 0 or ry.std() == 0:
        return float("nan")
    return float(np.corrcoef(rx, ry)[0, 1])


def spearman_table(runs: list[list[dict]]) -> str:
    """Markdown: Spearman rho between validation success and each diagnostic over all checkpoints of `runs` (every
    row holding both the validation success and the diagnostic of that step's training batch)."""
    lines = ["| diagnostic | Spearman rho with validation success | checkpoints |", "|---|---|---|"]
    for name, diag in DIAGNOSTICS:
        pairs = validated_points(runs, (diag,))
        if len(pairs) >= 3:
            lines.append(f"| {name} | {spearman(*pairs.T):+.2f} | {len(pairs)} |")
    return "\n".join(lines)


REGIME_X, REGIME_Y = "collapse_first_turn_sample/conditional_entropy_est", "collapse_first_turn_sample/mi_estimate"


def validated_points(runs: list[list[dict]], keys: tuple[str, ...]) -> np.ndarray:
    """f64[N, 1 + len(keys)]: (validation success, *keys) of every row of `runs` where all of them are finite."""
    env = env_name(runs[0])
    wanted = (f"val-env/{env}/success", *keys)
    points = [[r.get(k, np.nan) for k in wanted] for rows in runs for r in rows]
    points = np.array(points, float).reshape(-1, len(wanted))
    return points[np.isfinite(points).all(axis=1)]


def plot_regimes(runs: list[list[dict]], out: str) -> str:
    """RAGEN-2's four regimes: each validated checkpoint at (H(Z|X), I(X;Z)) of its training batch's first-turn
    reasoning, coloured by validation success; the dashed lines are the medians of the points. Template collapse
    is the lower right (diverse within an input, independent of it), input-grounded reasoning the upper half."""
    points = validated_points(runs, (REGIME_X, REGIME_Y))
    if not len(points):
        raise ValueError("no checkpoint holds validation success and first-turn collapse diagnostics")
    success, h, mi = points.T
    fig, ax = plt.subplots(figsize=(6.5, 5), constrained_layout=True)
    dots = ax.scatter(h, mi, c=success, cmap="viridis", vmin=0, vmax=1, s=22, edgecolors="k", linewidths=0.3)
    fig.colorbar(dots, label="validation success")
    ax.axvline(np.median(h), color="grey", ls="--", lw=0.8)
    ax.axhline(np.median(mi), color="grey", ls="--", lw=0.8)
    for x, y, text in ((0.02, 0.97, "low entropy, input-grounded"), (0.98, 0.97, "diverse, input-grounded"),
                       (0.02, 0.03, "low-entropy collapse"), (0.98, 0.03, "template collapse")):
        ax.text(x, y, text, transform=ax.transAxes, ha="left" if x < 0.5 else "right",
                va="top" if y > 0.5 else "bottom", fontsize=8, color="dimgrey")
    ax.set_xlabel("H(Z|X) estimate (first turn)")
    ax.set_ylabel("MI estimate I(X;Z) (first turn)")
    ax.set_title(f"{env_name(runs[0])}: {len(points)} checkpoints of {len(runs)} runs")
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


GRAD_PREFIX = "grad_norm"


def bucket_names(runs: list[list[dict]]) -> list[str]:
    """`bucket_1` .. `bucket_n` of the gradient analysis (lowest reward variance first) present in `runs`."""
    keys = {k for rows in runs for r in rows for k in r if k.startswith(f"{GRAD_PREFIX}/bucket_")}
    return sorted({k.split("/")[1] for k in keys}, key=lambda b: int(b.split("_")[1]))


def bucket_means(runs: list[list[dict]], stat: str) -> np.ndarray:
    """f64[n buckets]: the mean of `grad_norm/<bucket>/<stat>` over every analysed step of `runs` (NaN-skipping:
    an empty bucket reports NaN)."""
    out = []
    for bucket in bucket_names(runs):
        values = [r[f"{GRAD_PREFIX}/{bucket}/{stat}"] for rows in runs for r in rows
                  if f"{GRAD_PREFIX}/{bucket}/{stat}" in r]
        values = np.array(values, float)
        out.append(np.nanmean(values) if np.isfinite(values).any() else np.nan)
    return np.array(out)


GRAD_STATS = ("reward_std_mean", "task", "entropy", "kl", "sample_count")


def gradient_table(groups: dict[str, list[list[dict]]]) -> str:
    """Markdown: per group and reward-variance bucket, the mean reward std and gradient-component norms."""
    lines = ["| group | bucket | " + " | ".join(GRAD_STATS) + " |", "|---|---|" + "---|" * len(GRAD_STATS)]
    for name, runs in groups.items():
        columns = [bucket_means(runs, stat) for stat in GRAD_STATS]
        for b, bucket in enumerate(bucket_names(runs)):
            lines.append(f"| {name} | {bucket} | " + " | ".join(f"{c[b]:.4g}" for c in columns) + " |")
    return "\n".join(lines)


def plot_gradients(groups: dict[str, list[list[dict]]], out: str) -> str:
    """Gradient-component norms (task, entropy) by reward-variance bucket, one line style per component and one
    colour per group; x is the bucket's mean reward std, so a task norm growing with RV rises to the right."""
    if not bucket_names([rows for runs in groups.values() for rows in runs]):
        raise ValueError("no gradient analysis in these runs (diagnostics.grad_analysis_every = 0)")
    fig, ax = plt.subplots(figsize=(6.5, 4.5), constrained_layout=True)
    for i, (name, runs) in enumerate(groups.items()):
        rv = bucket_means(runs, "reward_std_mean")
        for comp, style in (("task", "-"), ("entropy", ":")):
            norms = bucket_means(runs, comp)
            ax.plot(rv, norms, style, marker="o", ms=4, color=f"C{i}", label=f"{name}: {comp}")
    ax.set_yscale("log")
    ax.set_xlabel("bucket mean reward std (low -> high reward variance)")
    ax.set_ylabel("gradient norm (mean over analysed steps)")
    ax.legend(fontsize=7)
    ax.set_title("gradient components by reward-variance bucket")
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def heatmap_grid(groups: dict[str, list[list[dict]]], key: str) -> tuple[list[int], np.ndarray]:
    """(steps, f64[groups, steps]): the mean of `key` over each group's runs at each step holding it (NaN where
    none does)."""
    steps = sorted({int(s) for runs in groups.values() for rows in runs for s in _series(rows, key)[0]})
    grid = np.full((len(groups), len(steps)), np.nan)
    for g, runs in enumerate(groups.values()):
        by_step = [dict(zip(*_series(rows, key))) for rows in runs]
        for s, step in enumerate(steps):
            values = [values_at[step] for values_at in by_step if step in values_at]
            grid[g, s] = np.mean(values) if values else np.nan
    return steps, grid


def plot_heatmap(groups: dict[str, list[list[dict]]], key: str, out: str) -> str:
    """Steps x group (e.g. top-p threshold) heatmap of `key` (`{env}` filled in), averaged over each group's runs."""
    key = key.format(env=env_name(next(iter(groups.values()))[0]))
    steps, grid = heatmap_grid(groups, key)
    fig, ax = plt.subplots(figsize=(max(6.0, 0.25 * len(steps) + 2), 0.5 * len(groups) + 2), constrained_layout=True)
    image = ax.imshow(grid, aspect="auto", cmap="viridis", interpolation="nearest")
    fig.colorbar(image, label=label(key))
    ax.set_yticks(range(len(groups)), list(groups), fontsize=7)
    ticks = range(0, len(steps), max(1, len(steps) // 10))
    ax.set_xticks(list(ticks), [str(steps[t]) for t in ticks])
    ax.set_xlabel("step")
    ax.set_title(f"{key}: mean over each group's runs")
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("metrics", nargs="+",
                        help="a run's workdir or metrics.jsonl, or one or several sweep folders (pooled: their "
                             "members grouped by any key, `sweep` for the folder; the Spearman table over all)")
    parser.add_argument("--out", default=None, help="PNG path (default: report.png in the run or sweep folder)")
    parser.add_argument("--group-by", default=None,
                        help="a sweep key (e.g. filter.value), or several comma-separated: one line per value, mean "
                             "and std over the other axes")
    args = parser.parse_args(None if argv is None else argv[1:])
    if len(args.metrics) > 1 and not (args.group_by and all(map(metrics_lib.is_sweep, args.metrics))):
        raise SystemExit("report: several folders must all be sweep folders, with --group-by")
    if metrics_lib.is_sweep(args.metrics[0]):
        members, folder = pooled_members(args.metrics), args.metrics[0]
        if args.group_by:
            groups = group_members(members, args.group_by)
            out = args.out or os.path.join(folder, f"report_by_{args.group_by}.png")
            print(summary_table(groups))
            print(spearman_table(list(members.values())))
            print(f"wrote {plot_groups(groups, out)}")
            runs = list(members.values())
            stem = os.path.splitext(args.out)[0] if args.out else os.path.join(folder, "report")
            if len(validated_points(runs, (REGIME_X, REGIME_Y))):
                print(f"wrote {plot_regimes(runs, stem + '_regimes.png')}")
            if bucket_names(runs):
                print(gradient_table(groups))
                print(f"wrote {plot_gradients(groups, stem + f'_gradients_by_{args.group_by}.png')}")
            if args.group_by.startswith("filter."):
                print(f"wrote {plot_heatmap(groups, '{env}/success', stem + f'_heatmap_{args.group_by}.png')}")
            return
        out = args.out or os.path.join(folder, "report.png")
        print(f"wrote {plot_members(members, out)}")
        for name in members:
            print_transcripts(os.path.join(folder, name), f"# {name}")
        return
    path = args.metrics[0]
    folder = path if os.path.isdir(path) else os.path.dirname(os.path.abspath(path))
    out = args.out or os.path.join(folder, "report.png")
    print(f"wrote {plot(read_metrics(path), out)}")
    print_transcripts(folder)


def print_transcripts(folder: str, heading: str | None = None) -> None:
    """Prints the markdown of the newest validation and training-batch transcripts in `folder`/samples
    (`train.transcripts.report`), if it holds any."""
    text = transcripts.report(folder)
    if text is not None:
        print("\n".join(([heading, ""] if heading else []) + [text]))


if __name__ == "__main__":
    main()

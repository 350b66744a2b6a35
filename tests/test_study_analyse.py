"""experiments/studies/analyse.py on a made-up filter_vs_none study: the endpoints, paired differences and tests it
prints are those computed here by hand from the same metric rows."""
from __future__ import annotations

import json
import os

import numpy as np
import pytest

from experiments.report import spearman
from experiments.studies import collect
from experiments.studies.analyses import diagnostics_vs_success, filter_vs_none, gradient_buckets, template_collapse
from ragen_jax.train.metrics_log import read_metrics

SUCCESS = "val-env/frozen_lake/success"
ARMS = {"none": ("1.0", "True"), "zero-variance drop": ("1.0", "False"), "top-p 0.9": ("0.9", "False")}
LIFT = {"none": 0.0, "zero-variance drop": 0.02, "top-p 0.9": 0.05}  # added to every validation point of an arm


def write_member(folder: str, arm: str, seed: int, base: float) -> list[float]:
    value, include_zero = ARMS[arm]
    member = os.path.join(folder, f"filter.value={value},filter.include_zero={include_zero},train.seed={seed}")
    os.makedirs(member)
    points = [base + LIFT[arm] + 0.01 * step / 10 + 0.003 * ((seed * 7 + step) % 5) for step in range(0, 60, 10)]
    with open(os.path.join(member, "metrics.jsonl"), "w", encoding="utf-8") as f:
        for step in range(0, 51):
            row = {"step": step, "actor/pg_loss": 0.1}
            if step % 10 == 0:
                row[SUCCESS] = points[step // 10]
            f.write(json.dumps(row) + "\n")
    return points


def test_filter_vs_none_prints_the_paired_tests_of_its_endpoints(tmp_path):
    study = str(tmp_path / "filter_vs_none")
    endpoints = {arm: [] for arm in ARMS}
    for seed in range(4):
        base = 0.3 + 0.04 * seed
        for arm in ARMS:
            endpoints[arm].append(np.mean(write_member(os.path.join(study, "ppo"), arm, seed, base)[-3:]))
    lines = filter_vs_none.analyse(study, str(tmp_path / "figure.png"))
    assert os.path.getsize(tmp_path / "figure.png") > 10_000
    rows = {tuple(cell.strip() for cell in line.strip("|").split("|")[:2]): line for line in lines if "|" in line}
    e = {arm: np.array(v) for arm, v in endpoints.items()}
    assert f"| {e['none'].mean():.3f} | {e['none'].std(ddof=1):.3f} |" in rows[("ppo", "none")]
    for b, a in (("top-p 0.9", "none"), ("zero-variance drop", "none"), ("top-p 0.9", "zero-variance drop")):
        d = e[b] - e[a]
        # every paired difference has the same sign: of the 16 sign patterns only all-plus and all-minus are as extreme
        assert np.all(d > 0)
        line = rows[("ppo", f"{b} - {a}")]
        assert f"| {d.mean():+.3f} |" in line and f"| {2 / 16:.4f} |" in line
    assert rows[("ppo", "top-p 0.9 - none")].rstrip().endswith("| primary |")
    # Holm over the two secondary tests, both p = 1/8: each becomes 2 x 1/8
    assert rows[("ppo", "zero-variance drop - none")].rstrip().endswith(f"| {0.25:.4f} |")


def test_endpoint_needs_three_validation_points():
    rows = [{"step": 0, SUCCESS: 0.2}, {"step": 10, SUCCESS: 0.4}, {"step": 20}]
    with pytest.raises(ValueError, match="2 validation points, fewer than 3"):
        filter_vs_none.endpoint(rows)
    assert filter_vs_none.endpoint(rows + [{"step": 30, SUCCESS: 0.9}]) == pytest.approx(0.5)


def test_collect_copies_a_sweeps_metrics_gzipped_and_refuses_a_second_copy(tmp_path):
    run = str(tmp_path / "run")
    write_member(run, "none", 0, 0.3)
    write_member(run, "top-p 0.9", 0, 0.3)
    names = sorted(os.listdir(run))
    with open(os.path.join(run, "sweep.json"), "w", encoding="utf-8") as f:
        json.dump({"names": names}, f)
    with open(os.path.join(run, "config.json"), "w", encoding="utf-8") as f:
        f.write("{}")
    dest = str(tmp_path / "study" / "ppo")
    assert collect.collect(run, dest, "seeds_0") == names
    for name in names:
        assert os.listdir(os.path.join(dest, name)) == ["metrics.jsonl.gz"]
        assert read_metrics(os.path.join(dest, name)) == read_metrics(os.path.join(run, name))
    assert sorted(os.listdir(os.path.join(dest, "sweeps", "seeds_0"))) == ["config.json", "sweep.json"]
    with pytest.raises(ValueError, match="already holds"):
        collect.collect(run, dest, "seeds_0_again")
    with pytest.raises(ValueError, match="not a sweep's folder"):
        collect.collect(os.path.join(run, names[0]), dest, "x")


# ----------------------------------------------------------------------------------------- template_collapse
FAITH = "val-faithfulness/frozen_lake"
MI, H = "collapse_first_turn_sample/mi_estimate", "collapse_first_turn_sample/conditional_entropy_est"
FALL = {"1.0": 0.004, "0.9": 0.002}  # faithfulness lost per step, by filter value


def write_collapse_member(folder: str, value: str, seed: int) -> dict[str, float]:
    """A run whose faithfulness and MI fall linearly while H(Z|X) rises; returns its protocol changes by hand."""
    member = os.path.join(folder, f"filter.value={value},train.seed={seed}")
    os.makedirs(member)
    wobble = 0.001 * seed
    with open(os.path.join(member, "metrics.jsonl"), "w", encoding="utf-8") as f:
        for step in range(0, 61):
            row = {"step": step}
            if step:
                row.update({MI: 0.8 - 0.003 * step + wobble, H: 0.1 + 0.0002 * step,
                            "collapse_first_turn_sample/retrieval_accuracy": 1.0,
                            "collapse_trajectory_sample/mi_estimate": 0.7})
            if step % 10 == 0:
                row.update({FAITH: 0.7 - FALL[value] * step - wobble, "val-env/frozen_lake/success": 0.3,
                            **{f"{FAITH}/{fact}": 0.5 for fact in ("player", "goal", "rows", "cols")}})
            f.write(json.dumps(row) + "\n")
    faith_end = np.mean([0.7 - FALL[value] * s - wobble for s in (40, 50, 60)])
    mi = lambda steps: np.mean([0.8 - 0.003 * s + wobble for s in steps])  # noqa: E731
    h = lambda steps: np.mean([0.1 + 0.0002 * s for s in steps])  # noqa: E731
    return {"dF": faith_end - (0.7 - wobble), "dMI": mi(range(56, 61)) - mi(range(1, 6)),
            "rH": h(range(56, 61)) / h(range(1, 6)) - 1}


def test_template_collapse_prints_changes_tests_and_verdicts(tmp_path):
    study = str(tmp_path / "template_collapse")
    by_hand = {v: [write_collapse_member(os.path.join(study, "frozen_lake"), v, s) for s in range(6)] for v in FALL}
    lines = template_collapse.analyse(study, str(tmp_path / "figure.png"))
    assert os.path.getsize(tmp_path / "figure.png") > 10_000
    text = "\n".join(lines)
    for value, arm in (("1.0", "none"), ("0.9", "top-p 0.9")):
        for change, quantity in (("dF", "faithfulness"), ("dMI", "MI"), ("rH", "H(Z|X), relative")):
            d = np.array([c[change] for c in by_hand[value]])
            # every run changes the same way: a sign-flip p of 2 / 2^6
            assert f"| {arm} | 6 | {quantity} |" in text and f"| {d.mean():+.3f} |" in text
        assert f"- {arm}: F falls True, MI falls True, H(Z|X) holds True: **template collapse**" in text
    # the filter halves the fall of faithfulness in every seed (p 2/64, Holm 2 x that) and leaves MI's (p 1)
    d_f = np.array([b["dF"] - a["dF"] for a, b in zip(by_hand["1.0"], by_hand["0.9"])])
    assert f"| dF | 6 | {d_f.mean():+.3f} |" in text and f"| {2 / 64:.4f} | {4 / 64:.4f} |" in text
    assert "| dMI | 6 | +0.000 |" in text and "| 1.0000 | 1.0000 |" in text
    assert "Spearman rho of dMI with dF over the 12 runs" in text


def test_template_collapse_verdicts():
    assert template_collapse.verdict(True, True, True) == "template collapse"
    assert template_collapse.verdict(True, True, False) == "low-entropy collapse"
    assert template_collapse.verdict(True, False, True) == "faithfulness falls unseen by MI"
    assert template_collapse.verdict(False, True, True) == "no collapse here, with this power"


# ----------------------------------------------------------------------------------------- gradient_buckets
def write_bucket_member(folder: str, seed: int, task_slope: float) -> list[dict]:
    """A run analysed at steps 1, 6 and 11 (step 1 is skipped): bucket b has reward std b - 1 (+ a seed wobble), task
    norm task_slope x std + 1, a KL norm flat around 2 and an entropy norm rising from 1 to 2.5; the other steps carry
    the analysis keys as NaN, as a sweep logs them."""
    member = os.path.join(folder, f"train.seed={seed}")
    os.makedirs(member)
    units = []
    with open(os.path.join(member, "metrics.jsonl"), "w", encoding="utf-8") as f:
        for step in range(1, 13):
            row = {"step": step}
            if step in (1, 6, 11):
                rv = np.arange(6.0) + 0.01 * seed
                unit = {"rv": rv, "task": task_slope * rv + 1.0, "kl": 2.0 + 0.05 * np.sin(rv + step),
                        "entropy": 1.0 + 0.3 * np.arange(6.0)}
                for b in range(6):
                    row.update({f"grad_norm/bucket_{b + 1}/reward_std_mean": rv[b],
                                **{f"grad_norm/bucket_{b + 1}/{c}": unit[c][b] for c in ("task", "kl", "entropy")}})
                units += [unit] if step > 1 else []
            else:
                row.update({key: float("nan") for b in range(6) for key in
                            (f"grad_norm/bucket_{b + 1}/{c}" for c in ("reward_std_mean", "task", "kl", "entropy"))})
            f.write(json.dumps(row) + "\n")
    return units


def test_gradient_buckets_prints_slopes_sign_tests_spreads_and_verdicts(tmp_path):
    study = str(tmp_path / "gradient_buckets")
    units = {"ppo": [], "drgrpo": []}
    for seed in range(4):
        units["ppo"] += write_bucket_member(os.path.join(study, "ppo"), seed, 0.5)
        units["drgrpo"] += write_bucket_member(os.path.join(study, "drgrpo"), seed, 0.5 if seed else -0.5)
    lines = gradient_buckets.analyse(study, str(tmp_path / "figure.png"))
    assert os.path.getsize(tmp_path / "figure.png") > 10_000
    text = "\n".join(lines)
    # ppo: all 8 slopes +0.5: p = 2 / 2^8, Holm over the two algorithms doubles it; drgrpo: 6 of 8 positive,
    # p = 2 x (1 + 8 + 28) / 256
    assert "| ppo | 8 | 0.00 - 5.03 | 8 of 8 | +0.5000 |" in text and f"| {2 / 256:.4f} | {4 / 256:.4f} |" in text
    assert f"| drgrpo | 8 | 0.00 - 5.03 | 6 of 8 | {(0.5 * 6 - 0.5 * 2) / 8:+.4f} |" in text
    assert f"| {74 / 256:.4f} | {74 / 256:.4f} |" in text
    task_spread = np.median([gradient_buckets.spread(u["task"]) for u in units["ppo"]])
    kl_spread = np.median([gradient_buckets.spread(u["kl"]) for u in units["ppo"]])
    assert f"| ppo | task | {task_spread:.3f} | +1.00 | (reference) |" in text
    assert f"| ppo | kl | {kl_spread:.3f} |" in text and kl_spread < 0.5
    assert f"| ppo | entropy | {1.5 / 1.75:.3f} | +1.00 | False |" in text  # spread (2.5 - 1) / 1.75 > 0.5
    assert "- ppo (primary): **task trend only**" in text
    assert "- drgrpo: **not reproduced here, with this power**" in text


def test_gradient_bucket_slope_and_verdicts():
    assert gradient_buckets.slope(np.arange(4.0), 3 * np.arange(4.0) + 1) == pytest.approx(3.0)
    assert gradient_buckets.slope(np.ones(4), np.arange(4.0)) == 0.0
    assert gradient_buckets.verdict(0.2, 0.01, True) == "reproduced"
    assert gradient_buckets.verdict(-0.2, 0.01, True) == "reversed"
    assert gradient_buckets.verdict(0.2, 0.2, True) == "not reproduced here, with this power"
    with pytest.raises(ValueError, match="step 6: no gradient analysis"):
        gradient_buckets.analyses([{"step": 1}, {"step": 6}])


# ----------------------------------------------------------------------------------------- diagnostics_vs_success
def write_population_member(folder: str, entropy: float, value: str, seed: int, quality: float) -> None:
    """A run whose success and first-turn MI both rise with `quality` (MI's order equals success's) while H(Z|X) is
    unrelated to it; the diagnostics run at step 1 and every 5 steps and are NaN on the others (as a sweep logs
    them), success at every tenth."""
    member = os.path.join(folder, f"algo.entropy_coeff={entropy},filter.value={value},train.seed={seed}")
    os.makedirs(member)
    noise = np.random.default_rng(int(quality * 1000))
    with open(os.path.join(member, "metrics.jsonl"), "w", encoding="utf-8") as f:
        for step in range(0, 101):
            row = {"step": step}
            if step:
                diagnosed = step == 1 or step % 5 == 0
                row.update({key: value if diagnosed else float("nan") for key, value in (
                    (MI, quality + 0.001 * step), (H, noise.uniform(0.5, 1.5)),
                    ("collapse_first_turn_sample/retrieval_accuracy", 0.5 + quality / 4),
                    ("collapse_first_turn_sample/mi_zscore", 3 * quality),
                    ("collapse_trajectory_sample/mi_zscore", noise.normal()))})
            if step % 10 == 0:
                row.update({"val-env/frozen_lake/success": 0.2 + quality / 2 + 0.0005 * step,
                            FAITH: 1.0 - quality / 2})  # faithfulness falls as success rises: rho -1
            f.write(json.dumps(row) + "\n")


def test_diagnostics_vs_success_prints_rhos_intervals_and_the_gap_test(tmp_path):
    study = str(tmp_path / "diagnostics_vs_success")
    qualities = iter(np.linspace(0.0, 1.0, 20)[np.random.default_rng(0).permutation(20)])
    for entropy in (0.0, 0.01):
        for value in ("1.0", "0.9"):
            for seed in range(5):
                write_population_member(os.path.join(study, "frozen_lake"), entropy, value, seed, next(qualities))
    lines = diagnostics_vs_success.analyse(study, str(tmp_path / "figure.png"))
    assert os.path.getsize(tmp_path / "figure.png") > 10_000
    text = "\n".join(lines)
    assert text.startswith("20 runs in 4 arms;")
    assert "| entropy 0.01, filter 0.9 | 5 |" in text
    # MI orders the runs exactly as success does: rho 1 in every resample; retrieval and the first-turn z-score too
    for name in ("MI", "retrieval accuracy", "first-turn MI z-score"):
        for kind in ("window", "early", "within"):
            assert f"| {name} | {kind} | +1.000 | [+1.000, +1.000] |" in text
    for kind in ("window", "early", "within"):
        assert f"| faithfulness | {kind} | -1.000 | [-1.000, -1.000] |" in text
    runs, _ = diagnostics_vs_success.load_runs(study)
    window_h = [np.mean([r[H] for r in rows if 51 <= r["step"] <= 100 and r["step"] % 5 == 0]) for rows in runs]
    finals = [np.mean([r["val-env/frozen_lake/success"] for r in rows if r["step"] in (80, 90, 100)]) for rows in runs]
    rho_h = spearman(window_h, finals)
    assert f"| H(Z|X) | window | {rho_h:+.3f} |" in text
    assert f"| window (primary) | {1 - abs(rho_h):+.3f} |" in text
    assert "**reproduced: MI tracks success, and better than H(Z|X)**" in text


def test_diagnostics_vs_success_verdicts():
    assert diagnostics_vs_success.verdict((0.6, 0.3, 0.8), (0.4, 0.1, 0.6)).startswith("reproduced")
    assert diagnostics_vs_success.verdict((0.1, -0.2, 0.4), (-0.4, -0.6, -0.1)).startswith("reversed")
    assert diagnostics_vs_success.verdict((0.6, 0.3, 0.8), (0.2, -0.1, 0.5)) == "not resolved with this power"
    assert diagnostics_vs_success.verdict((0.6, -0.1, 0.8), (0.2, 0.1, 0.5)) == "not resolved with this power"


def test_every_result_quotes_what_the_script_prints_from_the_committed_metrics(tmp_path):
    """Each study's RESULT.md holds, verbatim, every line `analyse.py <study>` prints from its committed metrics."""
    from experiments.studies import analyse

    studies = [s for s in sorted(analyse.STUDIES) if os.path.exists(os.path.join(analyse.FOLDER, s, "RESULT.md"))]
    assert "template_collapse" in studies
    for study in studies:
        lines = analyse.STUDIES[study](os.path.join(analyse.FOLDER, study), str(tmp_path / f"{study}.png"))
        with open(os.path.join(analyse.FOLDER, study, "RESULT.md"), encoding="utf-8") as f:
            result = f.read()
        missing = [line for line in lines if line and line not in result]
        assert not missing, (study, missing[:3])

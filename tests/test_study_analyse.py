"""experiments/studies/analyse.py on a made-up filter_vs_none study: the endpoints, paired differences and tests it
prints are those computed here by hand from the same metric rows."""
from __future__ import annotations

import json
import os

import numpy as np
import pytest

from experiments.studies import analyse, collect
from ragen_jax.train.metrics import read_metrics

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
    lines = analyse.filter_vs_none(study, str(tmp_path / "figure.png"))
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
        analyse.endpoint(rows)
    assert analyse.endpoint(rows + [{"step": 30, SUCCESS: 0.9}]) == pytest.approx(0.5)


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

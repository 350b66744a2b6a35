"""Throughput of the study setting: FrozenLake tiny as a vectorised sweep of S = 1, 4 and 16 members.

    .venv/bin/python -m experiments.benchmarks.study_throughput [--quick] [--sizes 1,4,16] [--steps 3]

`configs/frozen_lake.py:tiny` with 256 validation prompts every 10 steps (a powered study's setting) as a
`ragen_jax.train.sweep.Sweep` whose members differ in seed and filter value (S = 1: filter 1.0, seed 0; S >= 2:
filter.value in (1.0, 0.5) x seeds 0 .. S/2 - 1). Each S in turn, with a persistent compilation cache in a fresh
temporary folder (the compiles in child processes, the rest in this one):
  compile_s: the fused sweep step's tracing + lowering + XLA compilation in a new Python process (`--compile S`), as a
    study's first run pays it; cached_s: the same in a second new process on the same cache folder, whose program
    comes from the persistent cache (what a rerun pays). Each is its own process: in this one, a lowering after other
    programs have been traced can differ from a new process's (JAX's trace caches evict in another order) and then
    misses the cache where a rerun hits it;
  step_s: the median of `steps` calls of the fused step after its first two;
  phases_s: the same step as four vmapped programs (`Sweep.phased_step`), median of `steps` calls per phase;
  validation_s: the vmapped validation rollout of every member (median of 2 calls after its first), and
    validation_amortised_s = validation_s / train.test_freq;
  member_steps_per_min = 60 S / (step_s + validation_amortised_s).
The floor: the matmul FLOPs of a member-step counted from the shapes (`_flops.forward_flops` over each member's real
tokens at the measured mean lengths: rollout = one forward over the trajectories; prepare = the old and reference
log-prob forwards; update = forward + backward per epoch; diagnostics = per family, num_samples prompts prefilled and
num_samples^2 reasoning spans scored after them; validation amortised) divided by the float32 matmul rate timed in
the same run (`_flops.matmul_reference`); `over_floor` = measured / floor. Prints one JSON line.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import jax

from configs import frozen_lake
from experiments.benchmarks._flops import forward_flops, matmul_reference, train_flops
from experiments.benchmarks._goals import goals_met
from ragen_jax import compile_cache
from ragen_jax.config import apply_overrides
from ragen_jax.train.host import Timed
from ragen_jax.train.loop import make_validator
from ragen_jax.train.step import PHASES
from ragen_jax.train.sweep import Sweep

GOALS = {"s16.member_steps_per_min": 40, "per_member_s16_over_s1": ("<=", 0.5), "s16.compile_s": ("<=", 90),
         "s16.cached_over_compile": ("<=", 0.25)}
STUDY = {"rollout.val_num_groups": 256, "rollout.val_group_size": 1, "train.test_freq": 10, "checkpoint.dir": "",
         "logging.dir": "", "logging.progress_bar": False}
FILTER_VALUES = (1.0, 0.5)


def study_config(cache: str):
    return apply_overrides(frozen_lake.get_config("tiny"), {**STUDY, "logging.compilation_cache": cache})


def points(size: int) -> list[dict]:
    if size == 1:
        return [{"filter.value": FILTER_VALUES[0], "train.seed": 0}]
    return [{"filter.value": v, "train.seed": s} for v in FILTER_VALUES for s in range(size // 2)]


def median_time(fn, calls: int) -> float:
    times = []
    for _ in range(calls):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def member_step_flops(config, train_step, metrics: dict) -> dict[str, float]:
    """A member-step's matmul FLOPs by phase at the mean trajectory / response lengths of its `metrics`."""
    c, r, d, o = train_step.model.config, config.rollout, config.diagnostics, train_step.options
    rows, length = r.num_groups * r.group_size, round(metrics["trajectory_length/mean"])
    response = round(metrics["response_length/mean"])
    prompt = length - response
    forward = forward_flops(c, rows, length)
    spans = forward_flops(c, 1, length) - forward_flops(c, 1, prompt)  # one reasoning span after a prompt
    families = int(d.first_turn_enabled) + int(d.multi_turn_enabled)
    n = d.num_samples
    return {
        "rollout": forward,
        "diagnostics": families * (n * forward_flops(c, 1, prompt) + n * n * spans) if d.collapse_every == 1 else 0.0,
        "prepare": (1 + int(o.use_ref)) * forward + int(o.use_critic) * forward,
        "update": config.algo.ppo_epochs * (1 + int(o.use_critic)) * train_flops(c, rows, length),
        "validation_amortised": forward_flops(c, r.val_num_groups * r.val_group_size, length) / config.train.test_freq,
    }


def compile_step(config, size: int) -> float:
    """Seconds to trace, lower and compile the S = `size` fused step (or load it from the persistent cache)."""
    sweep = Sweep(config, points(size), log=None)
    stacked = sweep.stack_states(sweep.initial_states())
    start = time.perf_counter()
    with jax.set_mesh(sweep.mesh):
        sweep.step_fn(jax.eval_shape(lambda: stacked)).lower(stacked, *sweep.step_args([False] * size)).compile()
    return time.perf_counter() - start


def new_process_compile_s(size: int) -> float:
    """`compile_step` in a new process on this process's cache folder."""
    out = subprocess.run([sys.executable, "-m", "experiments.benchmarks.study_throughput", "--compile", str(size),
                          "--cache", jax.config.jax_compilation_cache_dir], check=True, capture_output=True,
                         text=True, cwd=os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    return float(out.stdout.split()[-1])


def bench_size(config, size: int, steps: int, matmul_rate: float) -> dict:
    log = lambda line: print(f"[S={size}] {line}", file=sys.stderr, flush=True)  # noqa: E731
    compile_s, cached_s = new_process_compile_s(size), new_process_compile_s(size)
    log(f"compiled in {compile_s:.1f} s in a new process, {cached_s:.1f} s in the next")
    sweep = Sweep(config, points(size), log=None)
    stacked = sweep.stack_states(sweep.initial_states())
    abstract = jax.eval_shape(lambda: stacked)
    args = sweep.step_args([False] * size)
    with jax.set_mesh(sweep.mesh):
        step = Timed(sweep.step_fn(abstract), "step")
        (state, metrics, _), _ = step(stacked, *args)
        (state, metrics, _), _ = step(state, *args)  # the second call is still slow (first touches of its buffers)
        times = []
        for _ in range(steps):
            (state, metrics, _), timing = step(state, *args)
            times.append(timing["timing_s/step"])
        log(f"steps {[round(t, 2) for t in times]}")
        phased = sweep.phased_step(abstract)
        phases = {name: [] for name in PHASES}
        for i in range(steps + 1):
            (state, _, _), timing = phased(state, *args[:2])
            if i:
                for name in PHASES:
                    phases[name].append(timing[f"timing_s/{name}"])
        validate, _ = make_validator(config, sweep.parts)
        validate_fn = sweep.validate_fn(validate)
        jax.block_until_ready(validate_fn(state.actor))
        validation_s = median_time(lambda: jax.block_until_ready(validate_fn(state.actor)), 2)
    member0 = {k: float(v[0]) for k, v in metrics.items()}
    flops = member_step_flops(config, sweep.train_step, member0)
    step_s = statistics.median(times)
    amortised = validation_s / config.train.test_freq
    floor_s = size * sum(flops.values()) / matmul_rate
    result = {
        "members": size, "compile_s": round(compile_s, 1), "cached_s": round(cached_s, 1),
        "cached_over_compile": round(cached_s / compile_s, 3), "step_s": round(step_s, 3),
        "step_rounds_s": [round(t, 3) for t in times],
        "phases_s": {name: round(statistics.median(v), 3) for name, v in phases.items()},
        "validation_s": round(validation_s, 3), "validation_amortised_s": round(amortised, 3),
        "member_steps_per_min": round(60 * size / (step_s + amortised), 2),
        "per_member_s": round((step_s + amortised) / size, 3),
        "member_step_gflop": {k: round(v / 1e9, 2) for k, v in flops.items()},
        "floor_s": round(floor_s, 3), "over_floor": round((step_s + amortised) / floor_s, 1),
        "mean_trajectory_tokens": round(member0["trajectory_length/mean"], 1),
        "mean_response_tokens": round(member0["response_length/mean"], 1),
    }
    log(json.dumps(result))
    return result


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1,4,16", help="member counts, comma-separated")
    parser.add_argument("--steps", type=int, default=3, help="timed calls of each program after its first")
    parser.add_argument("--quick", action="store_true", help="S = 1 and 2, one timed call")
    parser.add_argument("--compile", type=int, metavar="S", help=argparse.SUPPRESS)  # new_process_compile_s's child
    parser.add_argument("--cache", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.compile:
        compile_cache.enable(args.cache)
        print(round(compile_step(study_config(args.cache), args.compile), 2))
        return
    sizes = [1, 2] if args.quick else [int(s) for s in args.sizes.split(",")]
    steps = 1 if args.quick else args.steps
    cache = tempfile.mkdtemp(prefix="study_throughput_xla_")
    compile_cache.enable(cache)  # before the first compilation: each program's first compile is a real one
    config = study_config(cache)
    run_matmul, matmul = matmul_reference()
    run_matmul()
    matmul_rate = matmul / median_time(run_matmul, 3)
    results = {f"s{size}": bench_size(config, size, steps, matmul_rate) for size in sizes}
    out = {"benchmark": "study_throughput", "jax": jax.__version__, "device": jax.devices()[0].device_kind,
           "cores": os.cpu_count(), "steps": steps, "matmul_gflops": round(matmul_rate / 1e9, 1),
           "setting": "configs/frozen_lake.py:tiny, 8 x 8 rollouts, 256 validation prompts every 10 steps",
           **results}
    last = f"s{sizes[-1]}"
    out[f"per_member_{last}_over_s1"] = round(results[last]["per_member_s"] / results["s1"]["per_member_s"], 3)
    out["goals_met"] = goals_met(out, GOALS)
    print(json.dumps(out))


if __name__ == "__main__":
    main(sys.argv[1:])

"""A vectorised sweep step vs the same members stepped one after another.

    .venv/bin/python experiments/benchmarks/sweep.py [--quick] [--members 4] [--repeats 3]

The former demo geometry (`GEOMETRY`: a d64 x 2 model, FrozenLake, 4 groups x 4 rollouts, 2 turns, responses of up
to 80 tokens, GRPO with the paper filter, collapse diagnostics every step, no SFT). S members differ in `filter.value`
(1.0, 0.9, 0.5, 0.25, ...). Peer: one compiled single-run step (`jax.jit(TrainStep)`) called once per member with
that member's state and hyperparameters; ours: `ragen_jax.train.sweep.Sweep.step_fn`, all members in one call.
Both compiled and run once first; then `repeats` rounds time one peer pass (S calls) and one sweep call; the figures
are the best times. Prints one JSON line: seconds per pass and sweep / sequential.

Under vmap the skipping of dropped minibatches becomes a select (module doc of `ragen_jax.train.sweep`), so the
sequential peer does less update work when a member's filter drops groups.
"""
from __future__ import annotations

import argparse
import json
import sys
import time

import jax

from configs import tasks
from ragen_jax.train.sweep import Sweep

VALUES = (1.0, 0.9, 0.5, 0.25, 0.75, 0.6, 0.4, 0.1)
GEOMETRY = {"model.max_seq_len": 1280, "rollout.num_groups": 4, "rollout.group_size": 4, "rollout.max_turn": 2,
            "rollout.response_length": 80, "rollout.max_model_len": 1152, "algo.ppo_mini_batch_size": 8,
            "optim.actor_lr": 1e-4, "rollout.val_num_groups": 16}


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--members", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="2 members, one timed round")
    args = parser.parse_args(argv)
    if args.quick:
        args.members, args.repeats = 2, 1
    config = tasks.tiny("frozen_lake", {**GEOMETRY,
        "train.sft_steps": 0, "train.test_freq": 0, "checkpoint.dir": "", "logging.dir": ""})
    sweep = Sweep(config, [{"filter.value": v} for v in VALUES[: args.members]], log=None)
    states = sweep.initial_states()
    single = jax.jit(sweep.train_step)
    step_fn = sweep.step_fn(jax.eval_shape(sweep.stack_states, states))
    step_keys = jax.numpy.stack([k[2] for k in sweep.keys])
    hyper = sweep.hyper()[0]

    def sequential(_):
        return [single(s, k[2], h) for s, k, h in zip(states, sweep.keys, sweep.hypers)]

    def vectorised(fresh):
        return step_fn(fresh, step_keys, hyper, jax.numpy.zeros(args.members, bool))

    def timed(fn):
        fresh = jax.block_until_ready(sweep.stack_states(states))  # the sweep step donates its state
        start = time.perf_counter()
        jax.block_until_ready(fn(fresh))
        return time.perf_counter() - start

    with jax.set_mesh(sweep.mesh):
        compile_s = {"sequential": timed(sequential), "sweep": timed(vectorised)}
        rounds = [(timed(sequential), timed(vectorised)) for _ in range(args.repeats)]
    seq, vec = min(r[0] for r in rounds), min(r[1] for r in rounds)
    print(json.dumps({
        "benchmark": "sweep_step", "members": args.members, "devices": jax.device_count(),
        "backend": jax.default_backend(), "sequential_s": round(seq, 3), "sweep_s": round(vec, 3),
        "sweep_over_sequential": round(vec / seq, 3), "first_call_s": {k: round(v, 1) for k, v in compile_s.items()},
        "rounds": [[round(a, 3), round(b, 3)] for a, b in rounds]}))


if __name__ == "__main__":
    main(sys.argv[1:])

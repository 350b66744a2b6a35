"""Cost of the in-step collapse diagnostics relative to the whole compiled training step.

    .venv/bin/python experiments/benchmarks/train_step.py [--quick] [--num-samples 64] [--repeats 2]

Two compiled steps (`ragen_jax.train.step.TrainStep`) that differ only in `diagnostics.collapse_every` (1 vs 0),
same run, same geometry: RAGEN's default PPO (GAE + critic, base config), Sokoban 6x6, 8 groups x 16 rollouts,
5 turns, responses of up to 64 tokens, the tiny model of benchmarks/diagnostics.py (d_model 128, 4 layers) in
float32. The policy is the scripted template policy (`ragen_jax.models.scripted`): every turn answers a 40-token
reasoning and the valid action "Up", as a trained agent would, so both collapse families score full-length
reasoning on every turn; its forward passes cost what any model of this shape costs. Each step is compiled and
run once, then `repeats` rounds call the two in turn; the figures are the best times. Prints one JSON line:
step seconds with and without the diagnostics and their difference relative to the step without them.
"""
from __future__ import annotations

import argparse
import json
import sys
import time

import jax

from configs import base
from ragen_jax import config as config_lib
from ragen_jax.models import chat as chat_lib
from ragen_jax.models import scripted
from ragen_jax.models import tokenizer as tok_lib
from ragen_jax.rollout import prompts as prompts_lib
from ragen_jax.train.build import build, build_env, build_tokenizer
from ragen_jax.train.hyper import Hyper
from ragen_jax.train.step import TrainStep

MODEL = {"model.d_model": 128, "model.num_layers": 4, "model.num_heads": 4, "model.num_kv_heads": 2,
         "model.mlp_dim": 512, "model.tie_embeddings": False}
RESPONSE, REASONING_TOKENS = 64, 40
GOALS = {"collapse_vs_step": ("<=", 0.10)}  # the diagnostics' share of a step (benchmarks/_goals.py)


def script(tokenizer) -> list[int]:
    """<think> + 40 distinct single-character tokens + </think><answer>Up</answer> + end of turn."""
    tail = [tokenizer.token_id(tok_lib.THINK_CLOSE), tokenizer.token_id(tok_lib.ANSWER_OPEN),
            *tokenizer.encode("Up"), tokenizer.token_id(tok_lib.ANSWER_CLOSE), tokenizer.eos_id]
    singles = [i for i in range(tokenizer.vocab_size)
               if len(tokenizer.token_bytes(i)) == 1 and tokenizer.token_bytes(i).isalnum() and i not in tail]
    return [tokenizer.token_id(tok_lib.THINK_OPEN), *singles[:REASONING_TOKENS], *tail]


def make_config(num_groups: int, group_size: int, max_turn: int, num_samples: int, collapse_every: int):
    """The base (PPO) config at the benchmark geometry; max_model_len holds `max_turn` full turns."""
    config = config_lib.apply_overrides(base.get_config(), {
        **MODEL, "env.name": "sokoban", "rollout.num_groups": num_groups, "rollout.group_size": group_size,
        "rollout.max_turn": max_turn, "rollout.response_length": RESPONSE, "diagnostics.num_samples": num_samples,
        "diagnostics.collapse_every": collapse_every})
    tokenizer = build_tokenizer(config)
    env, _ = build_env(config, tokenizer)
    turn_prompts = prompts_lib.TurnPrompts(tokenizer, chat_lib.get(config.tokenizer.chat_format), env.instruction,
                                           max_turn, env.max_actions_per_traj, RESPONSE, True)
    max_len = (len(turn_prompts.system_ids) + max_turn * (turn_prompts.chunk_capacity(env.obs_capacity) + RESPONSE)
               + len(turn_prompts.close_ids))
    config = config_lib.apply_overrides(config, {"rollout.max_model_len": max_len,
                                              "model.max_seq_len": max_len + RESPONSE})
    return config_lib.validate(config, num_devices=1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="4 groups x 8 rollouts, 3 turns, one repeat")
    parser.add_argument("--num-samples", type=int, default=64, help="diagnostics.num_samples")
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    groups, size, turns = (4, 8, 3) if args.quick else (8, 16, 5)
    repeats = 1 if args.quick else args.repeats
    steps, states, hypers = {}, {}, {}
    for name, every in (("with_collapse", 1), ("without_collapse", 0)):
        config = make_config(groups, size, turns, args.num_samples, every)
        parts = build(config)
        params = scripted.scripted_params(parts.model_config, script(parts.tokenizer))
        train_step = TrainStep(config, parts.env, parts.tokenizer, parts.model_config, parts.chat_format)
        steps[name] = jax.jit(train_step, donate_argnums=0)
        states[name] = train_step.init(jax.random.key(0), params)
        hypers[name] = Hyper.from_config(config, parts.env_params)
    best, metrics = {name: float("inf") for name in steps}, {}
    for round_ in range(repeats + 1):  # round 0 compiles and warms up
        for name, step in steps.items():
            start = time.perf_counter()
            states[name], metrics[name] = jax.block_until_ready(step(states[name], jax.random.key(1), hypers[name]))
            elapsed = time.perf_counter() - start
            if round_:
                best[name] = min(best[name], elapsed)
            print(f"{name} round {round_}: {elapsed:.1f}s", file=sys.stderr, flush=True)
    on, off = best["with_collapse"], best["without_collapse"]
    m = {k: float(v) for k, v in metrics["with_collapse"].items()}
    print(json.dumps({
        "benchmark": "train_step", "jax": jax.__version__, "device": jax.devices()[0].device_kind, "repeats": repeats,
        "geometry": {"groups": groups, "group_size": size, "turns": turns, "response": RESPONSE,
                     "reasoning_tokens": REASONING_TOKENS, "max_model_len": config.rollout.max_model_len,
                     "num_samples": args.num_samples, "algo": "ppo (gae + critic)"},
        "step_s_with_collapse": round(on, 3), "step_s_without_collapse": round(off, 3),
        "collapse_vs_step": round((on - off) / off, 3),
        "valid_thinking_rate": m["collapse/valid_thinking_rate"],
        "mi_estimate": {"first_turn": m["collapse_first_turn_sample/mi_estimate"],
                        "trajectory": m["collapse_trajectory_sample/mi_estimate"]},
        "mean_turns": m["sokoban/num_turns"], "mean_response_tokens": m["response_length/mean"],
    }))


if __name__ == "__main__":
    main()

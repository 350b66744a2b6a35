"""Cost of a large vocabulary: one compiled training step of a tiny model at 512 vs 151,936 (Qwen2.5) embedding rows,
with the policy scored from whole logits or in token chunks.

    .venv/bin/python -m experiments.benchmarks.vocab [--quick] [--repeats 2]

One `ragen_jax.train.step.TrainStep` (rollout -> collapse diagnostics -> filter -> old log-probs -> GRPO -> actor
update) on the Bandit with the built-in tokenizer (the same prompts and geometry at both sizes: rows past its
vocabulary are never prompted, only sampled from), a d_model 64 x 2-layer model with an untied head, 2 groups x 2
rollouts of 704 tokens (the built-in tokenizer spells the prompt in ~670), responses of up to 32 tokens, float32:
one [rows, tokens, V] float32 array is 1.6 GiB at V = 151,936, so more rows would not fit a 24 GiB machine's
whole-logits step. The policy is the scripted template policy (`ragen_jax.models.scripted`), so both collapse
families score real reasoning. Scorers (set as `TrainStep.logits_fn`):
  logits:  `functools.partial(transformer.apply, config)`: every [rows, tokens, V] logit at once, then the
           vocabulary-chunked log-softmax (`algos.losses.logprobs_and_entropy`);
  chunked: `transformer.DecoderLM(config)`: hidden states, then blocks of positions of at most
           `UpdateConfig.logits_chunk` logits (64 MiB) unembedded at a time under `jax.checkpoint`
           (`algos.losses.hidden_logprobs_and_entropy`).
Each (vocabulary, scorer) runs in its own process: build, compile, one warm-up step, then the best of `repeats`
timed steps. Memory figures: XLA's buffer assignment of the compiled step (`compiled.memory_analysis()`: temporaries,
and temporaries + arguments + outputs - aliased), and the process's peak resident set (`ru_maxrss`: everything,
compilation included). Prints progress on stderr, then one JSON line and a markdown table on stdout.
"""
from __future__ import annotations

import argparse
import functools
import json
import os
import platform
import resource
import subprocess
import sys
import time

VOCABS = (512, 151_936)
SCORERS = ("logits", "chunked")
MODEL = {"model.d_model": 64, "model.num_layers": 2, "model.num_heads": 4, "model.num_kv_heads": 2,
         "model.mlp_dim": 256, "model.tie_embeddings": False}
GEOMETRY = {"env.name": "bandit", "rollout.num_groups": 2, "rollout.group_size": 2, "rollout.max_turn": 1,
            "rollout.max_actions_per_turn": 1, "rollout.max_actions_per_traj": 1, "rollout.response_length": 32,
            "algo.ppo_mini_batch_size": 4, "diagnostics.num_samples": 4}
MiB = 2 ** 20


def script(tokenizer) -> list[int]:
    """<think> + 12 distinct letters + </think><answer>A</answer> + end of turn: well-formed reasoning."""
    from ragen_jax.models import tokenizer as tok_lib

    tail = [tokenizer.token_id(tok_lib.THINK_CLOSE), tokenizer.token_id(tok_lib.ANSWER_OPEN),
            *tokenizer.encode("A"), tokenizer.token_id(tok_lib.ANSWER_CLOSE), tokenizer.eos_id]
    singles = [i for i in range(tokenizer.vocab_size)
               if len(tokenizer.token_bytes(i)) == 1 and tokenizer.token_bytes(i).isalpha() and i not in tail]
    return [tokenizer.token_id(tok_lib.THINK_OPEN), *singles[:12], *tail]


def measure(vocab: int, scorer: str, repeats: int) -> dict:
    """One (vocabulary, scorer) in this process: compile and run the step; figures as in the module docstring."""
    import jax

    from configs import base
    from ragen_jax import config as config_lib
    from ragen_jax.algos import presets
    from ragen_jax.models import scripted, transformer
    from ragen_jax.rollout import prompts as prompts_lib
    from ragen_jax.train.build import build, build_chat_format, build_env, build_tokenizer
    from ragen_jax.train.hyper import Hyper
    from ragen_jax.train.step import TrainStep

    overrides = {**MODEL, **GEOMETRY, "model.vocab_size": vocab}
    config = config_lib.apply_overrides(presets.preset_config(base.get_config(), "grpo"), overrides)
    tokenizer = build_tokenizer(config)
    env, _ = build_env(config, tokenizer)
    r = config.rollout
    turn = prompts_lib.TurnPrompts(tokenizer, build_chat_format(config, tokenizer), env.instruction, 1,
                                   env.max_actions_per_traj, r.response_length, True)
    max_len = (len(turn.system_ids) + turn.chunk_capacity(env.obs_capacity) + r.response_length
               + len(turn.close_ids))
    config = config_lib.validate(config_lib.apply_overrides(config, {
        "rollout.max_model_len": max_len, "model.max_seq_len": max_len + r.response_length}), num_devices=1)
    parts = build(config)
    train_step = TrainStep(config, parts.env, parts.tokenizer, parts.model_config, parts.chat_format)
    model_config = parts.model_config
    train_step.logits_fn = (transformer.DecoderLM(model_config) if scorer == "chunked"
                            else functools.partial(transformer.apply, model_config))
    state = train_step.init(jax.random.key(0), scripted.scripted_params(model_config, script(parts.tokenizer)))
    hyper = Hyper.from_config(config, parts.env_params)
    start = time.perf_counter()
    compiled = jax.jit(train_step, donate_argnums=0).lower(state, jax.random.key(1), hyper).compile()
    compile_s = time.perf_counter() - start
    memory = compiled.memory_analysis()
    times = []
    for i in range(repeats + 1):  # step 0 warms up
        start = time.perf_counter()
        state, metrics = jax.block_until_ready(compiled(state, jax.random.key(2 + i), hyper))
        times.append(time.perf_counter() - start)
        print(f"  vocab {vocab} {scorer}: step {i} {times[-1]:.2f} s", file=sys.stderr, flush=True)
    rows = r.num_groups * r.group_size
    return {
        "vocab": vocab, "scorer": scorer, "rows": rows, "max_model_len": max_len,
        "params": sum(x.size for x in jax.tree.leaves(state.actor)),
        "compile_s": round(compile_s, 2), "step_s": round(min(times[1:]), 3),
        "xla_temp_mib": round(memory.temp_size_in_bytes / MiB, 1),
        "xla_total_mib": round((memory.temp_size_in_bytes + memory.argument_size_in_bytes
                                + memory.output_size_in_bytes - memory.alias_size_in_bytes) / MiB, 1),
        "full_logits_mib": round(rows * (max_len - 1) * vocab * 4 / MiB, 1),
        "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        "valid_thinking_rate": float(metrics["collapse/valid_thinking_rate"]),
        "actor_entropy": float(metrics["actor/entropy"]),
    }


def table(results: list[dict]) -> str:
    lines = ["| vocabulary | scorer | step (s) | compile (s) | XLA temporaries (MiB) | XLA total (MiB) | "
             "one [B, T, V] f32 (MiB) | peak RSS (MiB) |", "|---|---|---|---|---|---|---|---|"]
    for x in results:
        lines.append(f"| {x['vocab']:,} | {x['scorer']} | {x['step_s']:.2f} | {x['compile_s']:.0f} | "
                     f"{x['xla_temp_mib']:,.0f} | {x['xla_total_mib']:,.0f} | {x['full_logits_mib']:,.0f} | "
                     f"{x['peak_rss_mib']:,.0f} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=2, help="timed steps after the warm-up step")
    parser.add_argument("--quick", action="store_true", help="one timed step each")
    parser.add_argument("--one", help=argparse.SUPPRESS)  # "VOCAB,SCORER": measure in this process (a child)
    args = parser.parse_args()
    if args.quick:
        args.repeats = 1
    if args.one:
        vocab, scorer = args.one.split(",")
        print(json.dumps(measure(int(vocab), scorer, args.repeats)))
        return
    results = []
    for vocab in VOCABS:
        for scorer in SCORERS:
            print(f"vocab {vocab} {scorer}: building and compiling in a fresh process", file=sys.stderr, flush=True)
            command = [sys.executable, "-m", "experiments.benchmarks.vocab", "--one", f"{vocab},{scorer}",
                       "--repeats", str(args.repeats)]
            out = subprocess.run(command, check=True, stdout=subprocess.PIPE, text=True).stdout
            results.append(json.loads(out.strip().splitlines()[-1]))
            print(f"  {results[-1]}", file=sys.stderr, flush=True)
    import jax

    print(json.dumps({"benchmark": "vocab", "jax": jax.__version__, "device": jax.devices()[0].device_kind,
                      "machine": f"{platform.machine()}, {len(os.sched_getaffinity(0))} cores",
                      "repeats": args.repeats, "results": results}))
    print(table(results))


if __name__ == "__main__":
    main()

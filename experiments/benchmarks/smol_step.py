"""The 135M training step: SmolLM2-135M-Instruct on the Bandit (`configs/bandit.py:smol`), beside transformers + torch.

    .venv/bin/python -m experiments.benchmarks.smol_step [--quick] [--steps 3]

Ours: the `:smol` step (4 groups x 4 rollouts, up to 128 new tokens, GRPO with the paper filter) as its four timed
programs (`train.phases.PhasedStep`): each phase's median over `steps` steps without the collapse diagnostics
(their schedule runs them at step 1, then every 5th step), and the diagnostics phase of a step with them, amortised
over `diagnostics.collapse_every`; `step_s` = rollout + prepare + update, `step_amortised_s` adds the amortised
diagnostics. The first call's compile time of each phase is reported too.

The peer: the update's forward and backward on 16 rows of the step's geometry (4 groups: each a prompt of the env's
instruction and first observation in the model's chat format, its 4 rows answering with 96-128 random tokens,
padded to `rollout.max_model_len`), as transformers + torch compute it from the same GGUF file (float32, eager
attention, every row in full): the sum of the answer tokens' log-probs, its gradient. Ours on the same rows:
`scoring.token_logprobs` as the actor update calls it (rows of a group scored with their shared prompt once) and
with every row in full. Each side's best of
`steps` calls after a warm-up. Prints one JSON line.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np

from configs import bandit
from experiments.benchmarks._goals import goals_met
from ragen_jax import compile_cache
from ragen_jax.algos import scoring
from ragen_jax.config import apply_overrides
from ragen_jax.train import build as build_lib
from ragen_jax.train.sweep import Sweep

GOALS = {"step_amortised_s": ("<=", 30.0)}  # the goal: a 4 x 4 step in at most 30 s on 2 cores
BENCH = {"checkpoint.dir": "", "logging.dir": "", "logging.progress_bar": False, "train.test_freq": 0}


def best_time(fn, calls: int) -> float:
    times = []
    for _ in range(calls):
        start = time.perf_counter()
        jax.block_until_ready(fn())
        times.append(time.perf_counter() - start)
    return min(times)


def our_step(config, steps: int, log) -> tuple[dict, Sweep]:
    """(the phase timings of the module doc, the one-member `Sweep` that ran them: its parts and model)."""
    sweep = Sweep(config, [{"train.seed": 0}], log=None)
    state = sweep.stack_states(sweep.initial_states())
    args = sweep.step_args([False])
    every = config.diagnostics.collapse_every
    with jax.set_mesh(sweep.mesh):
        phased = sweep.phased_step(jax.eval_shape(lambda: state))
        timings = []
        for i in range(1, max(steps + 1, every) + 1):  # step 1 and step `every` run the diagnostics
            (state, _, _), timing = phased(state, *args[:2])
            timings.append((i, timing))
            log(f"step {i}: " + ", ".join(f"{k[9:]} {v:.2f}" for k, v in timing.items() if k.startswith("timing_s/")))
    first = timings[0][1]
    plain = [t for i, t in timings[1:] if i % every and i != 1]
    diagnosed = [t for i, t in timings[1:] if i % every == 0]
    median = lambda key, rows: statistics.median(t[f"timing_s/{key}"] for t in rows)  # noqa: E731
    phases = {name: round(median(name, plain), 2) for name in ("rollout", "prepare", "update")}
    diagnostics_s = median("diagnostics", diagnosed) if diagnosed else first["timing_s/diagnostics"]
    step_s = sum(phases.values())
    return {
        "phases_s": phases, "diagnostics_s": round(diagnostics_s, 2), "step_s": round(step_s, 2),
        "step_amortised_s": round(step_s + diagnostics_s / every, 2),
        "compile_s": {k[len("timing_s/compile_"):]: round(v, 1) for k, v in first.items()
                      if k.startswith("timing_s/compile_")},
    }, sweep


def rows_of(sweep, config) -> dict:
    """16 update rows of the smol geometry: each group's prompt (the env's instruction and a first observation in
    the model's chat format) and responses of 96 to 128 random tokens."""
    parts = sweep.parts
    r = config.rollout
    rng = np.random.default_rng(0)
    texts = []
    for g in range(r.num_groups):
        _, state = parts.env.reset(jax.random.key(g), parts.env_params)
        texts.append(parts.chat_format.render([("system", parts.env.instruction),
                                               ("user", parts.env.render_text(state))], add_generation_prompt=True))
    prompts = [parts.tokenizer.encode(t) for t in texts]
    length = r.max_model_len  # the rollout's rows are this wide; scoring picks the width their real tokens need
    rows = r.num_groups * r.group_size
    tokens = np.full((rows, length), parts.tokenizer.pad_id, np.int32)
    attention = np.zeros((rows, length), bool)
    loss_mask = np.zeros((rows, length - 1), np.float32)
    for b in range(rows):
        p = prompts[b // r.group_size]
        n = int(rng.integers(96, r.response_length + 1))
        tokens[b, :len(p)] = p
        tokens[b, len(p):len(p) + n] = rng.integers(0, parts.tokenizer.vocab_size, n)
        attention[b, :len(p) + n] = True
        loss_mask[b, len(p) - 1:len(p) + n - 1] = 1.0
    positions = np.broadcast_to(np.arange(length, dtype=np.int32), tokens.shape).copy()
    return {"tokens": tokens, "positions": positions, "attention": attention, "loss_mask": loss_mask}


def our_forward_backward(model, params, rows: dict, group_size: int, calls: int) -> float:
    def loss(params):
        logp, _ = scoring.token_logprobs(model, params, rows["tokens"], rows["positions"], rows["attention"],
                                         jnp.float32(1.0), group_size=group_size)
        return jnp.sum(logp * rows["loss_mask"])

    grad = jax.jit(jax.grad(loss))
    jax.block_until_ready(grad(params))
    return best_time(lambda: grad(params), calls)


def torch_forward_backward(path: str, rows: dict, calls: int) -> float:
    import torch
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(
        os.path.dirname(path), gguf_file=os.path.basename(path), attn_implementation="eager", dtype=torch.float32)
    tokens, attention = torch.tensor(rows["tokens"], dtype=torch.long), torch.tensor(rows["attention"])
    mask = torch.tensor(rows["loss_mask"])

    def step():
        model.zero_grad(set_to_none=True)
        logits = model(input_ids=tokens, attention_mask=attention).logits[:, :-1]
        logp = torch.log_softmax(logits, -1).gather(-1, tokens[:, 1:, None])[..., 0]
        (logp * mask).sum().backward()

    step()
    return best_time(step, calls)


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=3, help="timed steps without diagnostics (and peer calls)")
    parser.add_argument("--quick", action="store_true", help="one timed step and call, diagnostics every 3 steps")
    args = parser.parse_args(argv)
    steps = 1 if args.quick else args.steps
    log = lambda line: print(line, file=sys.stderr, flush=True)  # noqa: E731
    cache = tempfile.mkdtemp(prefix="smol_step_xla_")
    compile_cache.enable(cache)
    quick = {"diagnostics.collapse_every": 3} if args.quick else {}  # steps 1-3: one without the diagnostics
    config = apply_overrides(bandit.get_config("smol"), {**BENCH, **quick, "logging.compilation_cache": cache})
    ours, sweep = our_step(config, steps, log)
    rows = rows_of(sweep, config)
    model, params = sweep.train_step.model, sweep.parts.params
    grouped = our_forward_backward(model, params, rows, config.rollout.group_size, steps)
    full = our_forward_backward(model, params, rows, 1, steps)
    theirs = torch_forward_backward(build_lib.pretrained_source(config), rows, steps)
    out = {"benchmark": "smol_step", "jax": jax.__version__, "device": jax.devices()[0].device_kind,
           "cores": os.cpu_count(), "steps": steps,
           "setting": "configs/bandit.py:smol, SmolLM2-135M-Instruct, 4 x 4 rollouts of up to 128 tokens", **ours,
           "forward_backward": {"rows": list(rows["tokens"].shape), "ours_grouped_s": round(grouped, 2),
                                "ours_full_rows_s": round(full, 2), "torch_s": round(theirs, 2),
                                "speedup_grouped": round(theirs / grouped, 2),
                                "speedup_full_rows": round(theirs / full, 2)}}
    out["goals_met"] = goals_met(out, GOALS)
    print(json.dumps(out))


if __name__ == "__main__":
    main(sys.argv[1:])

"""Cost of the in-step diagnostics, relative to one policy update, and prefix-cached vs naive scoring.

Same run, tiny model (vocab 512, d_model 128, 4 layers, 4 heads, 2 kv heads, mlp 512), an 8 x 16 batch of
multi-turn trajectories (system prompt, then per turn an observation, `<think>`, reasoning, answer):
  update:            `ragen_jax.train.update.actor_update`, 4 minibatches of 32 (forward + backward + AdamW);
  first_turn, trajectory: each collapse family (sampling, gathering, prefix-cached cross log-probs, metrics);
  grad_analysis:     `gradient_analysis` with 6 quantile buckets + all, three components each;
  scoring:           `cross_log_probs` vs `cross_log_probs_naive` for 8 prompts of 200 tokens x 64 reasoning
                     strings of 64 tokens.
The cost relative to the whole compiled training step (generation, old log-probs, values, critic and actor
updates: the reference that replaces the single policy update) is measured by benchmarks/train_step.py.
Every function is compiled and warmed up first, then `repeats` rounds call each in turn and each figure is its
best time (the CPU may be shared); the ratios are the figures that matter. Prints one JSON line.

    .venv/bin/python experiments/benchmarks/diagnostics.py [--quick] [--num-samples 64]
"""
from __future__ import annotations

import argparse
import functools
import json
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

from ragen_jax import models
from ragen_jax.algos import scoring, update_inputs
from ragen_jax.diagnostics import cross_logprobs, families, gradients
from ragen_jax.models import transformer
from ragen_jax.train import update

MODEL = dict(vocab_size=512, d_model=128, num_layers=4, num_heads=4, num_kv_heads=2, mlp_dim=512)
GROUPS, GROUP_SIZE = 8, 16
SYSTEM, OBS, RESPONSE, MAX_TURNS = 64, 40, 48, 5  # tokens; reasoning takes 16..40 of each 48-token response
LENGTH = SYSTEM + MAX_TURNS * (OBS + RESPONSE)  # 504
SCORE_COLS, SCORE_PROMPT, SCORE_ROWS, SCORE_REASON = 8, 200, 64, 64
GOALS = {"scoring.naive_over_cached": 3.0}  # prefix-cached scoring's speed-up (benchmarks/_goals.py)


def best_times(fns: dict, repeats: int) -> dict:
    """Compiling warm-up of every function, then `repeats` rounds calling each in turn; the best time of each.

    Interleaving the rounds keeps the ratios fair when other work shares the CPU. Progress goes to stderr.
    """
    for name, fn in fns.items():
        start = time.perf_counter()
        jax.block_until_ready(fn())
        print(f"{name}: warm-up {time.perf_counter() - start:.1f}s", file=sys.stderr, flush=True)
    best = {name: float("inf") for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            start = time.perf_counter()
            jax.block_until_ready(fn())
            best[name] = min(best[name], time.perf_counter() - start)
    print(f"best: {best}", file=sys.stderr, flush=True)
    return best


def make_batch(rng: np.random.Generator, vocab: int):
    """(spans, attention mask, loss mask, advantages, group reward std); group members share their turn-1 prompt."""
    batch = GROUPS * GROUP_SIZE
    tokens = rng.integers(1, vocab, (batch, LENGTH)).astype(np.int32)
    group_ids = np.repeat(np.arange(GROUPS), GROUP_SIZE)
    shared = rng.integers(1, vocab, (GROUPS, SYSTEM + OBS))
    tokens[:, :SYSTEM + OBS] = shared[group_ids]
    start = np.zeros((batch, MAX_TURNS), np.int32)
    length = np.zeros((batch, MAX_TURNS), np.int32)
    taken = np.zeros((batch, MAX_TURNS), bool)
    loss_mask = np.zeros((batch, LENGTH - 1), np.float32)
    lengths = np.zeros(batch, np.int32)
    for b in range(batch):
        turns = int(rng.integers(2, MAX_TURNS + 1))
        for t in range(turns):
            pos = SYSTEM + t * (OBS + RESPONSE) + OBS
            taken[b, t], start[b, t] = True, pos
            length[b, t] = int(rng.integers(16, 41)) if rng.random() < 0.9 else 0
            loss_mask[b, pos - 1:pos - 1 + RESPONSE] = 1.0  # targets = the response tokens
        lengths[b] = SYSTEM + turns * (OBS + RESPONSE)
    attention = np.arange(LENGTH)[None, :] < lengths[:, None]
    spans = families.ReasoningSpans(tokens=jnp.asarray(tokens), think_start=jnp.asarray(start),
                                    think_len=jnp.asarray(length), turn_taken=jnp.asarray(taken),
                                    group_ids=jnp.asarray(group_ids, jnp.int32))
    rewards = rng.integers(0, 2, (GROUPS, GROUP_SIZE)).astype(np.float32)
    adv = (rewards - rewards.mean(1, keepdims=True)).reshape(-1)  # Dr.GRPO-style outcome advantages
    return spans, jnp.asarray(attention), jnp.asarray(loss_mask), jnp.asarray(adv), rewards.std(1, ddof=1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="one timed repeat per figure")
    parser.add_argument("--num-samples", type=int, default=64, help="(x, z) pairs per collapse family")
    args = parser.parse_args()
    repeats = 1 if args.quick else 3
    config = models.ModelConfig(head_dim=MODEL["d_model"] // MODEL["num_heads"], max_seq_len=1024, **MODEL)
    params = jax.jit(transformer.init_params, static_argnums=0)(config, jax.random.key(0))
    logits_fn = functools.partial(transformer.apply, config)
    rng = np.random.default_rng(0)
    spans, attention, loss_mask, adv, group_rv = make_batch(rng, config.vocab_size)
    batch_size = GROUPS * GROUP_SIZE
    positions = jnp.broadcast_to(jnp.arange(LENGTH, dtype=jnp.int32), (batch_size, LENGTH))
    temperature = jnp.float32(1.0)

    # ---- reference: one actor update over 4 minibatches
    upd_config = update.UpdateConfig(minibatch_size=32)
    hyper = update_inputs.ActorHyper(*(jnp.float32(v) for v in (1e-6, 0.2, 0.28, 3.0, 0.001, 0.0, 1.0)))
    old_logp, _ = jax.jit(functools.partial(scoring.token_logprobs, logits_fn))(
        params, spans.tokens, positions, attention, temperature)
    zeros = jnp.zeros_like(old_logp)
    upd_batch = update_inputs.UpdateBatch(tokens=spans.tokens, positions=positions, attention_mask=attention,
                                   loss_mask=loss_mask, old_logp=old_logp, advantages=adv[:, None] + zeros,
                                   ref_logp=old_logp, returns=zeros, old_values=zeros)
    opt_state = update.optimizer_init(params, upd_config)
    actor = jax.jit(functools.partial(update.actor_update, logits_fn, config=upd_config))
    fns = {"update": lambda: actor(params, opt_state, upd_batch, jnp.int32(batch_size), hyper)[0]}

    # ---- the two collapse families, separately
    score_fn = functools.partial(cross_logprobs.cross_log_probs, models.DecoderLM(config), temperature=temperature)
    for name, first, multi in (("first_turn", True, False), ("trajectory", False, True)):
        options = families.CollapseOptions(num_groups=GROUPS, num_samples=args.num_samples, first_turn=first,
                                           multi_turn=multi, max_reasoning_len=RESPONSE)
        fn = jax.jit(lambda p, s, k, st, o=options: families.collapse_diagnostics(
            functools.partial(score_fn, p), s, k, st, o))
        fns[name] = lambda f=fn: f(params, spans, jax.random.key(1), families.init_state())

    # ---- gradient-component analysis on the same batch
    loss_hyper = hyper._replace(kl_loss_coef=jnp.float32(0.001))
    analysis = jax.jit(functools.partial(gradients.gradient_analysis, logits_fn, agg_mode="token-mean",
                                         use_kl_loss=True, kl_type="low_var_kl"))
    fns["grad_analysis"] = lambda: analysis(params, upd_batch, loss_hyper, jnp.ones(batch_size, bool),
                                            spans.group_ids, jnp.asarray(group_rv, jnp.float32))

    # ---- prefix-cached vs naive scoring at prompt 200, reasoning 64
    prompts = jnp.asarray(rng.integers(1, config.vocab_size, (SCORE_COLS, SCORE_PROMPT)), jnp.int32)
    prompt_len = jnp.full((SCORE_COLS,), SCORE_PROMPT, jnp.int32)
    reasoning = jnp.asarray(rng.integers(1, config.vocab_size, (SCORE_ROWS, SCORE_REASON)), jnp.int32)
    reasoning_len = jnp.full((SCORE_ROWS,), SCORE_REASON, jnp.int32)
    cached = jax.jit(functools.partial(cross_logprobs.cross_log_probs, models.DecoderLM(config)))
    naive = jax.jit(functools.partial(cross_logprobs.cross_log_probs_naive, models.DecoderLM(config)))
    score_args = (params, prompts, prompt_len, reasoning, reasoning_len, temperature)
    fns["cached"] = lambda: cached(*score_args)
    fns["naive"] = lambda: naive(*score_args)
    best = best_times(fns, repeats)
    t_update, t_grad, t_cached, t_naive = best["update"], best["grad_analysis"], best["cached"], best["naive"]
    family_times = {name: best[name] for name in ("first_turn", "trajectory")}
    max_diff = float(jnp.max(jnp.abs(cached(*score_args)[1] - naive(*score_args)[1])))

    both = family_times["first_turn"] + family_times["trajectory"]
    print(json.dumps({
        "jax": jax.__version__, "repeats": repeats,
        "batch": {"groups": GROUPS, "group_size": GROUP_SIZE, "length": LENGTH, "turns": MAX_TURNS,
                  "response": RESPONSE, "num_samples": args.num_samples},
        "update_s": round(t_update, 4),
        "first_turn_s": round(family_times["first_turn"], 4),
        "trajectory_s": round(family_times["trajectory"], 4),
        "collapse_both_vs_update": round(both / t_update, 3),
        "first_turn_vs_update": round(family_times["first_turn"] / t_update, 3),
        "trajectory_vs_update": round(family_times["trajectory"] / t_update, 3),
        "grad_analysis_s": round(t_grad, 4),
        "grad_analysis_vs_update": round(t_grad / t_update, 3),
        "scoring": {"cols": SCORE_COLS, "prompt": SCORE_PROMPT, "rows": SCORE_ROWS, "reasoning": SCORE_REASON,
                    "cached_s": round(t_cached, 4), "naive_s": round(t_naive, 4),
                    "naive_over_cached": round(t_naive / t_cached, 2), "max_abs_diff_sum": max_diff},
    }))


if __name__ == "__main__":
    main()

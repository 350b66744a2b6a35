"""LM speed: decode and train-step tokens/s of the JAX decoder vs transformers + torch (CPU), same run.

For the tiny default config and a mid config it measures
  decode: new tokens/s of `ragen_jax.rollout.sampler.generate` vs `transformers` `generate` (batch 128,
          prompt 128, 64 new tokens, temperature 1, both including the prefill);
  train:  tokens/s of one forward + backward + AdamW step on next-token cross-entropy;
plus the train step's achieved GFLOP/s against float32 matmuls timed alternately with it. JAX functions are
compiled ahead of time (compilation is not timed); the two sides then run alternately (so both see the same
machine load), after one warm-up call each unless --quick, and each figure is the best of the timed runs.
Prints one JSON line.

    .venv/bin/python experiments/benchmarks/lm.py [--quick] [--only tiny|mid]
"""
from __future__ import annotations

import argparse
import json
import os
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
import torch
import transformers

from experiments.benchmarks._flops import matmul_reference, train_flops
from experiments.benchmarks._goals import goals_met
from ragen_jax import models
from ragen_jax.models import transformer as tfm
from ragen_jax.rollout import sampler

GOALS = {  # figure -> minimum (the goals on this CPU; benchmarks/_goals.py)
    "tiny.decode_tok_s.ratio": 3.0, "tiny.train_tok_s.ratio": 1.5, "mid.decode_tok_s.ratio": 1.0,
    "mid.train_tok_s.ratio": 1.0, "mid.train_vs_matmul": 0.4,
}
SIZES = {  # name -> (ModelConfig sizes, train batch, train length)
    "tiny": (dict(vocab_size=512, d_model=128, num_layers=4, num_heads=4, num_kv_heads=2, mlp_dim=512), 128, 320),
    "mid": (dict(vocab_size=4096, d_model=512, num_layers=8, num_heads=8, num_kv_heads=4, mlp_dim=1408), 32, 512),
}
DECODE_BATCH, PROMPT_LEN, NEW_TOKENS = 128, 128, 64


def best_times(fns, repeats: int, warmup: bool) -> list[float]:
    """Best wall time of each blocking callable over `repeats` alternating rounds (optionally one warm-up each)."""
    if warmup:
        for fn in fns:
            fn()
    times = [[] for _ in fns]
    for _ in range(repeats):
        for fn, record in zip(fns, times):
            start = time.perf_counter()
            fn()
            record.append(time.perf_counter() - start)
    return [min(t) for t in times]


def hf_model(c: models.ModelConfig) -> torch.nn.Module:
    hf_config = transformers.LlamaConfig(
        vocab_size=c.vocab_size, hidden_size=c.d_model, intermediate_size=c.mlp_dim,
        num_hidden_layers=c.num_layers, num_attention_heads=c.num_heads, num_key_value_heads=c.num_kv_heads,
        head_dim=c.head_dim, rms_norm_eps=c.norm_eps, tie_word_embeddings=c.tie_embeddings,
        max_position_embeddings=c.max_seq_len, rope_parameters={"rope_type": "default", "rope_theta": c.rope_theta},
        attention_bias=c.qkv_bias, pad_token_id=0, bos_token_id=None, eos_token_id=None)
    return transformers.LlamaForCausalLM(hf_config)


def bench_decode(c, params, hf, repeats, warmup):
    rng = np.random.default_rng(0)
    prompt = rng.integers(1, c.vocab_size, size=(DECODE_BATCH, PROMPT_LEN)).astype(np.int32)
    args = (jnp.asarray(prompt), jnp.full((DECODE_BATCH,), PROMPT_LEN, jnp.int32), jax.random.key(0),
            jnp.float32(1.0), jnp.float32(1.0))
    new_cache = jax.jit(lambda: models.init_cache(c, DECODE_BATCH, PROMPT_LEN + NEW_TOKENS))
    model = models.DecoderLM(c)
    generate = sampler.generate.lower(model, params, new_cache(), *args, max_new_tokens=NEW_TOKENS).compile()

    def run_jax():
        out, _ = generate(params, new_cache(), *args)
        out.tokens.block_until_ready()

    prompt_t = torch.tensor(prompt, dtype=torch.long)
    mask_t = torch.ones_like(prompt_t)

    def run_torch():
        with torch.inference_mode():
            hf.generate(prompt_t, attention_mask=mask_t, do_sample=True, temperature=1.0, top_k=0, top_p=1.0,
                        max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS)

    new = DECODE_BATCH * NEW_TOKENS
    return [new / t for t in best_times([run_jax, run_torch], repeats, warmup)]


def bench_train(c, params, hf, batch, length, repeats, warmup):
    tokens = np.random.default_rng(1).integers(0, c.vocab_size, size=(batch, length + 1)).astype(np.int32)
    optimizer = optax.adamw(1e-4, weight_decay=0.01)

    def loss_fn(p, x):
        return optax.softmax_cross_entropy_with_integer_labels(tfm.apply(c, p, x[:, :-1]), x[:, 1:]).mean()

    def step(p, opt_state, x):
        loss, grads = jax.value_and_grad(loss_fn)(p, x)
        updates, opt_state = optimizer.update(grads, opt_state, p)
        return optax.apply_updates(p, updates), opt_state, loss

    state = {"p": params, "opt": optimizer.init(params)}
    x_j = jnp.asarray(tokens)
    step = jax.jit(step, donate_argnums=(0, 1)).lower(state["p"], state["opt"], x_j).compile()

    def run_jax():
        state["p"], state["opt"], loss = step(state["p"], state["opt"], x_j)
        loss.block_until_ready()

    hf.train()
    opt_t = torch.optim.AdamW(hf.parameters(), lr=1e-4, weight_decay=0.01, fused=True)
    x_t = torch.tensor(tokens, dtype=torch.long)

    def run_torch():
        logits = hf(input_ids=x_t[:, :-1]).logits
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, c.vocab_size), x_t[:, 1:].reshape(-1))
        loss.backward()
        opt_t.step()
        opt_t.zero_grad(set_to_none=True)

    run_matmul, matmul_flops = matmul_reference()
    jax_time, torch_time, matmul_time = best_times([run_jax, run_torch, run_matmul], repeats, warmup)
    trained = batch * length
    flops = train_flops(c, batch, length)
    return trained / jax_time, trained / torch_time, flops / jax_time, matmul_flops / matmul_time


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="one timed run per figure, no warm-up runs")
    parser.add_argument("--only", choices=sorted(SIZES), help="benchmark one size only")
    args = parser.parse_args()
    repeats = 1 if args.quick else 3
    threads = os.cpu_count()
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    result = {"threads": threads, "jax": jax.__version__, "torch": torch.__version__, "repeats": repeats}
    for name in [args.only] if args.only else SIZES:
        sizes, batch, length = SIZES[name]
        c = models.ModelConfig(head_dim=sizes["d_model"] // sizes["num_heads"], tie_embeddings=True,
                               max_seq_len=max(length + 1, PROMPT_LEN + NEW_TOKENS), **sizes)
        hf = hf_model(c).eval()
        params = jax.jit(tfm.init_params, static_argnums=0)(c, jax.random.key(0))
        decode_jax, decode_torch = bench_decode(c, params, hf, repeats, not args.quick)
        train_jax, train_torch, gflops, matmul = bench_train(c, params, hf, batch, length, repeats, not args.quick)
        result[name] = {
            "decode_tok_s": {"jax": round(decode_jax, 1), "torch": round(decode_torch, 1),
                             "ratio": round(decode_jax / decode_torch, 3)},
            "train_tok_s": {"jax": round(train_jax, 1), "torch": round(train_torch, 1),
                            "ratio": round(train_jax / train_torch, 3)},
            "train_gflops": round(gflops / 1e9, 1),
            "matmul_gflops": round(matmul / 1e9, 1),
            "train_vs_matmul": round(gflops / matmul, 3),
            "batch": {"decode": [DECODE_BATCH, PROMPT_LEN, NEW_TOKENS], "train": [batch, length]},
        }
    result["goals_met"] = goals_met(result, GOALS)
    print(json.dumps(result))


if __name__ == "__main__":
    main()

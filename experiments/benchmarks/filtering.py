"""Does SNR-aware filtering save compute? Update-phase time with top-p keeping ~25% of groups vs. no filter.

One jitted function runs the update phase of a PPO step on the tiny decoder (vocab 512, d_model 128, 4 layers,
4 heads, 2 kv heads, mlp 512): group scores -> `select_groups` (top-p, softmax mode, the paper's setting) ->
compaction -> critic update -> actor update, with 8 groups x 16 trajectories of 320 tokens and 4 minibatches of
32. The filter value is a traced argument, so "filtered" (p = 0.9, which keeps 2 of the 8 groups on the
synthetic rewards below) and "unfiltered" (p = 1.0) run the SAME compiled program; dropped minibatches are
skipped inside it. Each figure is the best of `repeats` interleaved timed runs after a warm-up (the CPU may be
shared). Prints one JSON line; the figure that matters is `ratio` = filtered / unfiltered time (goal <= 0.40).

    .venv/bin/python experiments/benchmarks/filtering.py [--quick]
"""
from __future__ import annotations

import argparse
import functools
import json
import time

import jax
import jax.numpy as jnp
import numpy as np

from ragen_jax import filtering, models
from ragen_jax.algos import gae, update_inputs
from ragen_jax.train import update

MODEL = models.ModelConfig(vocab_size=512, d_model=128, num_layers=4, num_heads=4, num_kv_heads=2, head_dim=32,
                           mlp_dim=512)
NUM_GROUPS, GROUP_SIZE, LENGTH, MINIBATCH = 8, 16, 320, 32
FILTER = dict(metric="reward_variance", strategy="top_p", filter_type="largest", include_zero=True,
              top_p_mode="softmax")
GOALS = {"ratio": ("<=", 0.40)}  # filtered / unfiltered update-phase time (benchmarks/_goals.py)
CONFIG = update.UpdateConfig(epochs=1, minibatch_size=MINIBATCH, vocab_chunk=MODEL.vocab_size)


def synthetic_batch(rng: np.random.Generator):
    """Trajectories with a prompt, assistant turns (loss tokens) and an episode reward on the last loss token.

    Two groups succeed half of the time (reward std ~5.7, like Sokoban), the others almost never (std ~0.2).
    """
    rows = NUM_GROUPS * GROUP_SIZE
    tokens = rng.integers(1, MODEL.vocab_size, (rows, LENGTH)).astype(np.int32)
    t = np.arange(LENGTH - 1)
    loss_mask = ((t >= 48) & ((t - 48) % 64 < 40)).astype(np.float32)[None].repeat(rows, 0)
    success = np.zeros((NUM_GROUPS, GROUP_SIZE), bool)
    success[:2, ::2] = True
    reward = np.where(success, 10.0, -1.0) + rng.choice([0.0, -0.1], (NUM_GROUPS, GROUP_SIZE), p=[0.7, 0.3])
    last = np.nonzero(loss_mask[0])[0][-1]
    token_rewards = np.zeros((rows, LENGTH - 1), np.float32)
    token_rewards[:, last] = reward.reshape(-1)
    noise = lambda scale: (scale * rng.normal(size=(rows, LENGTH - 1))).astype(np.float32)
    return dict(
        tokens=jnp.asarray(tokens),
        positions=jnp.broadcast_to(jnp.arange(LENGTH, dtype=jnp.int32), (rows, LENGTH)),
        attention_mask=jnp.ones((rows, LENGTH), bool),
        loss_mask=jnp.asarray(loss_mask),
        old_logp=jnp.asarray(noise(0.3) - np.log(MODEL.vocab_size)),
        ref_logp=jnp.zeros((rows, LENGTH - 1), jnp.float32),
        old_values=jnp.asarray(noise(0.5)),
        token_rewards=jnp.asarray(token_rewards),
        episode_rewards=jnp.asarray(reward, jnp.float32),
    )


def update_phase(actor, actor_opt, critic, critic_opt, data, filter_value, actor_hyper, critic_hyper):
    """Filter -> compact -> advantages -> critic + actor updates (the part of a step that filtering shrinks)."""
    result = filtering.apply_filter(data["episode_rewards"], value=filter_value, **FILTER)
    mask = data["loss_mask"] * result.row_mask[:, None]
    advantages, returns = gae(data["token_rewards"], data["old_values"], mask, 1.0, 1.0)
    batch = update_inputs.UpdateBatch(data["tokens"], data["positions"], data["attention_mask"], mask, data["old_logp"],
                               advantages, data["ref_logp"], returns, data["old_values"])
    batch = filtering.permute_rows(batch, result.perm)
    values_fn = functools.partial(models.values, MODEL)
    logits_fn = functools.partial(models.apply, MODEL)
    critic, critic_opt, critic_metrics = update.critic_update(values_fn, critic, critic_opt, batch, result.kept_rows,
                                                              critic_hyper, CONFIG)
    actor, actor_opt, actor_metrics = update.actor_update(logits_fn, actor, actor_opt, batch, result.kept_rows,
                                                          actor_hyper, CONFIG)
    metrics = {**result.metrics, **critic_metrics, **actor_metrics}
    return actor, actor_opt, critic, critic_opt, metrics


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="one timed repeat per figure")
    args = parser.parse_args()
    repeats = 1 if args.quick else 3

    actor = models.init_params(MODEL, jax.random.key(0))
    critic = models.init_value_params(MODEL, jax.random.key(1), backbone=actor)
    state = dict(actor=actor, actor_opt=update.optimizer_init(actor, CONFIG), critic=critic,
                 critic_opt=update.optimizer_init(critic, CONFIG))
    data = synthetic_batch(np.random.default_rng(0))
    actor_hyper = update_inputs.ActorHyper(*(jnp.float32(v) for v in (1e-6, 0.2, 0.28, 3.0, 0.001, 0.0, 1.0)))
    critic_hyper = update_inputs.CriticHyper(jnp.float32(1e-5), jnp.float32(0.5))
    step = jax.jit(update_phase)

    def run(filter_value):
        out = step(state["actor"], state["actor_opt"], state["critic"], state["critic_opt"], data,
                   jnp.float32(filter_value), actor_hyper, critic_hyper)
        jax.block_until_ready(out)
        return out[-1]

    def timed(filter_value):
        start = time.perf_counter()
        run(filter_value)
        return time.perf_counter() - start

    metrics_off, metrics_on = run(1.0), run(0.9)  # warm-up: one compile serves both values
    times_off, times_on = [], []
    for _ in range(repeats):  # interleaved, so a change in CPU contention hits both alike
        times_off.append(timed(1.0))
        times_on.append(timed(0.9))
    unfiltered, filtered = min(times_off), min(times_on)
    print(json.dumps({
        "benchmark": "filtering_update_phase",
        "batch": f"{NUM_GROUPS}x{GROUP_SIZE} trajectories x {LENGTH} tokens, minibatch {MINIBATCH}",
        "filter": "top_p softmax 0.9 vs 1.0",
        "kept_ratio": float(metrics_on["rollout/filter_kept_ratio"]),
        "actor_updates": [float(metrics_off["actor/num_updates"]), float(metrics_on["actor/num_updates"])],
        "unfiltered_s": round(unfiltered, 4),
        "filtered_s": round(filtered, 4),
        "ratio": round(filtered / unfiltered, 4),
        "compiles": step._cache_size(),
        "backend": jax.default_backend(),
    }))


if __name__ == "__main__":
    main()

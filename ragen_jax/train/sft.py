"""Supervised warm start on environment demonstrations (docs/architecture.md, design rule 7): teach a from-scratch model
the format.

Each SFT batch is a fresh batch of multi-turn demonstrations (`train.demonstrations`): the rollout's exact
chat layout, every turn's response a demonstration (reasoning that restates the observation, then the oracle's
answer with probability `oracle_prob` = `train.sft_oracle_prob`, else a random valid answer). With q = 1 the
model imitates the oracle; with q < 1 it learns the format on every turn and an input-dependent reasoning, but
picks its answers only partly right, which leaves room for RL. Batches have `batch_size` distinct prompts
(`train.sft_batch_size`, apart from the rollout geometry) and are trimmed to their longest row (rounded up to
`WIDTH_MULTIPLE`, so only a few shapes compile). The loss is the mean negative log-likelihood of the
demonstrated tokens; its gradient is summed over chunks of `micro_batch` rows (`train.sft_micro_batch_size`), so a
large model's backward holds one chunk's activations.

    params, losses = warm_start(rollout, tokenizer, params, env_params, key, steps=200, lr=1e-3,
                                batch_size=16, oracle_prob=0.3)
"""
from __future__ import annotations

import time
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

from ragen_jax.algos import scoring
from ragen_jax.models.lm import CausalLM
from ragen_jax.rollout.rollout import Rollout
from ragen_jax.train import batch as batch_lib
from ragen_jax.train import update
from ragen_jax.train.demonstrations import Demonstrator
from ragen_jax.train.own_reasoning import OwnReasoning

WIDTH_MULTIPLE = 256  # coarse: every new width compiles the SFT step once


def target_nll(model: CausalLM, params, tokens, positions, attention, loss_mask):
    """Summed negative log-likelihood f32[] under `model` of the masked target tokens (loss_mask f32[B, L-1] scores
    tokens[:, 1:])."""
    logp, _ = scoring.token_logprobs(model, params, tokens, positions, attention,
                                    jnp.float32(1.0))  # a block of positions' logits at a time
    return -(logp * loss_mask).sum()


def training_arrays(traj) -> tuple[np.ndarray, ...]:
    """(tokens, positions, attention, loss_mask) of a demonstration batch, cut to its longest row rounded up to
    WIDTH_MULTIPLE tokens (never beyond the buffer)."""
    width = min(traj.tokens.shape[1], -(-int(traj.length.max()) // WIDTH_MULTIPLE) * WIDTH_MULTIPLE)
    tokens, positions, attention, loss_mask = (np.asarray(x) for x in batch_lib.model_inputs(traj))
    return tokens[:, :width], positions[:, :width], attention[:, :width], loss_mask[:, :width - 1]


def sft_gradient(model: CausalLM, params, tokens, positions, attention, loss_mask, micro_batch: int):
    """(the mean negative log-likelihood of the masked targets, its gradient) of rows [B, L], summed over chunks of
    `micro_batch` rows (B a multiple of it): each chunk's `target_nll` over the whole batch's target count."""
    rows = tokens.shape[0]
    total = jnp.maximum(loss_mask.sum(), 1.0)

    def chunk_loss(params, tokens, positions, attention, loss_mask):
        return target_nll(model, params, tokens, positions, attention, loss_mask) / total

    def accumulate(carry, chunk):
        loss, grads = jax.value_and_grad(chunk_loss)(params, *chunk)
        return jax.tree.map(jnp.add, carry, (loss, grads)), None

    chunks = tuple(x.reshape(rows // micro_batch, micro_batch, *x.shape[1:])
                   for x in (tokens, positions, attention, loss_mask))
    zeros = (jnp.zeros((), jnp.float32), jax.tree.map(jnp.zeros_like, params))
    return jax.lax.scan(accumulate, zeros, chunks)[0]


def warm_start(rollout: Rollout, tokenizer, params, env_params, key: jax.Array, steps: int, lr: float,
               batch_size: int | None = None, oracle_prob: float = 1.0, log: Callable[[str], None] | None = print,
               log_every: int | None = None, micro_batch: int | None = None,
               own: OwnReasoning | None = None) -> tuple[object, list[float]]:
    """`steps` AdamW steps (optimizer settings of `update.UpdateConfig()`) on fresh demonstration batches of
    `batch_size` distinct prompts (default: the rollout's batch size) in `rollout`'s layout, each gradient summed over
    chunks of `micro_batch` rows (default: the whole batch; it must divide the batch). `own`: demonstrations keep the
    model's own sampled reasoning and add the closing (`train.demonstrations`). Returns (params, per-step losses).
    Prints progress every `log_every` steps to `log` (default: a tenth of the steps, at most 20)."""
    config = update.UpdateConfig()
    batch_size = batch_size or rollout.batch_size
    micro_batch = micro_batch or batch_size
    if batch_size % micro_batch:
        raise ValueError(f"SFT micro-batch {micro_batch} does not divide the SFT batch of {batch_size} rows")
    demonstrator = Demonstrator(rollout.regrouped(batch_size, 1), tokenizer, own)

    @jax.jit
    def train_step(params, opt_state, tokens, positions, attention, loss_mask):
        loss, grads = sft_gradient(rollout.model, params, tokens, positions, attention, loss_mask, micro_batch)
        params, opt_state, _, _ = update.optimizer_step(params, opt_state, grads, jnp.float32(lr), config)
        return params, opt_state, loss

    log_every = log_every or max(1, min(20, steps // 10))
    opt_state = update.optimizer_init(params, config)
    rng = np.random.default_rng(np.asarray(jax.random.key_data(key)).ravel().tolist())
    losses, correct, cut, start = [], [], 0, time.perf_counter()
    for i in range(steps):
        traj = demonstrator(jax.random.fold_in(key, i), env_params, rng, oracle_prob)
        params, opt_state, loss = train_step(params, opt_state, *training_arrays(traj))
        losses.append(float(loss))
        correct.append(float(traj.success.mean()))
        cut += int(traj.cut.sum())
        if log and ((i + 1) % log_every == 0 or i + 1 == steps):
            note = f"  ({cut} demonstrations cut at the buffer limit so far)" if cut else ""
            log(f"sft {i + 1}/{steps}  loss {losses[-1]:.4f}  demonstrated success {np.mean(correct):.2f}  "
                f"({time.perf_counter() - start:.0f}s){note}")
    return params, losses

"""Supervised warm start from environment oracles (DESIGN rule 7): teach a from-scratch model the answer format.

Each SFT batch is the turn-1 context of freshly reset envs, rendered by `Rollout.first_prompts` (so the tokens
are exactly those the RL rollout will show), followed by an oracle response: the env's paraphrased reasoning and
a correct answer, `{reasoning}</think><answer>{answer}</answer>` + end of turn after the `<think>` prefill
(`{answer}</answer>` + end of turn without thinking). The loss is the mean negative log-likelihood of the
response tokens. Only first turns are taught; later turns are left to RL.

    params, history = warm_start(rollout, tokenizer, params, env_params, key, steps=200, lr=1e-3)
"""
from __future__ import annotations

import functools
import time
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

from ragen_jax.models import transformer
from ragen_jax.models import tokenizer as tok_lib
from ragen_jax.rollout.rollout import Rollout
from ragen_jax.train import update


def response_text(reasoning: str, answer: str, enable_think: bool) -> str:
    """The oracle's response after the prefill (spec A.4/A.5 format)."""
    answer_part = f"{answer}{tok_lib.ANSWER_CLOSE}"
    return f"{reasoning}{tok_lib.THINK_CLOSE}{tok_lib.ANSWER_OPEN}{answer_part}" if enable_think else answer_part


def oracle_batch(rollout: Rollout, tokenizer, first_prompts: Callable, key: jax.Array, env_params,
                 rng: np.random.Generator, response_capacity: int):
    """(tokens i32[B, P + response_capacity], attention bool[B, same], loss_mask f32[B, same - 1], num_cut) on the
    host. first_prompts: `jax.jit(rollout.first_prompts)`. Responses longer than `response_capacity` (num_cut of
    them) are cut: the model then never sees their answer, so size the capacity to the oracle's responses.
    """
    prompts, lengths, states = jax.device_get(first_prompts(key, env_params))
    answers = rollout.env.oracles(states, rng)
    batch, width = prompts.shape[0], prompts.shape[1] + response_capacity
    tokens = np.full((batch, width), tokenizer.pad_id, np.int32)
    loss_mask = np.zeros((batch, width - 1), np.float32)
    ends = np.zeros(batch, np.int64)
    num_cut = 0
    for b, (reasoning, answer) in enumerate(answers):
        ids = tokenizer.encode(response_text(reasoning, answer, rollout.env.enable_think)) + [tokenizer.eos_id]
        num_cut += len(ids) > response_capacity
        ids = ids[:response_capacity]
        n = int(lengths[b])
        tokens[b, :n] = prompts[b, :n]
        tokens[b, n:n + len(ids)] = ids
        loss_mask[b, n - 1:n - 1 + len(ids)] = 1.0  # index t scores token t + 1
        ends[b] = n + len(ids)
    attention = np.arange(width)[None, :] < ends[:, None]
    return tokens, attention, loss_mask, num_cut


def sft_loss(model_config, params, tokens, attention, loss_mask):
    """Mean negative log-likelihood f32[] of the masked target tokens."""
    positions = jnp.broadcast_to(jnp.arange(tokens.shape[1], dtype=jnp.int32), tokens.shape)
    logp, _ = update.token_logprobs(functools.partial(transformer.apply, model_config), params, tokens, positions,
                                    attention, jnp.float32(1.0))
    return -(logp * loss_mask).sum() / jnp.maximum(loss_mask.sum(), 1.0)


def warm_start(rollout: Rollout, tokenizer, params, env_params, key: jax.Array, steps: int, lr: float,
               response_capacity: int | None = None, log: Callable[[str], None] | None = print,
               log_every: int = 20) -> tuple[object, list[float]]:
    """`steps` AdamW steps (optimizer settings of `update.UpdateConfig()`) on fresh oracle batches of the
    rollout's geometry. Returns (params, per-step losses). Prints progress every `log_every` steps to `log`."""
    config = update.UpdateConfig()
    capacity = response_capacity or rollout.response_length
    first_prompts = jax.jit(rollout.first_prompts)

    @jax.jit
    def train_step(params, opt_state, tokens, attention, loss_mask):
        loss, grads = jax.value_and_grad(functools.partial(sft_loss, rollout.model_config))(params, tokens, attention,
                                                                                           loss_mask)
        params, opt_state, _, _ = update.optimizer_step(params, opt_state, grads, jnp.float32(lr), config)
        return params, opt_state, loss

    opt_state = update.optimizer_init(params, config)
    rng = np.random.default_rng(np.asarray(jax.random.key_data(key)).ravel().tolist())
    losses, cut, start = [], 0, time.perf_counter()
    for i in range(steps):
        *batch, num_cut = oracle_batch(rollout, tokenizer, first_prompts, jax.random.fold_in(key, i), env_params, rng,
                                       capacity)
        params, opt_state, loss = train_step(params, opt_state, *batch)
        losses.append(float(loss))
        cut += num_cut
        if log and ((i + 1) % log_every == 0 or i + 1 == steps):
            note = f"  ({cut} oracle responses cut at {capacity} tokens so far)" if cut else ""
            log(f"sft {i + 1}/{steps}  loss {losses[-1]:.4f}  ({time.perf_counter() - start:.0f}s){note}")
    return params, losses

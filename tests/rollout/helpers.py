"""Shared by the rollout and training-batch tests: the tiny FrozenLake geometry and a scripted policy."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

import environments
from ragen_jax import models
from ragen_jax.models import chat, transformer
from ragen_jax.models.tokenizer import builtin
from ragen_jax.rollout.rollout import Rollout

GROUPS, GROUP_SIZE, TURNS, RESPONSE = 2, 2, 3, 24
SCRIPT = "<think>I go down first.</think><answer>Down</answer>"
REASONING = "I go down first."


def tiny_setup(vocab_size: int = 512):
    """(tokenizer, env, env_params, model config) for FrozenLake with the built-in tokenizer."""
    tokenizer = builtin()
    env, env_params = environments.make("frozen_lake", tokenizer)
    config = models.ModelConfig(vocab_size=vocab_size, d_model=32, num_layers=1, num_heads=2, num_kv_heads=1,
                                head_dim=16, mlp_dim=64, max_seq_len=2048, tie_embeddings=False)
    return tokenizer, env, env_params, config


def scripted_params(config, tokenizer, scale: float = 10.0):
    """A bigram model: zero layers, one-hot embeddings of the script's tokens, lm_head maps each to the next.

    Greedy decoding after the "<think>" prefill then always answers SCRIPT, whatever the prompt: the
    reasoning carries no information about the input (a template, spec D). `scale` sets how peaked each
    next-token distribution is (10: nearly deterministic; 1: high entropy, the same argmax).
    """
    script = tokenizer.encode(SCRIPT) + [tokenizer.eos_id]
    assert len(set(script)) == len(script) <= config.d_model, "script tokens must be distinct"
    params = jax.tree.map(jnp.zeros_like, transformer.init_params(config, jax.random.key(0)))
    params["final_norm"]["scale"] = jnp.ones_like(params["final_norm"]["scale"])
    embed = np.zeros((config.vocab_size, config.d_model), np.float32)
    head = np.zeros((config.d_model, config.vocab_size), np.float32)
    for i, (tok, nxt) in enumerate(zip(script[:-1], script[1:])):
        embed[tok, i] = 1.0
        head[i, nxt] = scale
    params["embed"]["embedding"] = jnp.asarray(embed)
    params["lm_head"]["kernel"] = jnp.asarray(head)
    return params


def run(setup, params, max_len, temperature, key=1):
    """(Rollout, Trajectory with numpy leaves) of the tiny geometry under `jax.jit`."""
    tokenizer, env, env_params, config = setup
    rollout = Rollout(env, tokenizer, chat.plain(), config, num_groups=GROUPS, group_size=GROUP_SIZE, max_turn=TURNS,
                      response_length=RESPONSE, max_len=max_len)
    traj = jax.jit(rollout)(params, jax.random.key(key), env_params, jnp.float32(temperature), jnp.float32(1.0))
    return rollout, jax.tree.map(np.asarray, traj)

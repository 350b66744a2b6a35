"""Shared by the rollout and training-batch tests: the tiny FrozenLake geometry and a scripted policy."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

import environments
from ragen_jax import models
from ragen_jax.models import chat, scripted
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
    """The bigram template policy answering SCRIPT after the "<think>" prefill, whatever the prompt
    (`ragen_jax.models.scripted`)."""
    return scripted.scripted_params(config, tokenizer.encode(SCRIPT) + [tokenizer.eos_id], scale)


def run(setup, params, max_len, temperature, key=1):
    """(Rollout, Trajectory with numpy leaves) of the tiny geometry under `jax.jit`."""
    tokenizer, env, env_params, config = setup
    rollout = Rollout(env, tokenizer, chat.plain(), models.DecoderLM(config), num_groups=GROUPS, group_size=GROUP_SIZE,
                      max_turn=TURNS, response_length=RESPONSE, max_len=max_len)
    traj = jax.jit(rollout)(params, jax.random.key(key), env_params, jnp.float32(temperature), jnp.float32(1.0))
    return rollout, jax.tree.map(np.asarray, traj)

"""The multi-turn rollout (docs/prompts_and_parsing.md#the-rollout-loop) as one pure, jittable function: envs, prompts,
generation, parsing.

    rollout = Rollout(env, tokenizer, chat_format, model_config, num_groups=8, group_size=16, max_turn=5,
                      response_length=400, max_len=3600)
    traj = jax.jit(rollout)(params, key, env_params, temperature, top_p)        # a Trajectory

B = num_groups * group_size envs are reset, the members of a group with the same key (same prompt,
docs/prompts_and_parsing.md#batch-geometry-and-seeding). Each turn renders a turn chunk (`prompts.TurnPrompts`) around
the env's observation, appends it to the KV cache and samples the response on the same cache (`sampler.generate`, so no
turn re-reads the history), then the env parses the response (prefill included) and steps. Envs that are done stop
generating; an env whose next turn would not fit in `max_len` tokens (chunk + `response_length` + closing) stops there
and is marked `cut` (RAGEN instead drops the oldest turns,
docs/prompts_and_parsing.md#context-length-and-turn-level-modes). After the last turn each trajectory is closed with the
chat format's end of turn, so decoding `tokens[:length]` gives exactly the chat text of its messages.
"""
from __future__ import annotations

import copy

import flax.struct
import jax
import jax.numpy as jnp

from environments.base import tree_select
from ragen_jax import sharding
from ragen_jax.models import kv_cache as kv
from ragen_jax.models import transformer as tfm
from ragen_jax.models.config import ModelConfig
from ragen_jax.rollout import prompts as prompts_lib
from ragen_jax.rollout import sampler


@flax.struct.dataclass
class Trajectory:
    """One rollout batch (B trajectories, T = max_turn, L = max_len); every field has B leading.

    tokens: i32[B, L] the chat text of each trajectory; buffer index s is position s; pad after `length`.
    length: i32[B].
    sampled: bool[B, L] tokens sampled from the policy (the assistant responses, stop token included):
      what the policy loss trains on. sample_logp: f32[B, L] their log-probs under the sampling
      distribution (0 elsewhere).
    turn_taken: bool[B, T] the turn was generated. response_start, response_len: i32[B, T] buffer span of
      the sampled tokens of the turn. think_start, think_len: i32[B, T] buffer span of its reasoning
      (strictly inside <think>..</think>; length 0 when the response did not parse).
    turn_reward: f32[B, T] env reward of the turn; format_ok: bool[B, T] (docs/prompts_and_parsing.md, format penalty).
    episode_reward: f32[B] sum of turn rewards + format_penalty per taken turn without format_ok
      (docs/rewards_and_objectives.md#episode-rewards).
    success: bool[B] the env's success predicate after the last taken turn; done: bool[B] the episode ended
      (terminated or action budget spent); cut: bool[B] stopped because the buffer was full.
    num_actions: i32[B] actions executed; group_ids: i32[B] the prompt group.
    """

    tokens: jax.Array
    length: jax.Array
    sampled: jax.Array
    sample_logp: jax.Array
    turn_taken: jax.Array
    response_start: jax.Array
    response_len: jax.Array
    think_start: jax.Array
    think_len: jax.Array
    turn_reward: jax.Array
    format_ok: jax.Array
    episode_reward: jax.Array
    success: jax.Array
    done: jax.Array
    cut: jax.Array
    num_actions: jax.Array
    group_ids: jax.Array


select_rows = jax.vmap(tree_select)  # row-wise where(pred[b], a[b], b[b]) over pytrees with leading axis B
write_rows = jax.vmap(prompts_lib.place)  # buffer[b, start[b] + k] = values[b, k] for k < length[b]


class Rollout:
    """Builds the prompt pieces once; calling it runs a whole batch of trajectories (see module docstring).

    Args:
      env: an `environments` TextEnv (vmapped here); tokenizer: the env's tokenizer;
      chat_format: `ragen_jax.models.chat.ChatFormat` whose markers are tokens of `tokenizer`;
      model_config: the policy's ModelConfig (vocab must cover the tokenizer, max_seq_len >= max_len);
      num_groups, group_size: batch geometry; max_turn: turns; response_length: new tokens per turn;
      max_len: buffer/KV-cache tokens per trajectory; top_k: static top-k (0 = off);
      format_penalty: added to the episode reward per turn without a fully valid answer.
    """

    def __init__(self, env, tokenizer, chat_format, model_config: ModelConfig, *, num_groups: int, group_size: int,
                 max_turn: int, response_length: int, max_len: int, top_k: int = 0, format_penalty: float = -0.1):
        chat_format.check_tokenizer(tokenizer)
        if model_config.vocab_size < tokenizer.vocab_size:
            raise ValueError(f"model vocab_size {model_config.vocab_size} < tokenizer vocab_size {tokenizer.vocab_size}")
        self.env, self.model_config = env, model_config
        self.num_groups, self.group_size, self.max_turn = num_groups, group_size, max_turn
        self.response_length, self.max_len, self.top_k = response_length, max_len, top_k
        self.format_penalty = float(format_penalty)
        self.pad_id, self.num_tokens = int(tokenizer.pad_id), int(tokenizer.vocab_size)
        self.prompts = prompts_lib.TurnPrompts(tokenizer, chat_format, env.instruction, max_turn,
                                               env.max_actions_per_traj, response_length, env.enable_think)
        self.chunk_capacity = self.prompts.chunk_capacity(env.obs_capacity)
        self.stop_sequences = sampler.stop_sequence_array([tokenizer.encode(s) for s in chat_format.stop_sequences])
        one_turn = len(self.prompts.system_ids) + self.chunk_capacity + response_length + len(self.prompts.close_ids)
        if max_len < one_turn:
            raise ValueError(f"max_len = {max_len} cannot hold the system prompt and one turn ({one_turn} tokens)")
        if max_len > model_config.max_seq_len:
            raise ValueError(f"max_len = {max_len} exceeds the model's max_seq_len = {model_config.max_seq_len}")

    @property
    def batch_size(self) -> int:
        return self.num_groups * self.group_size

    def regrouped(self, num_groups: int, group_size: int) -> "Rollout":
        """The same rollout (envs, prompts, lengths) with another batch geometry."""
        other = copy.copy(self)
        other.num_groups, other.group_size = num_groups, group_size
        return other

    def _reset(self, reset_key: jax.Array, env_params):
        """(obs, TurnState, group_ids i32[B]): members of a group share their reset key (docs/prompts_and_parsing.md,
        batch geometry)."""
        group_ids = jnp.repeat(jnp.arange(self.num_groups, dtype=jnp.int32), self.group_size)
        keys = jax.random.split(reset_key, self.num_groups)[group_ids]
        obs, state = jax.vmap(self.env.reset, in_axes=(0, None))(keys, env_params)
        return obs, state, group_ids

    def _chunks(self, t, obs, state, reward, stopped, warn):
        """The turn chunks of all rows: (tokens i32[B, chunk_capacity], length i32[B])."""
        return jax.vmap(self.prompts.chunk, in_axes=(None, 0, 0, 0, 0, 0, 0, None))(
            t, obs.tokens, obs.length, state.actions_left, reward, stopped, warn, self.chunk_capacity)

    def first_prompts(self, key: jax.Array, env_params):
        """The turn-1 context of each trajectory exactly as `__call__` builds it with the same `key` (system
        prompt, user turn, assistant header and prefill): (tokens i32[B, S + C], length i32[B], TurnState)."""
        obs, state, _ = self._reset(jax.random.split(key, 3)[0], env_params)
        off = jnp.zeros((self.batch_size,), bool)
        chunk, chunk_len = self._chunks(jnp.int32(0), obs, state, jnp.zeros((self.batch_size,), jnp.float32), off, off)
        system = jnp.broadcast_to(jnp.asarray(self.prompts.system_ids), (self.batch_size, len(self.prompts.system_ids)))
        return jnp.concatenate([system, chunk], axis=1), system.shape[1] + chunk_len, state

    def __call__(self, params, key: jax.Array, env_params, temperature, top_p) -> Trajectory:
        """params: policy parameters; key: PRNG key; temperature, top_p: f32 scalars (traced)."""
        env, B, L, T, N = self.env, self.batch_size, self.max_len, self.max_turn, self.response_length
        reset_key, gen_key, step_key = jax.random.split(key, 3)
        obs, state, group_ids = self._reset(reset_key, env_params)
        system = jnp.broadcast_to(jnp.asarray(self.prompts.system_ids), (B, len(self.prompts.system_ids)))
        cache = kv.init_cache(self.model_config, B, L)
        tokens = jnp.full((B, L), self.pad_id, jnp.int32)
        cur = jnp.zeros((B,), jnp.int32)
        if system.shape[1]:
            cache = tfm.hidden_states_with_cache(self.model_config, params, system, cache,
                                                 jnp.full((B,), system.shape[1], jnp.int32))[1]
            tokens = tokens.at[:, :system.shape[1]].set(system)
            cur = cur + system.shape[1]
        prefill = jnp.asarray(self.prompts.prefill_ids)
        close_len = len(self.prompts.close_ids)

        def turn(carry, t):
            (cache, tokens, sampled, logp, cur, state, obs, reward, stopped, warn, success, cut) = carry
            chunk, chunk_len = self._chunks(t, obs, state, reward, stopped, warn)
            fits = cur + chunk_len + N + close_len <= L
            active = ~state.done & ~cut & fits
            out, cache = sampler.generate(
                self.model_config, params, cache, chunk, chunk_len, jax.random.fold_in(gen_key, t), temperature,
                top_p, self.stop_sequences, active, max_new_tokens=N, top_k=self.top_k, pad_id=self.pad_id,
                num_tokens=self.num_tokens)
            gen_len = jnp.where(active, out.lengths, 0)
            start = cur + chunk_len
            tokens = write_rows(tokens, cur, chunk, jnp.where(active, chunk_len, 0))
            tokens = write_rows(tokens, start, out.tokens, gen_len)
            sampled = write_rows(sampled, start, jnp.ones_like(out.tokens, bool), gen_len)
            logp = write_rows(logp, start, out.logprobs, gen_len)
            response = jnp.concatenate([jnp.broadcast_to(prefill, (B, prefill.shape[0])), out.tokens], axis=1)
            response_len = prefill.shape[0] + gen_len
            parsed = jax.vmap(env.parse)(response, response_len)
            obs2, state2, r, _, info = jax.vmap(env.step_parsed, in_axes=(0, 0, 0, None))(
                jax.random.split(jax.random.fold_in(step_key, t), B), state, parsed, env_params)
            think = parsed.think_tokens  # [B, 2] token span within the response
            record = dict(
                taken=active, response_start=jnp.where(active, start, 0), response_len=gen_len,
                think_start=jnp.where(active, start - prefill.shape[0] + think[:, 0], 0),
                think_len=jnp.where(active, think[:, 1] - think[:, 0], 0),
                reward=jnp.where(active, r, 0.0), format_ok=active & info["format_ok"],
                num_actions=jnp.where(active, info["num_actions"], 0))
            carry = (cache, tokens, sampled, logp, jnp.where(active, start + gen_len, cur),
                     select_rows(active, state2, state), select_rows(active, obs2, obs),
                     jnp.where(active, r, reward), jnp.where(active, out.stopped, stopped),
                     jnp.where(active, ~info["action_is_valid"], warn), jnp.where(active, info["success"], success),
                     cut | (~state.done & ~cut & ~fits))
            return _shard_carry(carry), record

        init = (cache, tokens, jnp.zeros((B, L), bool), jnp.zeros((B, L), jnp.float32), cur, state, obs,
                jnp.zeros((B,), jnp.float32), jnp.zeros((B,), bool), jnp.zeros((B,), bool), jnp.zeros((B,), bool),
                jnp.zeros((B,), bool))
        carry, rec = jax.lax.scan(turn, _shard_carry(init), jnp.arange(T, dtype=jnp.int32))
        _, tokens, sampled, logp, cur, state, _, _, stopped, _, success, cut = carry
        rec = jax.tree.map(lambda x: x.T, rec)  # [T, B] -> [B, T]
        close, close_n = jax.vmap(self.prompts.closing)(stopped)
        any_turn = rec["taken"].any(axis=1)
        close_n = jnp.where(any_turn, close_n, 0)
        tokens = write_rows(tokens, cur, close, close_n)
        penalties = (rec["taken"] & ~rec["format_ok"]).sum(axis=1)
        return Trajectory(
            tokens=tokens, length=cur + close_n, sampled=sampled, sample_logp=logp, turn_taken=rec["taken"],
            response_start=rec["response_start"], response_len=rec["response_len"], think_start=rec["think_start"],
            think_len=rec["think_len"], turn_reward=rec["reward"], format_ok=rec["format_ok"],
            episode_reward=rec["reward"].sum(axis=1) + self.format_penalty * penalties.astype(jnp.float32),
            success=success, done=state.done, cut=cut, num_actions=rec["num_actions"].sum(axis=1),
            group_ids=group_ids)



def _shard_carry(carry):
    """The turn loop's carry split over the mesh's batch axes (a no-op without one): rows stay on their devices."""
    cache, *rest = carry
    return (kv.shard_rows(cache), *sharding.shard_batch(rest))

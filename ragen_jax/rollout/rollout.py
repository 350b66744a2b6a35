"""The multi-turn rollout (docs/prompts_and_parsing.md#the-rollout-loop) as one pure, jittable function: envs, prompts,
generation, parsing.

    rollout = Rollout(env, tokenizer, chat_format, model, num_groups=8, group_size=16, max_turn=5,
                      response_length=400, max_len=3600)
    traj = jax.jit(rollout)(params, key, env_params, temperature, top_p)        # a Trajectory

B = num_groups * group_size envs are reset, the members of a group with the same key (same prompt,
docs/prompts_and_parsing.md#batch-geometry-and-seeding). Each turn renders a turn chunk (`prompts.TurnPrompts`) around
the env's observation, appends it to the KV cache and samples the response on the same cache (`sampler.generate`, so no
turn re-reads the history), then the env parses the response (prefill included) and steps. A group's members share
their turn-1 context (system prompt and first chunk), so it is prefilled once per group and copied to the members'
cache rows before turn 1, which appends only its last token. Envs that are done stop
generating; an env whose next turn would not fit in `max_len` tokens (chunk + `response_length` + closing) stops there
and is marked `cut` (RAGEN instead drops the oldest turns,
docs/prompts_and_parsing.md#context-length-and-turn-level-modes). After the last turn each trajectory is closed with the
chat format's end of turn, so decoding `tokens[:length]` gives exactly the chat text of its messages.

The turns are a `lax.scan` over a `TurnCarry`; each turn is `_generate` (chunk, cache, sample: a `Generation`) then
`_step_envs` (parse, step: the next carry and the turn's `TurnRecord`), and `_close` makes the Trajectory.
"""
from __future__ import annotations

import copy
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp

from environments.pytrees import tree_select
from ragen_jax import sharding
from ragen_jax.config import ConfigError
from ragen_jax.models import kv_cache as kv
from ragen_jax.models.lm import CausalLM
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


@flax.struct.dataclass
class TurnCarry:
    """The turn loop's state between turns (B rows, L = max_len).

    cache: the KV cache of every row's buffer; cached: i32[B] how many leading tokens of the row's next chunk the
    cache holds already (before turn 1 all but the last of it, see `Rollout._initial_carry`; 0 after);
    tokens: i32[B, L] the buffer (pad after `length`);
    sampled: bool[B, L] and sample_logp: f32[B, L] as in `Trajectory`; length: i32[B] tokens written so far.
    env_state, obs: the envs' state and last observation (rows with leading B); reward: f32[B] the last taken
    turn's reward; stopped: bool[B] its response ended on a stop sequence; warn: bool[B] its action was invalid
    (the next chunk says so); success: bool[B] the env's success predicate after it; cut: bool[B] see `Trajectory`.
    """

    cache: kv.KVCache
    cached: jax.Array
    tokens: jax.Array
    sampled: jax.Array
    sample_logp: jax.Array
    length: jax.Array
    env_state: Any
    obs: Any
    reward: jax.Array
    stopped: jax.Array
    warn: jax.Array
    success: jax.Array
    cut: jax.Array


@flax.struct.dataclass
class Generation:
    """What one turn's generation hands to the env step (B rows, N = response_length).

    active: bool[B] rows that generated this turn; fits: bool[B] the turn fit in the buffer; start: i32[B] buffer
    index of the first sampled token; out: the sampler's `SampleOutput` (tokens i32[B, N], lengths, logprobs,
    stopped); gen_len: i32[B] tokens sampled (0 on inactive rows).
    """

    active: jax.Array
    fits: jax.Array
    start: jax.Array
    out: sampler.SampleOutput
    gen_len: jax.Array


@flax.struct.dataclass
class TurnRecord:
    """One turn's per-row outputs stacked by the scan (each i32/f32/bool[B]; 0 / False on rows not taken).

    taken: the turn was generated; response_start, response_len, think_start, think_len, reward, format_ok,
    num_actions: as the `Trajectory` fields of the same names (num_actions: actions executed this turn).
    """

    taken: jax.Array
    response_start: jax.Array
    response_len: jax.Array
    think_start: jax.Array
    think_len: jax.Array
    reward: jax.Array
    format_ok: jax.Array
    num_actions: jax.Array


select_rows = jax.vmap(tree_select)  # row-wise where(pred[b], a[b], b[b]) over pytrees with leading axis B
write_rows = jax.vmap(prompts_lib.place)  # buffer[b, start[b] + k] = values[b, k] for k < length[b]


class Rollout:
    """Builds the prompt pieces once; calling it runs a whole batch of trajectories (see module docstring).

    Args:
      env: an `environments` TextEnv (vmapped here); tokenizer: the env's tokenizer;
      chat_format: `ragen_jax.models.chat.ChatFormat` whose markers are tokens of `tokenizer`;
      model: the policy's `models.lm.CausalLM` (its config's vocab must cover the tokenizer, max_seq_len >= max_len);
      num_groups, group_size: batch geometry; max_turn: turns; response_length: new tokens per turn;
      max_len: buffer/KV-cache tokens per trajectory; top_k: static top-k (0 = off);
      format_penalty: added to the episode reward per turn without a fully valid answer.
    """

    def __init__(self, env, tokenizer, chat_format, model: CausalLM, *, num_groups: int, group_size: int,
                 max_turn: int, response_length: int, max_len: int, top_k: int = 0, format_penalty: float = -0.1):
        chat_format.check_tokenizer(tokenizer)
        model_config = model.config
        if model_config.vocab_size < tokenizer.vocab_size:
            raise ConfigError("model.vocab_size", model_config.vocab_size,
                              f"the model needs a row for each of the tokenizer's {tokenizer.vocab_size} ids")
        self.env, self.model = env, model
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
            raise ConfigError("rollout.max_model_len", max_len, f"cannot hold the system prompt and one turn ({one_turn} "
                              "tokens: its longest observation and rollout.response_length)")
        if max_len > model_config.max_seq_len:
            raise ConfigError("rollout.max_model_len", max_len,
                              f"exceeds the model's max_seq_len = {model_config.max_seq_len}")

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
        return *self._first_context(obs, state), state

    def _first_context(self, obs, state) -> tuple[jax.Array, jax.Array]:
        """The turn-1 context of envs in these observations and states (leading axis n): the system prompt and the
        first chunk, (tokens i32[n, S + C], length i32[n])."""
        n = state.done.shape[0]
        off = jnp.zeros((n,), bool)
        chunk, chunk_len = self._chunks(jnp.int32(0), obs, state, jnp.zeros((n,), jnp.float32), off, off)
        system_ids = self.prompts.system_ids
        system = jnp.broadcast_to(jnp.asarray(system_ids, jnp.int32), (n, len(system_ids)))
        return jnp.concatenate([system, chunk], axis=1), len(system_ids) + chunk_len

    def __call__(self, params, key: jax.Array, env_params, temperature, top_p) -> Trajectory:
        """params: policy parameters; key: PRNG key; temperature, top_p: f32 scalars (traced)."""
        reset_key, gen_key, step_key = jax.random.split(key, 3)
        obs, env_state, group_ids = self._reset(reset_key, env_params)

        def turn(carry: TurnCarry, t):
            carry, generation = self._generate(params, carry, t, jax.random.fold_in(gen_key, t), temperature, top_p)
            carry, record = self._step_envs(carry, generation, jax.random.fold_in(step_key, t), env_params)
            return _shard_carry(carry), record

        init = _shard_carry(self._initial_carry(params, obs, env_state))
        carry, records = jax.lax.scan(turn, init, jnp.arange(self.max_turn, dtype=jnp.int32))
        return self._close(carry, records, group_ids)

    def _initial_carry(self, params, obs, env_state) -> TurnCarry:
        """The carry before turn 1: the system prompt written to the buffer, and the cache holding each row's turn-1
        context but its last token (`TurnCarry.cached`). The members of a group share that context (same reset key),
        so it is prefilled once per group and each member's cache rows are a copy of the group's."""
        B, L, n = self.batch_size, self.max_len, self.group_size
        context, context_len = self._first_context(*jax.tree.map(lambda x: x[::n], (obs, env_state)))
        group_cache = self.model.hidden_states_with_cache(params, context, self.model.init_cache(self.num_groups, L),
                                                          context_len - 1)[1]
        system = len(self.prompts.system_ids)
        tokens = jnp.full((B, L), self.pad_id, jnp.int32).at[:, :system].set(jnp.asarray(self.prompts.system_ids))
        off = jnp.zeros((B,), bool)
        return TurnCarry(cache=kv.repeat_rows(group_cache, n), cached=jnp.repeat(context_len - 1 - system, n),
                         tokens=tokens, sampled=jnp.zeros((B, L), bool), sample_logp=jnp.zeros((B, L), jnp.float32),
                         length=jnp.full((B,), system, jnp.int32), env_state=env_state, obs=obs,
                         reward=jnp.zeros((B,), jnp.float32), stopped=off, warn=off, success=off, cut=off)

    def _generate(self, params, carry: TurnCarry, t, key: jax.Array, temperature,
                  top_p) -> tuple[TurnCarry, Generation]:
        """Turn `t` (i32 scalar): renders each row's chunk, appends it to the cache and samples the response
        (rows that are done, cut or would not fit stay untouched); both are written to the buffer."""
        N = self.response_length
        chunk, chunk_len = self._chunks(t, carry.obs, carry.env_state, carry.reward, carry.stopped, carry.warn)
        fits = carry.length + chunk_len + N + len(self.prompts.close_ids) <= self.max_len
        active = ~carry.env_state.done & ~carry.cut & fits
        uncached = jax.vmap(jnp.roll)(chunk, -carry.cached)  # the chunk's tokens not yet in the cache, first
        out, cache = sampler.generate(
            self.model, params, carry.cache, uncached, chunk_len - carry.cached, key, temperature, top_p,
            self.stop_sequences, active, max_new_tokens=N, top_k=self.top_k, pad_id=self.pad_id,
            num_tokens=self.num_tokens)
        gen_len = jnp.where(active, out.lengths, 0)
        start = carry.length + chunk_len
        tokens = write_rows(carry.tokens, carry.length, chunk, jnp.where(active, chunk_len, 0))
        carry = carry.replace(
            cache=cache, cached=jnp.zeros_like(carry.cached), tokens=write_rows(tokens, start, out.tokens, gen_len),
            sampled=write_rows(carry.sampled, start, jnp.ones_like(out.tokens, bool), gen_len),
            sample_logp=write_rows(carry.sample_logp, start, out.logprobs, gen_len))
        return carry, Generation(active=active, fits=fits, start=start, out=out, gen_len=gen_len)

    def _step_envs(self, carry: TurnCarry, generation: Generation, key: jax.Array,
                   env_params) -> tuple[TurnCarry, TurnRecord]:
        """Parses each response (prefill included) and steps the envs; only rows that generated take the step."""
        g, active = generation, generation.active
        prefill = jnp.asarray(self.prompts.prefill_ids)
        response = jnp.concatenate([jnp.broadcast_to(prefill, (self.batch_size, prefill.shape[0])), g.out.tokens],
                                   axis=1)
        parsed = jax.vmap(self.env.parse)(response, prefill.shape[0] + g.gen_len)
        obs, env_state, reward, _, info = jax.vmap(self.env.step_parsed, in_axes=(0, 0, 0, None))(
            jax.random.split(key, self.batch_size), carry.env_state, parsed, env_params)
        think = parsed.think_tokens  # [B, 2] token span within the response
        record = TurnRecord(
            taken=active, response_start=jnp.where(active, g.start, 0), response_len=g.gen_len,
            think_start=jnp.where(active, g.start - prefill.shape[0] + think[:, 0], 0),
            think_len=jnp.where(active, think[:, 1] - think[:, 0], 0), reward=jnp.where(active, reward, 0.0),
            format_ok=active & info["format_ok"], num_actions=jnp.where(active, info["num_actions"], 0))
        carry = carry.replace(
            length=jnp.where(active, g.start + g.gen_len, carry.length),
            env_state=select_rows(active, env_state, carry.env_state), obs=select_rows(active, obs, carry.obs),
            reward=jnp.where(active, reward, carry.reward), stopped=jnp.where(active, g.out.stopped, carry.stopped),
            warn=jnp.where(active, ~info["action_is_valid"], carry.warn),
            success=jnp.where(active, info["success"], carry.success),
            cut=carry.cut | (~carry.env_state.done & ~carry.cut & ~g.fits))
        return carry, record

    def _close(self, carry: TurnCarry, records: TurnRecord, group_ids) -> Trajectory:
        """The Trajectory after the last turn: each row that took a turn gets the chat format's closing."""
        rec = jax.tree.map(lambda x: x.T, records)  # [T, B] -> [B, T]
        close, close_n = jax.vmap(self.prompts.closing)(carry.stopped)
        close_n = jnp.where(rec.taken.any(axis=1), close_n, 0)
        penalties = (rec.taken & ~rec.format_ok).sum(axis=1)
        return Trajectory(
            tokens=write_rows(carry.tokens, carry.length, close, close_n), length=carry.length + close_n,
            sampled=carry.sampled, sample_logp=carry.sample_logp, turn_taken=rec.taken,
            response_start=rec.response_start, response_len=rec.response_len, think_start=rec.think_start,
            think_len=rec.think_len, turn_reward=rec.reward, format_ok=rec.format_ok,
            episode_reward=rec.reward.sum(axis=1) + self.format_penalty * penalties.astype(jnp.float32),
            success=carry.success, done=carry.env_state.done, cut=carry.cut, num_actions=rec.num_actions.sum(axis=1),
            group_ids=group_ids)


def _shard_carry(carry: TurnCarry) -> TurnCarry:
    """The turn loop's carry split over the mesh's batch axes (a no-op without one): rows stay on their devices.
    The cache's rows are on axis 1 of its k/v, so it is constrained apart from the other fields."""
    return sharding.shard_batch(carry.replace(cache=None)).replace(cache=kv.shard_rows(carry.cache))

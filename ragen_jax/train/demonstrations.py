"""Multi-turn demonstrations for the warm start: the rollout's trajectories, with env demonstrations as responses.

    demo = Demonstrator(rollout, tokenizer)
    traj = demo(key, env_params, rng, oracle_prob=0.3)     # a numpy `Trajectory` of rollout.batch_size rows

Every turn is laid out exactly as `Rollout.__call__` lays it out with the same key (reset keys per group, turn
chunks, step keys, the action budget, the buffer limit and the closing), but the response of each turn is a
demonstration (`TextEnv.demonstrations`: reasoning describing the observation, then the oracle's answer with
probability `oracle_prob`, else a random valid one) followed by the end-of-turn token, and the envs step on it.
So later turns are taught along the demonstrated trajectories, and `traj.sampled` marks the demonstrated
tokens (the SFT targets). A response is cut at `rollout.response_length` tokens like a generated one.

With `own` (a `train.own_reasoning.OwnReasoning`), a turn's reasoning is instead the model's own continuation of
that turn's context, followed by the closing (`</think><answer>...</answer>` and the end of turn). The targets are
the whole response: on the reasoning, a sample of the model's own distribution, the loss keeps that distribution and
teaches that the reasoning goes on there; on the closing, the format. A turn whose sample was too short to keep is written with an empty reasoning
and has no targets.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from ragen_jax.models import tokenizer as tok_lib
from ragen_jax.rollout.rollout import Rollout, Trajectory
from ragen_jax.train.own_reasoning import OwnReasoning


def response_text(reasoning: str, answer: str, enable_think: bool) -> str:
    """A demonstrated response after the prefill (docs/prompts_and_parsing.md format):
    `{reasoning}</think><answer>{answer}</answer>` with thinking, `{answer}</answer>` without."""
    return reasoning + closing_text(answer, enable_think)


def closing_text(answer: str, enable_think: bool) -> str:
    """What follows the reasoning in a demonstrated response: `</think><answer>{answer}</answer>` (thinking) or
    `{answer}</answer>`."""
    answer_part = f"{answer}{tok_lib.ANSWER_CLOSE}"
    return f"{tok_lib.THINK_CLOSE}{tok_lib.ANSWER_OPEN}{answer_part}" if enable_think else answer_part


def response_ids(tokenizer, reasoning: str, answer: str, enable_think: bool, limit: int, own: bool) -> list[int]:
    """A demonstrated response's token ids, end of turn included, at most `limit` of them. An env demonstration is
    encoded whole and cut at `limit` like a generated response; an own-reasoning one keeps its closing whole and
    drops reasoning tokens to fit."""
    if not own:
        return (tokenizer.encode(response_text(reasoning, answer, enable_think)) + [tokenizer.eos_id])[:limit]
    closing = tokenizer.encode(closing_text(answer, enable_think)) + [tokenizer.eos_id]
    thought = tokenizer.encode(reasoning)[:max(limit - len(closing), 0)] if reasoning else []
    return (thought + closing)[:limit]


class Demonstrator:
    """Builds demonstration batches of `rollout`'s geometry (see the module docstring).

    Args:
      rollout: the `Rollout` whose layout is reproduced (its batch size is the demonstration batch size);
      tokenizer: the env's tokenizer. Calling it takes `oracle_prob`, the probability that a turn's answer is the
      oracle's; the compiled env functions are shared by all calls;
      own: the model's own reasoning in place of the env's (see the module docstring), or None.
    """

    def __init__(self, rollout: Rollout, tokenizer, own: OwnReasoning | None = None):
        self.rollout, self.tokenizer, self.own = rollout, tokenizer, own
        self._env = rollout.env
        self._reset = jax.jit(rollout._reset)
        self._chunks = jax.jit(rollout._chunks)
        self._step = jax.jit(jax.vmap(self._parsed_step, in_axes=(0, 0, 0, 0, None)))

    def _parsed_step(self, key, state, tokens, length, params):
        parsed = self._env.parse(tokens, length)
        obs, state, reward, done, info = self._env.step_parsed(key, state, parsed, params)
        return obs, state, reward, info, parsed.think_tokens

    def __call__(self, key: jax.Array, env_params, rng: np.random.Generator, oracle_prob: float) -> Trajectory:
        if not 0.0 <= oracle_prob <= 1.0:
            raise ValueError(f"oracle_prob must be in [0, 1], got {oracle_prob}")
        ro, tokenizer = self.rollout, self.tokenizer
        B, L, T, N = ro.batch_size, ro.max_len, ro.max_turn, ro.response_length
        reset_key, gen_key, step_key = jax.random.split(key, 3)
        obs, state, group_ids = self._reset(reset_key, env_params)
        system, prefill = ro.prompts.system_ids, ro.prompts.prefill_ids
        close_len = len(ro.prompts.close_ids)
        tokens = np.full((B, L), ro.pad_id, np.int32)
        tokens[:, :len(system)] = system
        sampled = np.zeros((B, L), bool)
        cur = np.full(B, len(system), np.int64)
        rec = {k: np.zeros((B, T), dt) for k, dt in (("taken", bool), ("response_start", np.int32),
               ("response_len", np.int32), ("think_start", np.int32), ("think_len", np.int32),
               ("reward", np.float32), ("format_ok", bool), ("num_actions", np.int32))}
        reward, stopped, warn = np.zeros(B, np.float32), np.zeros(B, bool), np.zeros(B, bool)
        success, cut = np.zeros(B, bool), np.zeros(B, bool)
        for t in range(T):
            chunk, chunk_len = jax.device_get(self._chunks(jnp.int32(t), obs, state, reward, stopped, warn))
            done = np.asarray(jax.device_get(state.done))
            fits = cur + chunk_len + N + close_len <= L
            active = ~done & ~cut & fits
            cut |= ~done & ~cut & ~fits
            demos = self._env.demonstrations(state, rng, oracle_prob)
            response = np.zeros((B, len(prefill) + N), np.int32)
            response[:, :len(prefill)] = prefill
            gen_len = np.zeros(B, np.int32)
            for b in np.flatnonzero(active):
                tokens[b, cur[b]:cur[b] + chunk_len[b]] = chunk[b, :chunk_len[b]]
            own = None
            if self.own is not None:
                own = self.own(jax.random.fold_in(gen_key, t), tokens, np.where(active, cur + chunk_len, 1), active,
                               rng)
            for b in np.flatnonzero(active):
                reasoning, answer = demos[b]
                if own is not None:
                    reasoning = own[b] or ""
                ids = response_ids(tokenizer, reasoning, answer, self._env.enable_think, N, own is not None)
                n, start = len(ids), cur[b] + chunk_len[b]
                tokens[b, start:start + n] = ids
                if own is None or own[b] is not None:  # an own sample too short to keep teaches nothing
                    sampled[b, start:start + n] = True
                response[b, len(prefill):len(prefill) + n] = ids
                gen_len[b] = n
            keys = jax.random.split(jax.random.fold_in(step_key, t), B)
            obs2, state2, r, info, think = jax.device_get(
                self._step(keys, state, response, len(prefill) + gen_len, env_params))
            r = np.asarray(r, np.float32)
            start = cur + chunk_len
            rec["taken"][:, t] = active
            rec["response_start"][:, t] = np.where(active, start, 0)
            rec["response_len"][:, t] = gen_len
            rec["think_start"][:, t] = np.where(active, start - len(prefill) + think[:, 0], 0)
            rec["think_len"][:, t] = np.where(active, think[:, 1] - think[:, 0], 0)
            rec["reward"][:, t] = np.where(active, r, 0.0)
            rec["format_ok"][:, t] = active & info["format_ok"]
            rec["num_actions"][:, t] = np.where(active, info["num_actions"], 0)
            obs = _select(active, obs2, obs)
            state = _select(active, state2, state)
            last = tokens[np.arange(B), np.clip(start + gen_len - 1, 0, L - 1)]  # inactive rows: any index
            reward = np.where(active, r, reward)
            stopped = np.where(active, (gen_len > 0) & (last == tokenizer.eos_id), stopped)
            warn = np.where(active, ~np.asarray(info["action_is_valid"]), warn)
            success = np.where(active, info["success"], success)
            cur = np.where(active, start + gen_len, cur)
        close = np.asarray(ro.prompts.close_ids)
        any_turn = rec["taken"].any(axis=1)
        close_n = np.where(any_turn, len(close) - stopped.astype(np.int64), 0)
        for b in range(B):
            tokens[b, cur[b]:cur[b] + close_n[b]] = close[len(close) - close_n[b]:]
        penalties = (rec["taken"] & ~rec["format_ok"]).sum(axis=1)
        return Trajectory(
            tokens=tokens, length=(cur + close_n).astype(np.int32), sampled=sampled,
            sample_logp=np.zeros((B, L), np.float32), turn_taken=rec["taken"], response_start=rec["response_start"],
            response_len=rec["response_len"], think_start=rec["think_start"], think_len=rec["think_len"],
            turn_reward=rec["reward"], format_ok=rec["format_ok"],
            episode_reward=rec["reward"].sum(axis=1) + ro.format_penalty * penalties.astype(np.float32),
            success=success, done=np.asarray(state.done), cut=cut, num_actions=rec["num_actions"].sum(axis=1),
            group_ids=np.asarray(group_ids))


def _select(pred: np.ndarray, on_true, on_false):
    """Row-wise where over two pytrees of host arrays with leading axis B."""
    return jax.tree.map(lambda a, b: np.where(pred.reshape((-1,) + (1,) * (np.ndim(a) - 1)), a, b), on_true, on_false)

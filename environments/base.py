"""`TextEnv`: the base of every text environment (gymnax-style, pure JAX, vmappable, jittable).

Public API (all functions pure; vmap over a batch of envs, jit freely):

    env, params = environments.make("frozen_lake", tokenizer)          # registry.py
    obs, state = env.reset(key, params)                                 # Observation, TurnState
    obs, state, reward, done, info = env.step(key, state, response_tokens, response_len, params)
    env.render_text(state) -> str        # host, one unbatched state; == decode(obs.tokens[:obs.length])
    env.oracle(state, rng) -> (reasoning, answer)   # host; a correct answer + a paraphrased reasoning
    env.render_texts(states), env.oracles(states, rng)  # the same for a batch (leading axis)
    env.parse(response_tokens, response_len) -> ParsedResponse   # parsing.py, e.g. for token spans
    env.step_parsed(key, state, parsed, params)  # = step, on a response already parsed
    env.instruction: str                 # env part of the system prompt (rules, symbols, actions)
    env.action_words: tuple[str, ...]    # () for free-text envs
    env.obs_capacity: int                # static size of obs.tokens

`response_tokens` i32[R] are the generated tokens of one assistant turn including the prefilled
"<think>" (or "<answer>" when `enable_think=False`), i.e. the text RAGEN parses (docs/prompts_and_parsing.md); only
the first `response_len` count. `reward` f32[], `done` bool[] (terminated, or the action budget
`max_actions_per_traj` is spent), and `info` holds f32/bool/i32 scalars:

    success               the env's success predicate after the turn
    format_ok             a match was found, >= 1 action parsed and every parsed action is valid
                          (RAGEN's format-penalty test negated, docs/prompts_and_parsing.md; the rollout applies the
                          penalty)
    action_is_valid       at least one valid action was executed this turn
    action_is_effective   the LAST executed action changed the state (RAGEN's `turn_info.update` keeps
                          the last action's info)
    num_valid_actions     valid actions among the (<= max_actions_per_turn) parsed ones
    num_actions           actions executed this turn (<= remaining budget, stops at termination)
    terminated            the env reached a terminal state (not the budget)

A turn with no valid action leaves the state exactly unchanged. Stepping a done state executes nothing.
Action k of a turn gets the key `jax.random.split(key, max_actions_per_turn)[k]` (a free-text answer
gets `key` itself); nothing else draws from `key`.

Subclass contract (how Sokoban, Countdown, Arithmetic, ... plug in)
-------------------------------------------------------------------
1. Subclass `TextEnv`; in `__init__` take the static, shape-determining options as keyword arguments,
   build `self.pieces = PieceTable(tokenizer, [...every text fragment...])`, then call
   `super().__init__(tokenizer, pieces=..., action_words=..., obs_capacity=..., instruction=...,
   **base_kwargs)`. `obs_capacity` must bound the token length of every observation: compute it from
   `pieces.max_len(...)`/`pieces.token_len(...)`; `render` cuts anything beyond it.
2. Define the class attribute `Params` (a `flax.struct.dataclass` of traced values; `make` routes
   overrides named like its fields there), the attribute `default_params` (an instance) and these pure hooks,
   all on YOUR env state (a `flax.struct.dataclass`; the base wraps it in `TurnState.env`):
     init_state(key, params) -> S                               (same key => same instance)
     observation_pieces(s) -> i32[num_slots] piece indices      (0 = empty; fixed num_slots)
     success(s) -> bool[]
   and exactly ONE of the two action hooks:
     word actions (action_words non-empty): executed in order until terminal, rewards summed:
       apply_action(key, s, action i32[], params) -> (s, reward f32[], terminated bool[], effective bool[])
       action_valid(s, action i32[]) -> bool[]                   (optional; default: every word valid)
     free text (action_words == ()): one answer per turn, the first non-empty stripped `||`-part:
       apply_answer(key, s, text u8[N], text_len i32[], params)
           -> (s, reward f32[], terminated bool[], valid bool[], effective bool[])
3. Host oracle: `oracle_answer(s_numpy, rng: np.random.Generator, max_actions) -> (reasoning, answer)`
   where `s_numpy` is your state with numpy leaves (unbatched), `answer` the text inside <answer>
   (e.g. "Left || Down", at most `max_actions` actions) and `reasoning` a short paraphrased text; it raises
   ValueError on a state without a correct answer (finished, or an unsolvable Sokoban room).
   For weak warm starts (`demonstrations`): `describe(s_numpy, rng) -> str`, reasoning that restates the
   observation without choosing an answer, and for free-text envs `random_answer(s_numpy, rng) -> str`, a
   well-formed answer that is right only by chance (word-action envs draw random valid words).
   For the faithfulness score (`diagnostics.faithfulness_prompts`): `facts(s_numpy) -> tuple[Fact, ...]`,
   what `describe` restates, each with how a reasoning states it (environments/faithfulness.py).
4. Register at the bottom of your module: `registry.register("name", YourEnv)`, and add the module's
   dotted name to `registry.ENV_MODULES` (the registry imports exactly those modules); no other file needs
   editing.
"""
from __future__ import annotations

from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from environments.parsing import ParsedResponse, ResponseParser
from environments.pieces import Observation, PieceTable, Tokenizer
from environments.pytrees import tree_select


@struct.dataclass
class TurnState:
    """The env's own state plus the base's bookkeeping.

    env: the subclass state; actions_left: i32[] remaining action budget of the trajectory;
    done: bool[] the episode has ended (terminated or budget spent).
    """

    env: Any
    actions_left: jnp.ndarray
    done: jnp.ndarray


class TextEnv:
    """Base class; see the module docstring for the API and the subclass contract."""

    Params: Any = None
    default_params: Any = None

    def __init__(
        self,
        tokenizer: Tokenizer,
        *,
        pieces: PieceTable,
        action_words: Sequence[str],
        obs_capacity: int,
        instruction: str,
        max_actions_per_turn: int = 2,
        max_actions_per_traj: int = 10,
        enable_think: bool = True,
        max_answer_bytes: int = 64,
    ):
        if max_actions_per_traj < 1:
            raise ValueError(f"max_actions_per_traj must be >= 1, got {max_actions_per_traj}")
        if obs_capacity < 1:
            raise ValueError(f"obs_capacity must be >= 1, got {obs_capacity}")
        self.tokenizer = tokenizer
        self.pieces = pieces
        self.action_words = tuple(action_words)
        self.obs_capacity = int(obs_capacity)
        self.instruction = instruction
        self.max_actions_per_turn = int(max_actions_per_turn)
        self.max_actions_per_traj = int(max_actions_per_traj)
        self.enable_think = bool(enable_think)
        self.parse = ResponseParser(tokenizer, self.action_words, self.max_actions_per_turn, self.enable_think,
                                    max_answer_bytes=max_answer_bytes)
        self._host_pieces = jax.jit(self.observation_pieces)
        self._host_pieces_batch = jax.jit(jax.vmap(self.observation_pieces))
        # action_valid of every (state, word) pair of a batch, for random valid demonstrations
        self._host_valid = jax.jit(jax.vmap(lambda s, words: jax.vmap(lambda a: self.action_valid(s, a))(words),
                                            in_axes=(0, None)))

    # ----------------------------------------------------------------- hooks (subclasses override)
    def init_state(self, key, params):
        raise NotImplementedError(f"{type(self).__name__} must define init_state")

    def observation_pieces(self, s) -> jnp.ndarray:
        raise NotImplementedError(f"{type(self).__name__} must define observation_pieces")

    def success(self, s) -> jnp.ndarray:
        raise NotImplementedError(f"{type(self).__name__} must define success")

    def apply_action(self, key, s, action, params):
        raise NotImplementedError(f"{type(self).__name__} has action words but no apply_action")

    def action_valid(self, s, action) -> jnp.ndarray:
        return jnp.bool_(True)

    def apply_answer(self, key, s, text, text_len, params):
        raise NotImplementedError(f"{type(self).__name__} has no action words but no apply_answer")

    def oracle_answer(self, s, rng: np.random.Generator, max_actions: int) -> tuple[str, str]:
        raise NotImplementedError(f"{type(self).__name__} has no oracle")

    def describe(self, s, rng: np.random.Generator) -> str:
        raise NotImplementedError(f"{type(self).__name__} has no observation description (describe)")

    def facts(self, s) -> tuple:
        raise NotImplementedError(f"{type(self).__name__} lists no facts of its observations (facts)")

    def random_answer(self, s, rng: np.random.Generator) -> str:
        raise NotImplementedError(f"{type(self).__name__} is a free-text env without random_answer")

    # ----------------------------------------------------------------- public API
    def render(self, s) -> Observation:
        """In-graph observation of an env state `s` (the subclass state)."""
        return self.pieces.render(self.observation_pieces(s), self.obs_capacity)

    def reset(self, key: jax.Array, params) -> tuple[Observation, TurnState]:
        s = self.init_state(key, params)
        state = TurnState(env=s, actions_left=jnp.int32(self.max_actions_per_traj), done=jnp.bool_(False))
        return self.render(s), state

    def step(self, key, state: TurnState, response_tokens, response_len, params):
        return self.step_parsed(key, state, self.parse(response_tokens, response_len), params)

    def step_parsed(self, key, state: TurnState, parsed: ParsedResponse, params):
        """`step` on a response already parsed by `self.parse` (callers that also need the parse, e.g. its
        reasoning span, parse once)."""
        if self.action_words:
            s, reward, terminated, executed, num_valid, format_ok, effective = self._run_actions(
                key, state, parsed, params
            )
        else:
            s, reward, terminated, executed, num_valid, format_ok, effective = self._run_answer(
                key, state, parsed, params
            )
        actions_left = state.actions_left - executed
        done = state.done | terminated | (actions_left <= 0)
        new_state = TurnState(env=s, actions_left=actions_left, done=done)
        info = {
            "success": self.success(s),
            "format_ok": format_ok,
            "action_is_valid": executed > 0,
            "action_is_effective": effective,
            "num_valid_actions": num_valid,
            "num_actions": executed,
            "terminated": terminated,
        }
        return self.render(s), new_state, reward.astype(jnp.float32), done, info

    def render_text(self, state: TurnState) -> str:
        """Host text of the observation of one unbatched state (equals the decoded `render`)."""
        return self.pieces.text(jax.device_get(self._host_pieces(state.env)))

    def render_texts(self, states: TurnState) -> list[str]:
        """Host texts of a batch of states (leading axis), one compiled call for the whole batch."""
        pieces = np.asarray(jax.device_get(self._host_pieces_batch(states.env)))
        return [self.pieces.text(row) for row in pieces]

    def oracle(self, state: TurnState, rng: np.random.Generator, max_actions: int | None = None):
        """(reasoning, answer) for one unbatched state; `max_actions` defaults to max_actions_per_turn."""
        s = jax.tree.map(np.asarray, jax.device_get(state.env))
        return self.oracle_answer(s, rng, self._max_actions(max_actions))

    def oracles(self, states: TurnState, rng: np.random.Generator, max_actions: int | None = None):
        """`oracle` for each state of a batch (leading axis): a list of (reasoning, answer), None where done."""
        m = self._max_actions(max_actions)
        return [None if s is None else self.oracle_answer(s, rng, m) for s in self._host_rows(states)]

    def oracle_answers(self, states: TurnState, rng: np.random.Generator, max_actions: int | None = None):
        """The oracle's answer for each state of a batch: a list of str, None where done or where the state has
        no correct answer (the oracle raised ValueError)."""
        m = self._max_actions(max_actions)
        out = []
        for s in self._host_rows(states):
            try:
                out.append(None if s is None else self.oracle_answer(s, rng, m)[1])
            except ValueError:
                out.append(None)
        return out

    def demonstrations(self, states: TurnState, rng: np.random.Generator, oracle_prob: float,
                       max_actions: int | None = None) -> list[tuple[str, str] | None]:
        """Warm-start demonstrations for a batch of states (leading axis): None where done, else (reasoning,
        answer) with `reasoning = describe(s)` and, with probability `oracle_prob`, the oracle's answer, otherwise
        a random answer in the same format (and always where the state has no oracle answer): 1 to
        `max_actions` uniformly drawn valid words, or `random_answer` for free-text envs. So the reasoning always
        depends on the input while the answer is correct with probability about `oracle_prob`."""
        rows = self._host_rows(states)
        m = self._max_actions(max_actions)
        if self.action_words:
            valid = np.asarray(self._host_valid(states.env, jnp.arange(len(self.action_words))))  # bool[B, words]
        take_oracle = rng.random(len(rows)) < oracle_prob
        oracle = self.oracle_answers(states, rng, m) if take_oracle.any() else [None] * len(rows)
        out = []
        for i, s in enumerate(rows):
            if s is None:
                out.append(None)
                continue
            answer = oracle[i] if take_oracle[i] else None
            if answer is None:
                answer = self._random_words(valid[i], rng, m) if self.action_words else self.random_answer(s, rng)
            out.append((self.describe(s, rng), answer))
        return out

    def _max_actions(self, max_actions: int | None) -> int:
        return self.max_actions_per_turn if max_actions is None else max_actions

    def _host_rows(self, states: TurnState) -> list:
        """The env states of a batch as unbatched numpy pytrees, one host copy; None where done."""
        host = jax.tree.map(np.asarray, jax.device_get(states.env))
        done = np.asarray(states.done)
        return [None if done[i] else jax.tree.map(lambda x: x[i], host) for i in range(done.shape[0])]

    def _random_words(self, valid: np.ndarray, rng: np.random.Generator, max_actions: int) -> str:
        choices = np.flatnonzero(valid)
        count = int(rng.integers(1, max_actions + 1))
        return " || ".join(self.action_words[int(a)] for a in rng.choice(choices, size=count))

    # ----------------------------------------------------------------- turn execution
    def _run_actions(self, key, state: TurnState, parsed: ParsedResponse, params):
        m = self.max_actions_per_turn
        slots = jnp.arange(m)
        ids = parsed.action_ids
        valid = (slots < parsed.num_parts) & (ids >= 0)
        valid &= jax.vmap(lambda a: self.action_valid(state.env, a))(jnp.maximum(ids, 0))
        num_valid = valid.sum().astype(jnp.int32)
        format_ok = parsed.found & (num_valid > 0) & (num_valid == parsed.num_parts)
        # valid actions in order, moved to the front
        order = jnp.argsort(~valid, stable=True)
        queue = ids[order]
        budget = jnp.where(state.done, 0, jnp.minimum(num_valid, state.actions_left))

        def one(carry, xs):
            s, reward, terminated, executed, effective = carry
            i, k = xs
            run = (i < budget) & ~terminated
            s2, r, t, e = self.apply_action(k, s, queue[i], params)
            return (
                tree_select(run, s2, s),
                reward + jnp.where(run, r, 0.0),
                terminated | (run & t),
                executed + run.astype(jnp.int32),
                jnp.where(run, e, effective),
            ), None

        init = (state.env, jnp.float32(0.0), jnp.bool_(False), jnp.int32(0), jnp.bool_(False))
        (s, reward, terminated, executed, effective), _ = jax.lax.scan(
            one, init, (slots, jax.random.split(key, m))
        )
        return s, reward, terminated, executed, num_valid, format_ok, effective

    def _run_answer(self, key, state: TurnState, parsed: ParsedResponse, params):
        size = parsed.answer_bytes.shape[0]
        start, end = parsed.part_start[0], parsed.part_end[0]
        has = parsed.found & (parsed.num_parts > 0)
        idx = start + jnp.arange(size)
        text = jnp.where(idx < end, parsed.answer_bytes[jnp.clip(idx, 0, size - 1)], 0).astype(jnp.uint8)
        text_len = jnp.where(has, end - start, 0).astype(jnp.int32)
        s2, r, t, valid, e = self.apply_answer(key, state.env, text, text_len, params)
        run = has & ~state.done & (state.actions_left > 0)
        ok = run & valid
        return (
            tree_select(ok, s2, state.env),
            jnp.where(ok, r, 0.0),
            ok & t,
            ok.astype(jnp.int32),
            ok.astype(jnp.int32),
            has & valid,
            ok & e,
        )

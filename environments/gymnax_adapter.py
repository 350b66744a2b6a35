"""Any gymnax environment with a discrete action space as a text environment (one generic adapter).

`GymnaxText(tokenizer, env_id, action_names=..., render="numbers" | "grid", ...)` wraps
`gymnax.make(env_id)`. Each action word maps to one gymnax action; word actions are executed in order
with gymnax's `step_env` (no auto-reset, so the terminal observation stays) until `terminated` or
gymnax's time-limit `truncated`; rewards are summed. success = the episode terminated (not truncated)
with a positive last reward; action_is_effective = the observation changed. The observation (what the gymnax agent sees) is
rendered in-graph from digit/symbol pieces:

* "numbers": "Observation: v0 v1 ..." with the flattened values; integer observations as integers,
  float ones with `decimals` digits (rounded half-to-even in float32, so exact only up to float32
  precision; `-` for negative values, like Python's format). Magnitudes are clipped to `int_digits`
  digits (default from the gymnax observation space).
* "grid": "Observation:\\n" then one line per row of a 2-D observation, one symbol per value
  (`symbols` maps values to characters, others show "?").

gymnax params are the env params (vmappable as usual); `make` cannot route overrides to them, pass
`params.replace(...)` yourself. Registered as "gymnax:<env_id>" for the envs in `GYMNAX_ENVS`, each
with a host oracle written from its rules.
"""
from __future__ import annotations

from collections import deque
from typing import Callable

import gymnax
import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from environments import registry
from environments.base import TextEnv
from environments.pieces import PieceTable

DIGITS = tuple(str(d) for d in range(10))


@struct.dataclass
class GymnaxTextState:
    """inner: the gymnax state; obs: its last observation; over: bool[] terminated or truncated;
    won: bool[] the last step terminated (not by the time limit) with a positive reward."""

    inner: object
    obs: jnp.ndarray
    over: jnp.ndarray
    won: jnp.ndarray


class GymnaxText(TextEnv):
    """See the module docstring."""

    def __init__(self, tokenizer, env_id: str, *, action_names=None, render: str = "numbers", decimals=None,
                 int_digits=None, symbols=None, oracle: Callable | None = None, env_kwargs=None, **base_kwargs):
        self.env_id = env_id
        self.gymnax_env, self.default_params = gymnax.make(env_id, **(env_kwargs or {}))
        num_actions = self.gymnax_env.num_actions
        names = tuple(action_names or (f"Action{i}" for i in range(num_actions)))
        if len(names) != num_actions:
            raise ValueError(f"{env_id}: {len(names)} action names for {num_actions} actions")
        space = self.gymnax_env.observation_space(self.default_params)
        obs = jax.eval_shape(lambda k: self.gymnax_env.reset_env(k, self.default_params)[0], jax.random.key(0))
        self.obs_shape, self.integer_obs = obs.shape, not jnp.issubdtype(obs.dtype, jnp.floating)
        if render not in ("numbers", "grid"):
            raise ValueError(f"{env_id}: render must be 'numbers' or 'grid', got {render!r}")
        if render == "grid" and (len(self.obs_shape) != 2 or not symbols):
            raise ValueError(f"{env_id}: grid render needs a 2-D observation and `symbols`, got {self.obs_shape}")
        self.render_mode = render
        self.decimals = (0 if self.integer_obs else 2) if decimals is None else decimals
        self.int_digits = int_digits or _digits_for(space)
        self.symbols = dict(symbols or {})
        self._oracle = oracle
        header = "Observation:\n" if render == "grid" else "Observation: "
        glyphs = [*self.symbols.values(), "?"]
        pieces = PieceTable(tokenizer, [header, " ", "\n", "-", ".", *DIGITS, *glyphs])
        self._header, self._space, self._newline = pieces.index(header), pieces.index(" "), pieces.index("\n")
        self._minus, self._dot, self._digits = pieces.index("-"), pieces.index("."), pieces.indices(list(DIGITS))
        self._symbol_values = np.array(list(self.symbols), np.float32)
        self._glyphs = pieces.indices(glyphs)
        size = int(np.prod(self.obs_shape))
        if render == "grid":
            capacity = pieces.token_len(header) + size * pieces.max_len(glyphs) + self.obs_shape[0] * pieces.token_len("\n")
        else:
            per_value = 2 + self.int_digits + (1 + self.decimals if self.decimals else 0)
            capacity = pieces.token_len(header) + size * per_value * pieces.max_len([" ", "-", ".", *DIGITS])
        instruction = (f"You are playing the gymnax environment {env_id}. Your available actions are: "
                       f"{', '.join(names)}. Answer with a sequence such as <answer>{names[0]} || {names[-1]}</answer>.")
        super().__init__(tokenizer, pieces=pieces, action_words=names, obs_capacity=capacity,
                         instruction=instruction, **base_kwargs)

    def init_state(self, key, params):
        obs, inner = self.gymnax_env.reset_env(key, params)
        return GymnaxTextState(inner=inner, obs=obs, over=jnp.bool_(False), won=jnp.bool_(False))

    def apply_action(self, key, s, action, params):
        obs, inner, reward, terminated, _ = self.gymnax_env.step_env(key, s.inner, action, params)
        over = terminated | self.gymnax_env.is_truncated(inner, params)
        state = GymnaxTextState(inner=inner, obs=obs, over=over, won=terminated & (reward > 0))
        return state, reward.astype(jnp.float32), over, jnp.any(obs != s.obs)

    def success(self, s):
        """The episode ended by termination with a positive last reward (FrozenLake goal, Catch catch)."""
        return s.won

    def observation_pieces(self, s):
        values = s.obs.reshape(-1)
        if self.render_mode == "grid":
            match = values[:, None] == jnp.asarray(self._symbol_values)[None, :]
            glyph = jnp.where(match.any(-1), jnp.argmax(match, -1), len(self.symbols))
            rows = jnp.asarray(self._glyphs)[glyph].reshape(self.obs_shape)
            ends = jnp.full((self.obs_shape[0], 1), self._newline).at[-1].set(0)
            body = jnp.concatenate([rows, ends], axis=1).reshape(-1)
        else:
            body = jax.vmap(self._number_pieces)(values).at[0, 0].set(0).reshape(-1)
        return jnp.concatenate([jnp.array([self._header]), body]).astype(jnp.int32)

    def _number_pieces(self, x):
        """i32[2 + int_digits (+ 1 + decimals)]: " ", sign, integer digits, "." and decimals."""
        d = self.decimals
        limit = 10 ** (self.int_digits + d) - 1
        scaled = jnp.round(jnp.abs(x.astype(jnp.float32)) * 10.0**d)
        scaled = jnp.minimum(scaled, limit).astype(jnp.int32)
        places = 10 ** np.arange(self.int_digits + d - 1, -1, -1)  # most significant first
        digits = (scaled // places) % 10
        integer = scaled // 10**d
        shown = (integer >= places[: self.int_digits] // 10**d) | (np.arange(self.int_digits) == self.int_digits - 1)
        int_pieces = jnp.where(shown, jnp.asarray(self._digits)[digits[: self.int_digits]], 0)
        sign = jnp.where(jnp.signbit(x.astype(jnp.float32)), self._minus, 0)
        parts = [jnp.array([self._space]), sign[None], int_pieces]
        if d:
            parts += [jnp.array([self._dot]), jnp.asarray(self._digits)[digits[self.int_digits :]]]
        return jnp.concatenate(parts)

    def oracle_answer(self, s, rng, max_actions):
        if self._oracle is None:
            raise NotImplementedError(f"no oracle for gymnax env {self.env_id}")
        return self._oracle(self, s.inner, rng, max_actions)


def _digits_for(space) -> int:
    """Integer digits needed for the largest magnitude of a gymnax observation space (6 if unbounded)."""
    if hasattr(space, "n"):
        biggest = space.n - 1
    else:
        biggest = float(np.max(np.abs(np.concatenate([np.ravel(space.low), np.ravel(space.high)]))))
    return len(str(int(biggest))) if np.isfinite(biggest) else 6


# ----------------------------------------------------------------------------- oracles of known envs
def _frozen_lake_oracle(env, inner, rng, max_actions):
    desc = np.asarray(env.gymnax_env.desc)
    rows, cols = desc.shape
    start, goal = int(inner.position), int(np.flatnonzero(desc.reshape(-1) == 3)[0])
    moves = ((0, -1), (1, 0), (0, 1), (-1, 0))
    previous, queue = {start: None}, deque([start])
    while queue:
        cur = queue.popleft()
        r, c = divmod(cur, cols)
        for a, (dr, dc) in enumerate(moves):
            nr, nc = r + dr, c + dc
            nxt = nr * cols + nc
            if 0 <= nr < rows and 0 <= nc < cols and nxt not in previous and desc[nr, nc] != 2:
                previous[nxt] = (cur, a)
                queue.append(nxt)
    if goal not in previous:
        raise ValueError(f"FrozenLake-misc: no path from tile {start} to the goal {goal}")
    path, cur = [], goal
    while previous[cur] is not None:
        cur, a = previous[cur]
        path.append(a)
    words = [env.action_words[a] for a in path[::-1][:max_actions]]
    return f"I am on tile {start} and the goal is tile {goal}; a safe route starts with {words[0]}.", " || ".join(words)


def _catch_oracle(env, inner, rng, max_actions):
    dx = int(inner.ball_x) - int(inner.paddle_x)
    step = "Right" if dx > 0 else "Left" if dx < 0 else "Stay"
    words = [step] * min(abs(dx), max_actions) or ["Stay"]
    words += ["Stay"] * (max_actions - len(words)) if dx == 0 else []
    return (f"The ball falls in column {int(inner.ball_x)} and my paddle is in column {int(inner.paddle_x)}, "
            f"so I move {step.lower()}.", " || ".join(words[:max_actions]))


def _bandit_oracle(env, inner, rng, max_actions):
    probs = np.asarray(inner.reward_probs)
    best = int(np.argmax(probs))
    return (f"Arm{best} pays with probability {probs[best]:.2f}, the other arm less, so I pull Arm{best}.",
            " || ".join([env.action_words[best]] * max_actions))


GYMNAX_ENVS = {
    "FrozenLake-misc": dict(action_names=("Left", "Down", "Right", "Up"), oracle=_frozen_lake_oracle),
    "BernoulliBandit-misc": dict(action_names=("Arm0", "Arm1"), oracle=_bandit_oracle),
    "Catch-bsuite": dict(action_names=("Left", "Stay", "Right"), render="grid", symbols={0.0: "_", 1.0: "#"},
                         oracle=_catch_oracle),
}

for _env_id, _spec in GYMNAX_ENVS.items():
    registry.register(f"gymnax:{_env_id}", GymnaxText, env_id=_env_id, **_spec)

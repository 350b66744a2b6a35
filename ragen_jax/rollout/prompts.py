"""The multi-turn prompt (docs/prompts_and_parsing.md#the-prompt-of-one-turn), rendered to tokens in-graph for any
tokenizer and chat format.

A trajectory's token buffer is the chat text

    begin + turn(system, SYSTEM) + turn(user, U_1) + assistant header + <think> + response_1 (+ end of turn)
          + after_turn + turn(user, "Reward:\\n{r_1}\\n" + U_2) + assistant header + <think> + response_2 ...

with SYSTEM = "You're a helpful assistant. " + env.instruction and the turn content
U_t = "\\nTurn {t}:\\nState:\\n{obs}\\n{warning}You have {k} actions left. Always output: {FORMAT} with no
extra text. Strictly follow this format. Max response length: {N} words (tokens).\\n" (docs/prompts_and_parsing.md). The
text between two generated responses is one *turn chunk*: `TurnPrompts.chunk` concatenates its pieces (tokenized
once here, through `environments.pieces.PieceTable`) around the env's observation tokens.

Deliberate differences from RAGEN, which re-renders the whole conversation as text every turn:
* the buffer holds the sampled tokens themselves (docs/architecture.md, design rule 6), so a response cut at the
  token limit is closed with the end-of-turn token after it (RAGEN re-renders the parsed response text);
* the warning after a turn without a valid action is part of the context the policy saw, as in RAGEN's
  inference prompts (RAGEN drops it from its re-rendered training sequences, docs/differences.md#prompts);
* rewards are printed rounded to cents without trailing zeros ("0.9", "-0.2", "10"), RAGEN prints Python's
  float repr ("0.9000000000000001");
* the length hint N is the generation limit `response_length` (RAGEN takes a per-env `max_tokens` hint).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from environments.pieces import PieceTable
from ragen_jax.models import chat as chat_lib

SYSTEM_OPENING = "You're a helpful assistant. "
FORMAT_THINK = "<think> [Your thoughts] </think> <answer> [your answer] </answer>"
FORMAT_ANSWER = "<answer> [your answer] </answer>"
WARNING = "No valid action provided previously. Environment state remains the same. Please try again.\n"
REWARD_LABEL = "Reward:\n"
_INT_DIGITS = 7  # rewards are printed with at most 7 integer digits (|r| < 10^7)


def format_reward(reward: float) -> str:
    """The host text of a reward as the chunk prints it: rounded to cents, no trailing zeros."""
    cents = int(np.round(np.float32(abs(reward)) * np.float32(100)))
    whole, frac = divmod(cents, 100)
    text = str(whole) + ("" if frac == 0 else f".{frac:02d}".rstrip("0"))
    return ("-" if reward < 0 and cents > 0 else "") + text


def user_content(turn: int, obs: str, actions_left: int, response_length: int, enable_think: bool,
                 warn: bool = False, reward: float | None = None) -> str:
    """Host text of the user message of turn `turn` (1-based); `reward` is the previous turn's."""
    fmt = FORMAT_THINK if enable_think else FORMAT_ANSWER
    head = "" if reward is None else f"{REWARD_LABEL}{format_reward(reward)}\n"
    return (f"{head}\nTurn {turn}:\nState:\n{obs}\n{WARNING if warn else ''}You have {actions_left} actions left. "
            f"Always output: {fmt} with no extra text. Strictly follow this format. "
            f"Max response length: {response_length} words (tokens).\n")


def system_content(instruction: str) -> str:
    return SYSTEM_OPENING + instruction


class TurnPrompts:
    """Token pieces of the trajectory prompt and their in-graph concatenation.

    Args:
      tokenizer: encodes each piece once (must round-trip, see `PieceTable`).
      chat_format: a `ragen_jax.models.chat.ChatFormat`.
      instruction: the env's part of the system prompt; max_turn: turns per trajectory;
      max_actions: the trajectory's action budget (numbers 0..max_actions are printed);
      response_length: the length hint of the prompt; enable_think: the format line and the prefill.
    """

    def __init__(self, tokenizer, chat_format: chat_lib.ChatFormat, instruction: str, max_turn: int,
                 max_actions: int, response_length: int, enable_think: bool):
        strip = chat_format.strip_content  # Llama-3 trims every content: no leading/trailing newline then
        fmt = FORMAT_THINK if enable_think else FORMAT_ANSWER
        digits = list("0123456789")
        turn_heads = [f"\nTurn {t}:\nState:\n" for t in range(1, max_turn + 1)]
        first_heads = [h.lstrip() if strip else h for h in turn_heads]
        numbers = [str(k) for k in range(max_actions + 1)]
        tail = (f" actions left. Always output: {fmt} with no extra text. Strictly follow this format. "
                f"Max response length: {response_length} words (tokens).") + ("" if strip else "\n")
        prefill = chat_lib.prefill(enable_think)
        close = chat_format.end_of_turn + chat_format.after_turn
        self._texts = dict(eot=chat_format.end_of_turn, after=chat_format.after_turn, user=chat_format.header("user"),
                           label=REWARD_LABEL, minus="-", dot=".", newline="\n", warning=WARNING,
                           you_have="You have ", tail=tail, open=close + chat_format.generation_prompt(prefill))
        t = self._texts
        # the candidate texts of every slot of `chunk`, in order: they give the pieces and the static capacities
        pre_slots = [[t["eot"]], [t["after"]], [t["user"]], [t["label"]], [t["minus"]], *[digits] * _INT_DIGITS,
                     [t["dot"]], digits, digits, [t["newline"]], turn_heads + first_heads]
        post_slots = [[t["newline"]], [t["warning"]], [t["you_have"]], numbers, [t["tail"]], [t["open"]]]
        self.table = PieceTable(tokenizer, [text for slot in pre_slots + post_slots for text in slot])
        self.pre_capacity = sum(self.table.max_len(slot) for slot in pre_slots)
        self.post_capacity = sum(self.table.max_len(slot) for slot in post_slots)
        self._ids = {name: self.table.index(text) for name, text in t.items()}
        self._digits = jnp.asarray(self.table.indices(digits))
        self._heads = jnp.asarray(self.table.indices(turn_heads))
        self._first = jnp.asarray(self.table.indices(first_heads))
        self._numbers = jnp.asarray(self.table.indices(numbers))
        system = chat_format.render([("system", system_content(instruction))])
        self.system_ids = np.asarray(tokenizer.encode(system) if system else [], np.int32)
        self.prefill_ids = np.asarray(tokenizer.encode(prefill), np.int32)
        self.close_ids = np.asarray(tokenizer.encode(close), np.int32)

    def chunk_capacity(self, obs_capacity: int) -> int:
        """Static token capacity of a turn chunk around observations of `obs_capacity` tokens."""
        return self.pre_capacity + obs_capacity + self.post_capacity

    def _reward_pieces(self, reward: jax.Array) -> jax.Array:
        """i32[1 + _INT_DIGITS + 3] pieces of `format_reward(reward)`."""
        cents = jnp.round(jnp.abs(reward) * 100.0).astype(jnp.int32)
        whole, frac = cents // 100, cents % 100
        powers = 10 ** jnp.arange(_INT_DIGITS - 1, -1, -1)
        digits = (whole // powers) % 10
        shown = (powers <= whole) | (powers == 1)  # no leading zeros, at least one digit
        d1, d2 = frac // 10, frac % 10
        return jnp.concatenate([
            jnp.where((reward < 0) & (cents > 0), self._ids["minus"], 0)[None],
            jnp.where(shown, self._digits[digits], 0),
            jnp.where(frac > 0, self._ids["dot"], 0)[None],
            jnp.where(frac > 0, self._digits[d1], 0)[None],
            jnp.where(d2 > 0, self._digits[d2], 0)[None],
        ]).astype(jnp.int32)

    def chunk(self, turn: jax.Array, obs_tokens: jax.Array, obs_len: jax.Array, actions_left: jax.Array,
              prev_reward: jax.Array, prev_stopped: jax.Array, warn: jax.Array, capacity: int):
        """The tokens between the previous response and the next one, for one trajectory.

        turn: i32[] 0-based; obs_tokens i32[O] / obs_len i32[]: the env observation; actions_left i32[];
        prev_reward f32[] and prev_stopped bool[] (the previous response ended with the end-of-turn token),
        both ignored at turn 0; warn bool[]: the previous turn had no valid action.
        Returns (tokens i32[capacity], length i32[]). Turn 0's chunk starts at the user turn: the system
        prefix (`system_ids`) comes before it.
        """
        first = turn == 0
        i = self._ids
        later = lambda piece: jnp.where(first, 0, piece)  # noqa: E731
        pre = jnp.concatenate([
            jnp.stack([later(jnp.where(prev_stopped, 0, i["eot"])), later(i["after"]), jnp.int32(i["user"]),
                       later(i["label"])]),
            jnp.where(first, 0, self._reward_pieces(prev_reward)),
            jnp.stack([later(i["newline"]), jnp.where(first, self._first[turn], self._heads[turn])]),
        ]).astype(jnp.int32)
        post = jnp.stack([i["newline"], jnp.where(warn & ~first, i["warning"], 0), i["you_have"],
                          self._numbers[jnp.clip(actions_left, 0, self._numbers.shape[0] - 1)], i["tail"],
                          i["open"]]).astype(jnp.int32)
        a = self.table.render(pre, self.pre_capacity)
        c = self.table.render(post, self.post_capacity)
        return concat_tokens([(a.tokens, a.length), (obs_tokens, obs_len), (c.tokens, c.length)], capacity,
                             self.table.pad_id)

    def closing(self, stopped: jax.Array) -> tuple[jax.Array, jax.Array]:
        """(tokens i32[len(close_ids)], length): what closes the last response (end of turn unless sampled)."""
        ids = jnp.asarray(self.close_ids)
        skip = jnp.where(stopped, 1, 0)
        n = ids.shape[0]
        return jnp.where(jnp.arange(n) + skip < n, ids[jnp.minimum(jnp.arange(n) + skip, n - 1)], 0), n - skip


def place(buffer: jax.Array, start: jax.Array, values: jax.Array, length: jax.Array) -> jax.Array:
    """buffer[start + k] = values[k] for k < length (buffer [L], values [N]); the rest of buffer unchanged."""
    rel = jnp.arange(buffer.shape[0]) - start
    inside = (rel >= 0) & (rel < length)
    return jnp.where(inside, values[jnp.clip(rel, 0, values.shape[0] - 1)], buffer)


def concat_tokens(parts, capacity: int, pad_id: int) -> tuple[jax.Array, jax.Array]:
    """Concatenate variable-length token arrays [(tokens i32[n_k], length i32[]), ...] into i32[capacity]."""
    out = jnp.full((capacity,), pad_id, jnp.int32)
    start = jnp.int32(0)
    for tokens, length in parts:
        out = place(out, start, tokens, length)
        start = start + length
    return out, jnp.minimum(start, capacity).astype(jnp.int32)

"""In-graph response parsing (spec A.5), tokenizer-agnostic.

Response token ids are mapped to their exact bytes through a table built once from
`tokenizer.token_bytes` and concatenated into a fixed-capacity byte buffer (`concat_rows`). On that
buffer, with fixed shapes only, we reproduce RAGEN's `_parse_response`:

* think mode: the first match of `<think>(.*?)</think>\\s*<answer>(.*?)</answer>` (DOTALL); no-think
  mode: `<answer>(.*?)</answer>`. Tags are case-sensitive; no match => nothing parsed.
* the special strings `<think> </think> <answer> </answer> <|im_start|> <|im_end|>` are removed from the
  answer (all occurrences found in the answer at once; RAGEN's sequential `str.replace` differs only
  when removing one string creates another), then the answer is split on `||` (non-overlapping, left
  to right, like `str.split`), each part is stripped of whitespace and empty parts are dropped;
* at most `max_actions` parts are kept; each is compared case-insensitively with the action words
  (ASCII case folding and ASCII whitespace; RAGEN uses Python's Unicode `lower`/`strip`).

Bytes past `max_bytes` of a response are cut off (a match must lie inside the buffer); nothing here
can fail on any input.
"""
from __future__ import annotations

from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from environments.pieces import FlatRows, Tokenizer, concat_rows

SPECIAL_STRINGS = ("<think>", "</think>", "<answer>", "</answer>", "<|im_start|>", "<|im_end|>")
_WHITESPACE = np.array([ord(c) for c in " \t\n\r\x0b\x0c"], np.uint8)


@struct.dataclass
class ParsedResponse:
    """What the parser found in one response.

    found: bool[] a think/answer match exists.
    answer_bytes: u8[N] the answer with special strings removed (not yet split), `answer_len` i32[] long.
    part_start, part_end: i32[M] byte span [start, end) in `answer_bytes` of the first M non-empty
      stripped `||`-parts; `num_parts` i32[] = how many there are (<= M, the truncated count).
    action_ids: i32[M] index of the matching action word per part, -1 unknown or past `num_parts`
      (all -1 when the env has no action words).
    think_tokens, answer_tokens: i32[2] token span [start, end) of the reasoning and answer contents
      within the response tokens (token containing the first byte .. token after the one containing the
      last byte; [0, 0) when not found). Used for per-turn reasoning/answer spans.
    """

    found: jnp.ndarray
    answer_bytes: jnp.ndarray
    answer_len: jnp.ndarray
    part_start: jnp.ndarray
    part_end: jnp.ndarray
    num_parts: jnp.ndarray
    action_ids: jnp.ndarray
    think_tokens: jnp.ndarray
    answer_tokens: jnp.ndarray


def _pattern_table(patterns: tuple[str, ...]) -> tuple[np.ndarray, np.ndarray]:
    """(u8[K, L] zero-padded pattern bytes, i32[K] lengths)."""
    encoded = [p.encode("utf-8") for p in patterns]
    table = np.zeros((len(encoded), max(1, *(len(p) for p in encoded))), np.uint8)
    for i, p in enumerate(encoded):
        table[i, : len(p)] = np.frombuffer(p, np.uint8)
    return table, np.array([len(p) for p in encoded], np.int32)


_SPECIAL_TABLE, _SPECIAL_LENS = _pattern_table(SPECIAL_STRINGS)
_THINK, _THINK_END, _ANSWER, _ANSWER_END = range(4)  # columns of SPECIAL_STRINGS


def _find_all(buf: jnp.ndarray, length: jnp.ndarray) -> jnp.ndarray:
    """bool[N, K]: special string k starts at position p and lies inside buf[:length]."""
    n, width = buf.shape[0], _SPECIAL_TABLE.shape[1]
    padded = jnp.concatenate([buf, jnp.zeros((width,), buf.dtype)])
    windows = jnp.stack([padded[o : o + n] for o in range(width)], axis=1)  # [N, L]
    beyond = np.arange(width)[None, :] >= _SPECIAL_LENS[:, None]  # [K, L] padding of short patterns
    equal = (windows[:, None, :] == _SPECIAL_TABLE[None]) | beyond[None]
    return equal.all(-1) & (jnp.arange(n)[:, None] + _SPECIAL_LENS[None, :] <= length)


def _first(mask: jnp.ndarray) -> jnp.ndarray:
    """Index of the first True, or len(mask) when none."""
    return jnp.where(mask.any(), jnp.argmax(mask), mask.shape[0]).astype(jnp.int32)


def _is_ws(buf: jnp.ndarray) -> jnp.ndarray:
    return (buf[:, None] == jnp.asarray(_WHITESPACE)[None, :]).any(-1)


def _lower(buf: jnp.ndarray) -> jnp.ndarray:
    upper = (buf >= ord("A")) & (buf <= ord("Z"))
    return jnp.where(upper, buf + 32, buf)


class ResponseParser:
    """Parses response token ids into a `ParsedResponse` (see the module docstring).

    Args:
      tokenizer: provides `vocab_size` and `token_bytes` (the byte table is built once here).
      action_words: the env's action names (matched case-insensitively), or () for free-text answers.
      max_actions: M, the number of `||`-parts kept (max_actions_per_turn).
      enable_think: parse `<think>..</think><answer>..</answer>` (True) or `<answer>..</answer>` alone.
      max_bytes_per_token: the byte buffer holds `R * min(this, longest token)` bytes for R tokens.
    """

    def __init__(
        self,
        tokenizer: Tokenizer,
        action_words: Sequence[str],
        max_actions: int,
        enable_think: bool = True,
        max_bytes_per_token: int = 8,
    ):
        if max_actions < 1:
            raise ValueError(f"max_actions must be >= 1, got {max_actions}")
        byte_rows = [tokenizer.token_bytes(i) for i in range(tokenizer.vocab_size)]
        self.bytes = FlatRows.from_lists(byte_rows, np.uint8)
        self.bytes_per_token = max(1, min(max_bytes_per_token, max(len(b) for b in byte_rows)))
        self.max_actions = max_actions
        self.enable_think = enable_think
        self.action_words = tuple(action_words)
        table, lens = _pattern_table(tuple(w.lower() for w in self.action_words) or ("",))
        self._word_bytes, self._word_lens = jnp.asarray(table), jnp.asarray(lens if self.action_words else [-1])

    def __call__(self, tokens: jnp.ndarray, length: jnp.ndarray) -> ParsedResponse:
        """tokens: i32[R] response token ids (only the first `length` i32[] count)."""
        r = tokens.shape[0]
        vocab = self.bytes.lengths.shape[0]
        counted = (jnp.arange(r) < length) & (tokens >= 0) & (tokens < vocab)
        ids = jnp.clip(tokens, 0, vocab - 1)
        per_token = FlatRows(
            values=self.bytes.values,
            offsets=self.bytes.offsets[ids],
            lengths=jnp.where(counted, self.bytes.lengths[ids], 0),
        )
        buf, n_bytes, source = concat_rows(per_token, jnp.arange(r, dtype=jnp.int32), r * self.bytes_per_token, 0)
        hits = _find_all(buf, n_bytes)
        found, (t0, t1), (a0, a1) = self._spans(hits, buf, n_bytes)
        answer, answer_len = self._clean_answer(hits, buf, a0, a1, found)
        part_start, part_end, num_parts = self._parts(answer, answer_len)
        action_ids = self._match_words(answer, part_start, part_end, num_parts)

        def token_span(b0, b1):
            # source[b] is the token of byte b; end = token after the one holding byte b1 - 1
            start = source[jnp.clip(b0, 0, buf.shape[0] - 1)]
            end = source[jnp.clip(b1 - 1, 0, buf.shape[0] - 1)] + 1
            ok = found & (b1 > b0)
            return jnp.where(ok, jnp.stack([start, end]), jnp.zeros((2,), jnp.int32)).astype(jnp.int32)

        return ParsedResponse(
            found=found,
            answer_bytes=answer,
            answer_len=answer_len,
            part_start=part_start,
            part_end=part_end,
            num_parts=num_parts,
            action_ids=action_ids,
            think_tokens=token_span(t0, t1),
            answer_tokens=token_span(a0, a1),
        )

    def _spans(self, hits, buf, n):
        """(found, think content [t0, t1), answer content [a0, a1)) as byte positions."""
        size = buf.shape[0]
        pos = jnp.arange(size)
        open_answer, close_answer = hits[:, _ANSWER], hits[:, _ANSWER_END]
        if self.enable_think:
            t0 = _first(hits[:, _THINK]) + len("<think>")
            # first non-whitespace position at or after each index (size when none)
            nonws = ~_is_ws(buf) | (pos >= n)
            next_nonws = jax.lax.cummin(jnp.where(nonws, pos, size), axis=0, reverse=True)
            answer_at = next_nonws[jnp.clip(pos + len("</think>"), 0, size - 1)]
            link = hits[:, _THINK_END] & (pos >= t0) & open_answer[jnp.clip(answer_at, 0, size - 1)]
            link &= (pos + len("</think>") < size) & (answer_at < size)
            t1 = _first(link)
            a0 = answer_at[jnp.clip(t1, 0, size - 1)] + len("<answer>")
            found = t1 < size
        else:
            t0 = t1 = jnp.int32(0)
            a0 = _first(open_answer) + len("<answer>")
            found = a0 < size
        a1 = _first(close_answer & (pos >= a0))
        found &= a1 < size
        return found, (t0, t1), (a0, a1)

    def _clean_answer(self, hits, buf, a0, a1, found):
        """Compact buf[a0:a1] without the special strings to the front: (u8[N], length i32[])."""
        size = buf.shape[0]
        pos = jnp.arange(size)
        inside = hits & (pos[:, None] >= a0) & (pos[:, None] + _SPECIAL_LENS[None, :] <= a1)
        # byte j is covered by string k iff a hit starts in (j - len_k, j]: a difference of prefix counts
        counts = jnp.cumsum(inside, axis=0, dtype=jnp.int32)
        lag = _SPECIAL_TABLE.shape[1]
        padded = jnp.concatenate([jnp.zeros((lag, counts.shape[1]), counts.dtype), counts])
        before = jnp.take_along_axis(padded, pos[:, None] + lag - _SPECIAL_LENS[None, :], axis=0)
        drop = (counts - before > 0).any(-1)
        keep = found & (pos >= a0) & (pos < a1) & ~drop
        target = jnp.where(keep, jnp.cumsum(keep) - 1, size)
        out = jnp.zeros((size,), jnp.uint8).at[target].set(buf, mode="drop")
        return out, keep.sum().astype(jnp.int32)

    def _parts(self, ans, k):
        """Spans of the first M non-empty stripped `||`-parts of ans[:k] and their count (<= M)."""
        size = ans.shape[0]
        pos = jnp.arange(size)
        inside = pos < k
        bar = (ans == ord("|")) & inside
        run_start = jax.lax.cummax(jnp.where(bar, 0, pos + 1), axis=0)
        bar_next = jnp.concatenate([bar[1:], jnp.zeros((1,), bool)])
        sep = bar & bar_next & ((pos - run_start) % 2 == 0)
        in_sep = sep | jnp.concatenate([jnp.zeros((1,), bool), sep[:-1]])
        part = jnp.cumsum(sep) - sep
        content = inside & ~in_sep & ~_is_ws(ans)
        prev_part = jax.lax.cummax(jnp.where(content, part, -1), axis=0)
        prev_part = jnp.concatenate([jnp.full((1,), -1, prev_part.dtype), prev_part[:-1]])
        next_part = jax.lax.cummin(jnp.where(content, part, size + 1), axis=0, reverse=True)
        next_part = jnp.concatenate([next_part[1:], jnp.full((1,), size + 1, next_part.dtype)])
        first = content & (part > prev_part)
        last = content & (part < next_part)
        first_rank = jnp.cumsum(first) - 1
        last_rank = jnp.cumsum(last) - 1
        m = self.max_actions
        ranks = jnp.arange(m)
        starts = jnp.zeros((m,), jnp.int32).at[jnp.where(first, first_rank, m)].set(pos, mode="drop")
        ends = jnp.zeros((m,), jnp.int32).at[jnp.where(last, last_rank, m)].set(pos + 1, mode="drop")
        num = jnp.minimum(first.sum(), m).astype(jnp.int32)
        present = ranks < num
        return jnp.where(present, starts, 0), jnp.where(present, ends, 0), num

    def _match_words(self, ans, starts, ends, num):
        """i32[M] action word index per part (-1 when unknown or absent)."""
        if not self.action_words:
            return jnp.full((self.max_actions,), -1, jnp.int32)
        width = self._word_bytes.shape[1]
        padded = jnp.concatenate([ans, jnp.zeros((width,), ans.dtype)])
        offs = jnp.arange(width)

        def match(start, end):
            seg = _lower(jax.lax.dynamic_slice(padded, (start,), (width,)))
            same = (seg[None, :] == self._word_bytes) | (offs[None, :] >= self._word_lens[:, None])
            hit = same.all(-1) & (self._word_lens == end - start)
            return jnp.where(hit.any(), jnp.argmax(hit), -1).astype(jnp.int32)

        ids = jax.vmap(match)(starts, ends)
        return jnp.where(jnp.arange(self.max_actions) < num, ids, -1)

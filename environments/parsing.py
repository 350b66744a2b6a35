"""In-graph response parsing (docs/prompts_and_parsing.md#response-parsing), tokenizer-agnostic.

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

Fixed capacities: a response keeps its first `R * bytes_per_token` bytes and an answer its first
`max_answer_bytes` bytes (the `</answer>` tag must still lie inside the response buffer). Nothing here
can fail on any input. Substrings are found by comparing packed 4-byte little-endian words, which is
much cheaper on CPU than comparing byte windows.
"""
from __future__ import annotations

from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from environments.pieces import FlatRows, Tokenizer, concat_rows, prefix_max, prefix_sum

SPECIAL_STRINGS = ("<think>", "</think>", "<answer>", "</answer>", "<|im_start|>", "<|im_end|>")
_WHITESPACE = tuple(ord(c) for c in " \t\n\r\x0b\x0c")
_MAX_PATTERN = 12  # longest special string; bounds the word look-ahead


@struct.dataclass
class ParsedResponse:
    """What the parser found in one response.

    found: bool[] a think/answer match exists.
    answer_bytes: u8[A] the answer with special strings removed (not yet split), `answer_len` i32[] long.
    part_start, part_end: i32[M] byte span [start, end) in `answer_bytes` of the first M non-empty
      stripped `||`-parts; `num_parts` i32[] = how many there are (<= M, the truncated count).
    action_ids: i32[M] index of the matching action word per part, -1 unknown or past `num_parts`
      (all -1 when the env has no action words).
    think_tokens, answer_tokens: i32[2] token span [start, end) of the reasoning and answer contents
      within the response tokens (token containing the first byte .. token after the one containing the
      last byte; [0, 0) when not found or empty). Used for per-turn reasoning/answer spans.
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


def _words(buf: jnp.ndarray) -> jnp.ndarray:
    """u32[N + 12]: word p packs bytes p..p+3 little-endian (zero past the end)."""
    n = buf.shape[0]
    b = jnp.concatenate([buf.astype(jnp.uint32), jnp.zeros((_MAX_PATTERN + 4,), jnp.uint32)])
    m = n + _MAX_PATTERN
    return b[:m] | (b[1 : m + 1] << 8) | (b[2 : m + 2] << 16) | (b[3 : m + 3] << 24)


def _find(words: jnp.ndarray, length: jnp.ndarray, pattern: str) -> jnp.ndarray:
    """bool[N]: `pattern` starts at p and ends inside the first `length` bytes."""
    data = pattern.encode("utf-8")
    n = words.shape[0] - _MAX_PATTERN
    hit = jnp.arange(n) + len(data) <= length
    for j in range(0, len(data), 4):
        chunk = data[j : j + 4]
        mask = (1 << (8 * len(chunk))) - 1
        value = int.from_bytes(chunk, "little")
        hit &= (words[j : j + n] & jnp.uint32(mask)) == jnp.uint32(value)
    return hit


def _first(mask: jnp.ndarray) -> jnp.ndarray:
    """Index of the first True, or len(mask) when none."""
    return jnp.where(mask.any(), jnp.argmax(mask), mask.shape[0]).astype(jnp.int32)


def _is_ws(buf: jnp.ndarray) -> jnp.ndarray:
    out = buf == _WHITESPACE[0]
    for c in _WHITESPACE[1:]:
        out |= buf == c
    return out


def _shift(x: jnp.ndarray, k: int, fill) -> jnp.ndarray:
    """x moved k places towards the end (k > 0) or the front (k < 0), `fill` entering."""
    pad = jnp.full((abs(k),), fill, x.dtype)
    return jnp.concatenate([pad, x[:-k]]) if k > 0 else jnp.concatenate([x[-k:], pad])


class ResponseParser:
    """Parses response token ids into a `ParsedResponse` (see the module docstring).

    Args:
      tokenizer: provides `vocab_size` and `token_bytes` (the byte table is built once here).
      action_words: the env's action names (matched case-insensitively), or () for free-text answers.
      max_actions: M, the number of `||`-parts kept (max_actions_per_turn).
      enable_think: parse `<think>..</think><answer>..</answer>` (True) or `<answer>..</answer>` alone.
      bytes_per_token: the byte buffer holds `R * min(this, longest token)` bytes for R tokens.
      max_answer_bytes: A, the answer buffer size (answers are short: actions, an expression, a number;
        only their first A bytes count).
    """

    def __init__(
        self,
        tokenizer: Tokenizer,
        action_words: Sequence[str],
        max_actions: int,
        enable_think: bool = True,
        bytes_per_token: int = 8,
        max_answer_bytes: int = 64,
    ):
        if max_actions < 1 or max_answer_bytes < 1:
            raise ValueError(f"max_actions and max_answer_bytes must be >= 1, got {max_actions}, {max_answer_bytes}")
        byte_rows = [tokenizer.token_bytes(i) for i in range(tokenizer.vocab_size)]
        self.bytes = FlatRows.from_lists(byte_rows, np.uint8)
        self.bytes_per_token = max(1, min(bytes_per_token, max(len(b) for b in byte_rows)))
        self.max_answer_bytes = max_answer_bytes
        self.max_actions = max_actions
        self.enable_think = enable_think
        self.action_words = tuple(action_words)
        encoded = [w.lower().encode("utf-8") for w in self.action_words]
        width = max([1, *map(len, encoded)])
        table = np.zeros((max(1, len(encoded)), width), np.uint8)
        for i, w in enumerate(encoded):
            table[i, : len(w)] = np.frombuffer(w, np.uint8)
        self._word_bytes = jnp.asarray(table)
        self._word_lens = jnp.asarray([len(w) for w in encoded] or [-1], jnp.int32)

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
        found, (t0, t1), (a0, a1) = self._spans(buf, n_bytes)
        answer, answer_len = self._clean_answer(buf, a0, a1, found)
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

    def _spans(self, buf, n):
        """(found, think content [t0, t1), answer content [a0, a1)) as byte positions."""
        size = buf.shape[0]
        pos = jnp.arange(size)
        words = _words(buf)
        open_answer = _find(words, n, "<answer>")
        if self.enable_think:
            t0 = _first(_find(words, n, "<think>")) + len("<think>")
            # `</think>\s*<answer>`: the last non-whitespace byte before each <answer> ends a </think>
            nonws = ~_is_ws(buf)
            last_nonws = prefix_max(jnp.where(nonws, pos, -1))
            before = _shift(last_nonws, 1, -1)  # last non-whitespace strictly before p
            close_think = _find(words, n, "</think>")
            ends_close = _shift(close_think, len("</think>") - 1, False)  # True at the last byte of a </think>
            close_at = before - (len("</think>") - 1)
            linked = open_answer & (before >= 0) & ends_close[jnp.clip(before, 0, size - 1)] & (close_at >= t0)
            answer_open = _first(linked)
            t1 = before[jnp.clip(answer_open, 0, size - 1)] - (len("</think>") - 1)
            found = answer_open < size
        else:
            t0 = t1 = jnp.int32(0)
            answer_open = _first(open_answer)
            found = answer_open < size
        a0 = answer_open + len("<answer>")
        a1 = _first(_find(words, n, "</answer>") & (pos >= a0))
        found &= a1 < size
        return found, (t0, t1), (a0, a1)

    def _clean_answer(self, buf, a0, a1, found):
        """The first A bytes of buf[a0:a1] without the special strings, at the front: (u8[A], length)."""
        size = min(self.max_answer_bytes, buf.shape[0])
        window = jax.lax.dynamic_slice(jnp.concatenate([buf, jnp.zeros((size,), buf.dtype)]), (a0,), (size,))
        length = jnp.where(found, jnp.clip(a1 - a0, 0, size), 0)
        words = _words(window)
        # +1 where a special string starts, -1 right after it ends; covered bytes have a positive prefix sum
        marks = jnp.zeros((size,), jnp.int32)
        for s in SPECIAL_STRINGS:
            hit = _find(words, length, s).astype(jnp.int32)
            marks += hit - _shift(hit, len(s), 0)
        keep = (jnp.arange(size) < length) & (prefix_sum(marks) == 0)
        target = jnp.where(keep, prefix_sum(keep.astype(jnp.int32)) - 1, size)
        out = jnp.zeros((size,), jnp.uint8).at[target].set(window, mode="drop")
        return out, keep.sum().astype(jnp.int32)

    def _parts(self, ans, k):
        """Spans of the first M non-empty stripped `||`-parts of ans[:k] and their count (<= M).

        One pass finds the separators (a run of n bars holds n // 2 of them, left to right, like
        `str.split`); then M rounds each take the first content byte after a cursor, the next separator
        after it and the last content byte before that separator.
        """
        size = ans.shape[0]
        pos = jnp.arange(size)
        inside = pos < k
        bar = (ans == ord("|")) & inside
        run_start = prefix_max(jnp.where(bar, 0, pos + 1))
        sep = bar & _shift(bar, -1, False) & ((pos - run_start) % 2 == 0)
        content = inside & ~(sep | _shift(sep, 1, False)) & ~_is_ws(ans)
        starts, ends = [], []
        cursor = jnp.int32(0)
        for _ in range(self.max_actions):
            start = _first(content & (pos >= cursor))
            boundary = _first(sep & (pos > start))  # size when the part runs to the end
            end = jnp.max(jnp.where(content & (pos < boundary), pos, -1)) + 1
            starts.append(start)
            ends.append(end)
            cursor = boundary + 2
        starts, ends = jnp.stack(starts), jnp.stack(ends)
        present = starts < size
        num = present.sum().astype(jnp.int32)
        return jnp.where(present, starts, 0), jnp.where(present, ends, 0), num

    def _match_words(self, ans, starts, ends, num):
        """i32[M] action word index per part (-1 when unknown or absent)."""
        if not self.action_words:
            return jnp.full((self.max_actions,), -1, jnp.int32)
        width = self._word_bytes.shape[1]
        padded = jnp.concatenate([ans, jnp.zeros((width,), ans.dtype)])
        offs = jnp.arange(width)

        def match(start, end):
            seg = jax.lax.dynamic_slice(padded, (start,), (width,))
            seg = jnp.where((seg >= ord("A")) & (seg <= ord("Z")), seg + 32, seg)
            same = (seg[None, :] == self._word_bytes) | (offs[None, :] >= self._word_lens[:, None])
            hit = same.all(-1) & (self._word_lens == end - start)
            return jnp.where(hit.any(), jnp.argmax(hit), -1).astype(jnp.int32)

        ids = jax.vmap(match)(starts, ends)
        return jnp.where(jnp.arange(self.max_actions) < num, ids, -1)

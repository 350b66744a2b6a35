"""Text pieces tokenized once, and in-graph concatenation of variable-length rows.

An environment lists every text fragment its observations can contain (fixed sentences, grid symbols,
numbers, coordinates, names). `PieceTable` tokenizes each piece ONCE at construction with whatever
tokenizer the run uses and stores the ids flat. Rendering a state is then pure array work: the env
chooses a fixed-length vector of piece indices (index 0 is always the empty piece, used as padding)
and `PieceTable.render` concatenates their token ids into a fixed-capacity array.

Decoding the rendered ids gives exactly the concatenated piece texts because decoding is a
concatenation of per-token bytes (`Tokenizer.token_bytes`); the constructor checks this for every
piece and fails early, naming the piece, for a tokenizer where it does not hold (e.g. one that adds a
BOS token to every `encode`).

`concat_rows` is the shared kernel: it also flattens response tokens into bytes in `parsing.py`.
"""
from __future__ import annotations

from typing import Protocol, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct


class Tokenizer(Protocol):
    """What environments need from a tokenizer (`ragen_jax.models.tokenizer.Tokenizer` provides it)."""

    vocab_size: int
    pad_id: int

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: Sequence[int]) -> str: ...

    def token_bytes(self, i: int) -> bytes: ...


@struct.dataclass
class Observation:
    """A rendered observation: `tokens` i32[capacity] (pad after `length`), `length` i32[]."""

    tokens: jnp.ndarray
    length: jnp.ndarray


@struct.dataclass
class FlatRows:
    """Variable-length rows stored flat: row r is `values[offsets[r] : offsets[r] + lengths[r]]`.

    values: [total] (int32 token ids or uint8 bytes); offsets, lengths: i32[num_rows].
    """

    values: jnp.ndarray
    offsets: jnp.ndarray
    lengths: jnp.ndarray

    @classmethod
    def from_lists(cls, rows: Sequence[Sequence[int]], dtype) -> "FlatRows":
        lengths = np.array([len(r) for r in rows], np.int32)
        offsets = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int32)
        flat = np.fromiter((v for r in rows for v in r), dtype=dtype, count=int(lengths.sum()))
        if flat.size == 0:  # keep gathers well-defined when every row is empty
            flat = np.zeros((1,), dtype)
        return cls(values=jnp.asarray(flat), offsets=jnp.asarray(offsets), lengths=jnp.asarray(lengths))


def prefix_sum(x: jnp.ndarray) -> jnp.ndarray:
    """Inclusive prefix sum over the last axis (an associative scan: several times faster on CPU than
    `jnp.cumsum`, which lowers to a reduce-window)."""
    return jax.lax.associative_scan(jnp.add, x, axis=-1)


def prefix_max(x: jnp.ndarray, reverse: bool = False) -> jnp.ndarray:
    """Inclusive running maximum over the last axis (from the end when `reverse`)."""
    return jax.lax.associative_scan(jnp.maximum, x, reverse=reverse, axis=-1)


def concat_rows(rows: FlatRows, row_ids: jnp.ndarray, capacity: int, fill) -> tuple[jnp.ndarray, jnp.ndarray, jnp.ndarray]:
    """Concatenate `rows[row_ids[0]] + rows[row_ids[1]] + ...` into a fixed-capacity array.

    Args:
      rows: the table; row_ids: i32[S] (rows may repeat; zero-length rows contribute nothing).
      capacity: static output size; anything beyond it is cut off.
      fill: value written after the end.
    Returns:
      out [capacity] (dtype of rows.values), length i32[] (= min(total, capacity)),
      source i32[capacity]: for each output position, the index s in [0, S) of the row it came from
      (S for positions past the end), used to map byte positions back to token positions.
    """
    lengths = rows.lengths[row_ids]
    ends = prefix_sum(lengths)
    starts = ends - lengths
    total = ends[-1]
    num_slots = row_ids.shape[0]
    pos = jnp.arange(capacity, dtype=jnp.int32)
    # the row holding each position: at the start of every non-empty row add the slot-index step from the
    # previous non-empty row, then a prefix sum (much cheaper than a binary search per position)
    slots = jnp.arange(num_slots, dtype=jnp.int32)
    nonempty = lengths > 0
    previous = jnp.concatenate([jnp.full((1,), -1, jnp.int32), prefix_max(jnp.where(nonempty, slots, -1))[:-1]])
    marks = jnp.zeros((capacity + 1,), jnp.int32).at[jnp.where(nonempty, starts, capacity)].add(
        jnp.where(nonempty, slots - previous, 0), mode="drop"
    )
    slot = jnp.clip(prefix_sum(marks[:capacity]) - 1, 0, num_slots - 1)
    inside = pos < total
    flat_index = rows.offsets[row_ids[slot]] + pos - starts[slot]
    values = rows.values[jnp.clip(flat_index, 0, rows.values.shape[0] - 1)]
    out = jnp.where(inside, values, jnp.asarray(fill, rows.values.dtype))
    return out, jnp.minimum(total, capacity).astype(jnp.int32), jnp.where(inside, slot, num_slots)


class PieceTable:
    """Pieces of text tokenized once; `render` concatenates chosen pieces in-graph.

    `pieces` are deduplicated; index 0 is always the empty string (padding). `index(text)` gives a
    piece's index for building index arrays at construction time.
    """

    def __init__(self, tokenizer: Tokenizer, pieces: Sequence[str]):
        self.texts: tuple[str, ...] = tuple(dict.fromkeys(["", *pieces]))
        self._index = {t: i for i, t in enumerate(self.texts)}
        self.pad_id = int(tokenizer.pad_id)
        token_lists = []
        for text in self.texts:
            ids = list(tokenizer.encode(text)) if text else []
            got = b"".join(tokenizer.token_bytes(i) for i in ids)
            if got != text.encode("utf-8") or tokenizer.decode(ids) != text:
                raise ValueError(
                    f"piece {text!r} does not round-trip through the tokenizer (token bytes {got!r}); "
                    "environments need encode() without added special tokens and byte-exact decoding"
                )
            token_lists.append(ids)
        self.rows = FlatRows.from_lists(token_lists, np.int32)
        self.lengths = np.array([len(t) for t in token_lists], np.int32)

    def __len__(self) -> int:
        return len(self.texts)

    def index(self, text: str) -> int:
        """The index of piece `text` (it must have been listed at construction)."""
        try:
            return self._index[text]
        except KeyError:
            raise KeyError(f"{text!r} is not in this piece table") from None

    def indices(self, texts: Sequence[str]) -> np.ndarray:
        """i32[len(texts)] piece indices, e.g. a lookup table from a state value to a piece."""
        return np.array([self.index(t) for t in texts], np.int32)

    def max_len(self, texts: Sequence[str] | None = None) -> int:
        """The most tokens any of `texts` (default: every piece) takes, for static capacity bounds."""
        if texts is None:
            return int(self.lengths.max())
        return max((int(self.lengths[self.index(t)]) for t in texts), default=0)

    def token_len(self, text: str) -> int:
        return int(self.lengths[self.index(text)])

    def render(self, piece_ids: jnp.ndarray, capacity: int) -> Observation:
        """Concatenate pieces `piece_ids` i32[S] into an Observation of static `capacity` tokens."""
        tokens, length, _ = concat_rows(self.rows, piece_ids, capacity, self.pad_id)
        return Observation(tokens=tokens, length=length)

    def text(self, piece_ids) -> str:
        """Host-side text of the same concatenation (`piece_ids`: any int sequence or array)."""
        return "".join(self.texts[int(i)] for i in np.asarray(piece_ids).reshape(-1))

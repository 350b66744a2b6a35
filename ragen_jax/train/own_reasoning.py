"""The policy's own reasoning for warm-start demonstrations (`train.sft_reasoning = "own"`).

A pretrained model that reasons in its own words but never closes `</think>` or answers in the format needs only the
closing taught. `OwnReasoning` samples the base model's continuation of each demonstration prompt (the exact
context the rollout gives it, ending with the `<think>` prefill), keeps a prefix of a random number of tokens cut back
to a word boundary and before anything that looks like a tag, and returns that text; `Demonstrator` appends the env's
answer in the format and puts the loss only on that closing (`</think><answer>...</answer>` and the end of turn). So
the warm start changes where the model stops and how it answers, not what it writes before.

    own = OwnReasoning(rollout, params, tokenizer, temperature=1.0, top_p=1.0)
    texts = own(key, context i32[B, W], context_len i32[B], active bool[B], rng)   # list of B strings
"""
from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np

from ragen_jax.rollout import sampler

# a tag opening or closing (`<think>`, `</answer`, `<|im_end|>`): the reasoning ends before the first one
_TAG = re.compile(r"<\s*/?\s*[A-Za-z|]")


def cut_reasoning(text: str) -> str:
    """`text` up to its first tag, else back to the end of its last whole word (or "" when no word is whole), with
    surrounding whitespace trimmed."""
    tag = _TAG.search(text)
    if tag:
        text = text[:tag.start()]
    elif text and not text[-1].isspace():  # a cut text may end inside a word: drop that word
        words = text.rsplit(None, 1)
        text = words[0] if len(words) == 2 else ""
    return text.strip()


class OwnReasoning:
    """Samples reasoning from fixed `params` of `rollout.model` (see the module docstring).

    Args:
      rollout: the `Rollout` whose model, end-of-turn stop sequences, top-k and response length (the most tokens
        sampled per row) are used;
      params: the weights whose reasoning is kept (the warm start's initial ones);
      tokenizer: decodes the samples; temperature, top_p: the sampling settings (the rollout's).
    """

    def __init__(self, rollout, params, tokenizer, *, temperature: float, top_p: float):
        self.rollout, self.params, self.tokenizer = rollout, params, tokenizer
        self.temperature, self.top_p = float(temperature), float(top_p)
        self.max_tokens = rollout.response_length

    def sample(self, key: jax.Array, context: np.ndarray, context_len: np.ndarray,
               active: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(tokens i32[B, max_tokens], lengths i32[B]): each active row's continuation of its right-padded context
        i32[B, W] (context_len real tokens), from an empty cache of W positions (a row stops where it is full);
        inactive rows get length 0."""
        B, W = context.shape
        ro = self.rollout
        out, _ = sampler.generate(
            ro.model, self.params, ro.model.init_cache(B, W), jnp.asarray(context, jnp.int32),
            jnp.asarray(context_len, jnp.int32), key, jnp.float32(self.temperature), jnp.float32(self.top_p),
            ro.stop_sequences, jnp.asarray(active), max_new_tokens=self.max_tokens, top_k=ro.top_k, pad_id=ro.pad_id,
            num_tokens=ro.num_tokens)
        return np.asarray(out.tokens), np.asarray(out.lengths)

    def __call__(self, key: jax.Array, context: np.ndarray, context_len: np.ndarray, active: np.ndarray,
                 rng: np.random.Generator) -> list[str]:
        """The kept reasoning text of each row ("" for inactive rows): a prefix of 1..max_tokens sampled tokens
        (uniform), passed through `cut_reasoning`."""
        tokens, lengths = self.sample(key, context, context_len, active)
        keep = rng.integers(1, self.max_tokens + 1, size=len(lengths))
        return [cut_reasoning(self.tokenizer.decode(tokens[b, :min(keep[b], lengths[b])].tolist()))
                if active[b] else "" for b in range(len(lengths))]

"""Chat formats implemented in the project: ChatML (Qwen), Llama-3 headers, and the built-in plain format.

A :class:`ChatFormat` renders ``(role, content)`` messages to the text a model sees, the generation
prompt that opens the assistant turn (optionally followed by the ``<think>`` / ``<answer>`` prefill of
docs/prompts_and_parsing.md), the end-of-turn string and the stop sequences of generation. The rendered text equals what
``transformers``' ``apply_chat_template`` produces with the models' own templates (Qwen2 / Qwen2.5
without tools, Llama-3 and Llama-3.1 without tools); tests check this against transformers.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Iterable

from ragen_jax.config import CHAT_FORMATS
from ragen_jax.models import tokenizer as tok_lib

QWEN2_DEFAULT_SYSTEM = "You are a helpful assistant."
QWEN25_DEFAULT_SYSTEM = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."
LLAMA31_SYSTEM_PREFIX = "Cutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\n"
ROLES = ("system", "user", "assistant")


@dataclasses.dataclass(frozen=True)
class ChatFormat:
    """How messages become text.

    A turn is ``header(role) + content + end_of_turn + after_turn``; the whole text starts with ``begin``.

    Attributes:
      name: one of :data:`ragen_jax.config.CHAT_FORMATS`.
      begin: text before the first turn (Llama-3: ``<|begin_of_text|>``).
      headers: ``(role, text opening that role's turn)`` pairs.
      end_of_turn: the string that closes a turn (the tokenizer's ``eos_id`` token).
      after_turn: text after ``end_of_turn`` (ChatML: a newline).
      default_system: system content inserted when the first message is not a system message
        (``None``: insert nothing).
      system_prefix: text put before the system content (Llama-3.1's knowledge-date preamble).
      strip_content: strip whitespace around every content (Llama-3 templates apply ``| trim``).
      extra_stops: end-of-text strings that also end generation.
      markers: the special-token strings the format needs as single tokens of the tokenizer.
    """

    name: str
    begin: str
    headers: tuple[tuple[str, str], ...]
    end_of_turn: str
    after_turn: str = ""
    default_system: str | None = None
    system_prefix: str = ""
    strip_content: bool = False
    extra_stops: tuple[str, ...] = ()
    markers: tuple[str, ...] = ()

    @property
    def stop_sequences(self) -> tuple[str, ...]:
        """Strings that end a generated assistant turn (end-of-turn first)."""
        return (self.end_of_turn, *self.extra_stops)

    def turn(self, role: str, content: str) -> str:
        """One complete turn of ``role``."""
        return self._wrap(role, self._content(content))

    def _content(self, content: str) -> str:
        return content.strip() if self.strip_content else content

    def header(self, role: str) -> str:
        """Text opening a turn of ``role``."""
        for name, text in self.headers:
            if name == role:
                return text
        raise ValueError(f"chat format {self.name!r} has no role {role!r}; roles: {[r for r, _ in self.headers]}")

    def _wrap(self, role: str, text: str) -> str:
        return self.header(role) + text + self.end_of_turn + self.after_turn

    def generation_prompt(self, prefill: str = "") -> str:
        """Text opening the assistant turn, then ``prefill`` (e.g. :func:`prefill`, docs/prompts_and_parsing.md)."""
        return self.header("assistant") + prefill

    def render(self, messages: Iterable[tuple[str, str]], add_generation_prompt: bool = False,
               prefill: str = "") -> str:
        """Renders ``(role, content)`` messages; with ``add_generation_prompt`` opens the assistant turn.

        Equals ``apply_chat_template(messages, tokenize=False, add_generation_prompt=...)`` of the
        model's template, followed by ``prefill``.
        """
        messages = list(messages)
        if prefill and not add_generation_prompt:
            raise ValueError("prefill needs add_generation_prompt=True (it continues the assistant turn)")
        if self.default_system is not None and (not messages or messages[0][0] != "system"):
            messages.insert(0, ("system", self.default_system))
        turns = [self.turn(role, content) for role, content in messages]
        if self.system_prefix and messages and messages[0][0] == "system":
            turns[0] = self._wrap("system", self.system_prefix + self._content(messages[0][1]))
        text = self.begin + "".join(turns)
        return text + self.generation_prompt(prefill) if add_generation_prompt else text

    def check_tokenizer(self, tokenizer: tok_lib.Tokenizer) -> None:
        """Raises naming the first marker of this format that is not a single token of ``tokenizer``."""
        for marker in self.markers:
            tokenizer.token_id(marker)  # KeyError naming the marker
        if tokenizer.eos_id != tokenizer.token_id(self.end_of_turn):
            raise ValueError(f"tokenizer eos_id {tokenizer.eos_id} is not the id of chat format {self.name!r}'s "
                             f"end of turn {self.end_of_turn!r} ({tokenizer.token_id(self.end_of_turn)})")


def chatml(default_system: str | None = QWEN25_DEFAULT_SYSTEM) -> ChatFormat:
    """Qwen's ChatML: ``<|im_start|>role\\n…<|im_end|>\\n``; Qwen2 uses :data:`QWEN2_DEFAULT_SYSTEM`."""
    return ChatFormat(name="chatml", begin="", headers=tuple((r, f"<|im_start|>{r}\n") for r in ROLES),
                      end_of_turn="<|im_end|>", after_turn="\n", default_system=default_system,
                      extra_stops=("<|endoftext|>",), markers=("<|im_start|>", "<|im_end|>"))


def llama3(system_prefix: str = "") -> ChatFormat:
    """Llama-3 headers: ``<|begin_of_text|>`` then ``<|start_header_id|>role<|end_header_id|>\\n\\n…<|eot_id|>``.

    Llama-3.1/3.2 templates always open with a system turn starting with :data:`LLAMA31_SYSTEM_PREFIX`:
    pass it as ``system_prefix`` (a system turn is then inserted when the messages have none).
    """
    return ChatFormat(name="llama3", begin="<|begin_of_text|>",
                      headers=tuple((r, f"<|start_header_id|>{r}<|end_header_id|>\n\n") for r in ROLES),
                      end_of_turn="<|eot_id|>", default_system="" if system_prefix else None,
                      system_prefix=system_prefix, strip_content=True, extra_stops=("<|end_of_text|>",),
                      markers=("<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"))


def plain() -> ChatFormat:
    """The built-in vocabulary's format: a role marker token, the content, ``<|end|>``."""
    return ChatFormat(name="plain", begin="",
                      headers=(("system", tok_lib.SYSTEM), ("user", tok_lib.USER), ("assistant", tok_lib.ASSISTANT)),
                      end_of_turn=tok_lib.END, markers=(tok_lib.SYSTEM, tok_lib.USER, tok_lib.ASSISTANT, tok_lib.END))


FORMATS = {"plain": plain, "chatml": chatml, "llama3": llama3}  # keys: ragen_jax.config.CHAT_FORMATS


def get(name: str) -> ChatFormat:
    """The chat format named ``name`` (config ``tokenizer.chat_format``) with its default options."""
    if name not in FORMATS:
        raise ValueError(f"unknown chat format {name!r}; allowed: {CHAT_FORMATS}")
    return FORMATS[name]()


def prefill(enable_think: bool) -> str:
    """The text appended after the generation prompt (docs/prompts_and_parsing.md): ``<think>``, or ``<answer>`` without
    thinking."""
    return tok_lib.THINK_OPEN if enable_think else tok_lib.ANSWER_OPEN


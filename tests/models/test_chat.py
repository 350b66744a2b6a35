"""Chat formats: rendered text equals transformers' apply_chat_template with the models' templates."""
import pytest
import tokenizers
import transformers
from tokenizers import models, pre_tokenizers

from ragen_jax.config import CHAT_FORMATS
from ragen_jax.models import chat
from ragen_jax.models import tokenizer as tok_lib

# Templates as shipped in the models' tokenizer_config.json (tool-calling branches removed).
QWEN2_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n' }}{% endif %}"
    "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")
QWEN25_TEMPLATE = (
    "{%- if messages[0]['role'] == 'system' %}{{- '<|im_start|>system\n' + messages[0]['content'] + '<|im_end|>\n' }}"
    "{%- else %}{{- '<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant."
    "<|im_end|>\n' }}{%- endif %}"
    "{%- for message in messages %}{%- if (message.role == 'user') or (message.role == 'system' and not loop.first)"
    " or (message.role == 'assistant') %}"
    "{{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>' + '\n' }}{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\n' }}{%- endif %}")
LLAMA3_TEMPLATE = (
    "{% set loop_messages = messages %}{% for message in loop_messages %}"
    "{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim"
    " + '<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}{{ content }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}")
LLAMA31_TEMPLATE = (
    "{{- bos_token }}{%- if not date_string is defined %}{%- set date_string = '26 Jul 2024' %}{%- endif %}"
    "{%- if messages[0]['role'] == 'system' %}{%- set system_message = messages[0]['content']|trim %}"
    "{%- set messages = messages[1:] %}{%- else %}{%- set system_message = '' %}{%- endif %}"
    "{{- '<|start_header_id|>system<|end_header_id|>\n\n' }}{{- 'Cutting Knowledge Date: December 2023\n' }}"
    "{{- 'Today Date: ' + date_string + '\n\n' }}{{- system_message }}{{- '<|eot_id|>' }}"
    "{%- for message in messages %}"
    "{{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + '<|eot_id|>' }}"
    "{%- endfor %}{%- if add_generation_prompt %}{{- '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{%- endif %}")
# The built-in format written as a template, an independent statement of "marker + content + <|end|>".
PLAIN_TEMPLATE = ("{% for m in messages %}{{ '<|' + m['role'] + '|>' + m['content'] + '<|end|>' }}{% endfor %}"
                  "{% if add_generation_prompt %}{{ '<|assistant|>' }}{% endif %}")

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|begin_of_text|>", "<|end_of_text|>",
            "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]
CONVERSATIONS = [
    [("system", "You're a helpful assistant. Push the box."), ("user", "\nTurn 1:\nState:\n#_P#\n")],
    [("user", "  Target: 24, nums: [3, 8]  ")],
    [("system", " sys \n"), ("user", "hi"), ("assistant", "<think> I move Up </think><answer>Up</answer>"),
     ("user", "Reward:\n-0.1\n\nTurn 2:\nState:\n#P_#\n")],
]
CASES = [(chat.chatml(chat.QWEN2_DEFAULT_SYSTEM), QWEN2_TEMPLATE), (chat.chatml(), QWEN25_TEMPLATE),
         (chat.llama3(), LLAMA3_TEMPLATE), (chat.llama3(chat.LLAMA31_SYSTEM_PREFIX), LLAMA31_TEMPLATE),
         (chat.plain(), PLAIN_TEMPLATE)]


@pytest.fixture(scope="module")
def hf_tokenizer():
    """A transformers tokenizer built in the test (no downloads) to run apply_chat_template."""
    backend = tokenizers.Tokenizer(models.WordLevel({"[UNK]": 0}, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    backend.add_special_tokens(SPECIALS)
    return transformers.PreTrainedTokenizerFast(tokenizer_object=backend, bos_token="<|begin_of_text|>",
                                                eos_token="<|eot_id|>")


@pytest.mark.parametrize("fmt,template", CASES, ids=lambda c: getattr(c, "name", None))
@pytest.mark.parametrize("add_generation_prompt", [False, True])
def test_render_matches_apply_chat_template(hf_tokenizer, fmt, template, add_generation_prompt):
    for conversation in CONVERSATIONS:
        messages = [{"role": r, "content": c} for r, c in conversation]
        expect = hf_tokenizer.apply_chat_template(messages, chat_template=template, tokenize=False,
                                                  add_generation_prompt=add_generation_prompt)
        assert fmt.render(conversation, add_generation_prompt=add_generation_prompt) == expect
        if add_generation_prompt:  # docs/prompts_and_parsing.md: the prefill string is appended to the rendered prompt
            assert fmt.render(conversation, True, prefill=chat.prefill(True)) == expect + "<think>"
            assert fmt.render(conversation, True, prefill=chat.prefill(False)) == expect + "<answer>"


def test_turn_pieces_compose_to_render():
    """The rollout appends turns one by one; their concatenation is the rendered dialogue."""
    conversation = [("system", "S"), ("user", " U "), ("assistant", "A")]
    for fmt in [f for f, _ in CASES if not f.system_prefix]:
        pieces = fmt.begin + "".join(fmt.turn(r, c) for r, c in conversation) + fmt.generation_prompt("<think>")
        assert fmt.render(conversation, True, prefill="<think>") == pieces
        assert fmt.stop_sequences[0] == fmt.end_of_turn


def test_plain_format_on_builtin_tokenizer():
    tok, fmt = tok_lib.builtin(), chat.get("plain")
    fmt.check_tokenizer(tok)
    text = fmt.render([("system", "Push the box."), ("user", "Turn 1:")], True, prefill=chat.prefill(True))
    ids = tok.encode(text)
    assert ids[0] == tok.token_id("<|system|>") and tok.eos_id in ids
    assert ids[-2:] == [tok.token_id("<|assistant|>"), tok.token_id("<think>")]
    assert [tok.encode(s) for s in fmt.stop_sequences] == [[tok.eos_id]]


def test_chatml_and_llama3_markers_on_hf_tokenizer(tmp_path):
    backend = tokenizers.Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.add_special_tokens(SPECIALS)
    backend.save(str(tmp_path / "tokenizer.json"))
    qwen = tok_lib.load(str(tmp_path))  # <|im_end|> is found first: the ChatML end of turn
    chat.chatml().check_tokenizer(qwen)
    assert [qwen.encode(s) for s in chat.chatml().stop_sequences] == [[qwen.token_id(s)] for s in
                                                                      ("<|im_end|>", "<|endoftext|>")]
    llama = tok_lib.load(str(tmp_path), eos_token="<|eot_id|>")
    chat.llama3().check_tokenizer(llama)
    with pytest.raises(ValueError, match="end of turn '<\\|eot_id\\|>'"):
        chat.llama3().check_tokenizer(qwen)


def test_errors_name_the_problem():
    assert tuple(chat.FORMATS) == CHAT_FORMATS
    with pytest.raises(ValueError, match="'vicuna'"):
        chat.get("vicuna")
    with pytest.raises(ValueError, match="'tool'"):
        chat.chatml().render([("tool", "x")])
    with pytest.raises(KeyError, match="<\\|im_start\\|>"):
        chat.chatml().check_tokenizer(tok_lib.builtin())
    with pytest.raises(ValueError, match="prefill"):
        chat.plain().render([("user", "x")], prefill="<think>")

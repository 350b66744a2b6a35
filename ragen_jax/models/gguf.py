"""GGUF import (llama.cpp's single-file format) for llama and qwen2 models, read with the `gguf` package and no torch.

    model = load_gguf("SmolLM2-135M-Instruct.Q4_1.gguf")   # a transformer.Model with float32 params

The metadata (`<arch>.block_count`, `<arch>.embedding_length`, ...) becomes the HF `config.json` dict that
`hf.config_from_hf` reads, so both formats share one set of checks. Tensors are dequantised to float32 by the
package's own routines (F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1 and the K-quants it implements), renamed to
the HF names (`blk.3.attn_q.weight` -> `model.layers.3.self_attn.q_proj.weight`) and filled into the parameter tree
by `hf.fill_params`, one leaf at a time. llama.cpp's converter interleaves the rows of a llama model's q and k
projections for its rotary layout; `unpermute` undoes that (qwen2 files are stored unpermuted). A tied LM head is a
file without `output.weight`.

`tokenizer(file)` rebuilds the file's byte-level BPE tokenizer (`tokenizer.ggml.model` "gpt2": its tokens, merges
and control tokens, with the pre-tokenizer `tokenizer.ggml.pre` names) as a `tokenizers` tokenizer behind
`models.tokenizer.HFTokenizer`. `chat_format(file)` recognises the file's Jinja `tokenizer.chat_template` as one of
`models.chat`'s formats (ChatML, with the system message the template inserts when a conversation has none).
`read_gguf` keeps the last files it read (keyed by path, size and modification time): a run reads one file for
its tokenizer, its shapes and its weights.

A bad file raises `hf.CheckpointError` naming the file and the key or tensor: not a readable GGUF (e.g. truncated),
an unsupported architecture, a missing metadata key, a missing, unexpected or wrong-shaped tensor, a quantisation
type the package cannot dequantise.
"""
from __future__ import annotations

import dataclasses
import functools
import os
import re
from typing import Any

import numpy as np

from ragen_jax.errors import reraised
from ragen_jax.models import chat as chat_lib
from ragen_jax.models import hf
from ragen_jax.models import tokenizer as tok_lib
from ragen_jax.models.config import ModelConfig
from ragen_jax.models.transformer import Model

SUFFIX = ".gguf"  # `model.pretrained_path` names a GGUF file by this ending
ARCHITECTURES = {"llama": hf.LLAMA, "qwen2": hf.QWEN2}
# GGUF tensor name -> HF name; per-layer names carry the layer index
_GLOBAL = {"token_embd.weight": "model.embed_tokens.weight", "output_norm.weight": "model.norm.weight",
           "output.weight": "lm_head.weight"}
_LAYER = {"attn_norm.weight": "input_layernorm.weight", "attn_q.weight": "self_attn.q_proj.weight",
          "attn_k.weight": "self_attn.k_proj.weight", "attn_v.weight": "self_attn.v_proj.weight",
          "attn_q.bias": "self_attn.q_proj.bias", "attn_k.bias": "self_attn.k_proj.bias",
          "attn_v.bias": "self_attn.v_proj.bias", "attn_output.weight": "self_attn.o_proj.weight",
          "ffn_norm.weight": "post_attention_layernorm.weight", "ffn_gate.weight": "mlp.gate_proj.weight",
          "ffn_up.weight": "mlp.up_proj.weight", "ffn_down.weight": "mlp.down_proj.weight"}
CONTROL = 3  # tokenizer.ggml.token_type of a special (control) token
# tokenizer.ggml.pre -> whether digits are split one by one before the GPT-2 byte-level split (llama.cpp's "smollm"
# pre-tokenizer is GPT-2's with single digits)
PRE_TOKENIZERS = {"gpt-2": False, "smollm": True}
_LAYER_NAME = re.compile(r"blk\.(\d+)\.(.+)")
# HF config key -> (GGUF key under "<arch>.", required)
_SIZES = {"hidden_size": ("embedding_length", True), "intermediate_size": ("feed_forward_length", True),
          "num_hidden_layers": ("block_count", True), "num_attention_heads": ("attention.head_count", True),
          "num_key_value_heads": ("attention.head_count_kv", False), "head_dim": ("attention.key_length", False),
          "max_position_embeddings": ("context_length", False), "rope_theta": ("rope.freq_base", False),
          "rms_norm_eps": ("attention.layer_norm_rms_epsilon", False)}


@dataclasses.dataclass
class GGUFFile:
    """What `read_gguf` found: the HF-style config and ModelConfig, the HF name -> GGUF tensor of every tensor,
    and the metadata as Python values (token lists included)."""

    path: str
    config: ModelConfig
    hf_config: dict
    tensors: dict[str, Any]
    metadata: dict[str, Any]


def unpermute(weight: np.ndarray, heads: int) -> np.ndarray:
    """Undo llama.cpp's q/k row order: within each of `heads` heads, its converter interleaves the two rotary halves
    of rows [out, in]; this puts them back as HF stores them."""
    half = weight.shape[0] // heads // 2
    return weight.reshape(heads, half, 2, *weight.shape[1:]).swapaxes(1, 2).reshape(weight.shape)


def _metadata(reader, path: str) -> dict[str, Any]:
    values = {}
    for key, field in reader.fields.items():
        with reraised(hf.CheckpointError, f"{path}: metadata key {key!r} is unreadable", ValueError, IndexError):
            values[key] = field.contents()
    return values


def _required(metadata: dict[str, Any], key: str, path: str) -> Any:
    if key not in metadata:
        raise hf.CheckpointError(f"{path}: metadata key {key!r} is missing")
    return metadata[key]


def _hf_name(name: str) -> str | None:
    if name in _GLOBAL:
        return _GLOBAL[name]
    match = _LAYER_NAME.fullmatch(name)
    if match and match.group(2) in _LAYER:
        return f"model.layers.{match.group(1)}.{_LAYER[match.group(2)]}"
    return None


def hf_config(metadata: dict[str, Any], tied: bool, path: str) -> dict:
    """The HF `config.json` dict of GGUF `metadata` (`tied`: the file has no `output.weight`)."""
    arch = metadata.get("general.architecture")
    if arch not in ARCHITECTURES:
        raise hf.CheckpointError(f"{path}: general.architecture = {arch!r} is not supported: use one of "
                                 f"{tuple(ARCHITECTURES)}")
    config = {"architectures": [ARCHITECTURES[arch]], "model_type": arch, "tie_word_embeddings": tied}
    for key, (gguf_key, required) in _SIZES.items():
        full = f"{arch}.{gguf_key}"
        if full in metadata or required:
            config[key] = _required(metadata, full, path)
    tokens = metadata.get("tokenizer.ggml.tokens")
    vocab = metadata.get(f"{arch}.vocab_size", len(tokens) if tokens is not None else None)
    if vocab is None:
        raise hf.CheckpointError(f"{path}: neither {arch}.vocab_size nor tokenizer.ggml.tokens gives the vocabulary")
    config["vocab_size"] = vocab
    for key in ("rope_theta", "rms_norm_eps"):
        if key in config:
            config[key] = float(config[key])
    return config


def read_gguf(path: str, compute_dtype: str = "float32") -> GGUFFile:
    """Reads the metadata and the tensor index of GGUF file `path` (no tensor dequantised) and checks them: names,
    shapes and the config."""
    with reraised(hf.CheckpointError, f"{path} is not a readable file", OSError):
        stat = os.stat(path)
    return _read(path, stat.st_size, stat.st_mtime_ns, compute_dtype)


@functools.lru_cache(maxsize=4)
def _read(path: str, size: int, mtime_ns: int, compute_dtype: str) -> GGUFFile:
    import gguf

    with reraised(hf.CheckpointError, f"{path} is not a readable GGUF file (truncated or corrupt?)",
                  ValueError, OSError, IndexError):
        reader = gguf.GGUFReader(path)
    metadata = _metadata(reader, path)
    by_name, unknown = {}, []
    for tensor in reader.tensors:
        name = _hf_name(tensor.name)
        if name is None:
            unknown.append(tensor.name)
        else:
            by_name[name] = tensor
    if unknown:
        raise hf.CheckpointError(f"{path}: unexpected tensor {unknown[0]!r} ({len(unknown)} unexpected)")
    hf_dict = hf_config(metadata, "lm_head.weight" not in by_name, path)
    try:
        config = hf.config_from_hf(hf_dict, compute_dtype)[0]
    except hf.CheckpointError as error:
        raise hf.CheckpointError(f"{path}: {error}") from None
    expected = hf.tensor_map(config)
    missing = [n for n in expected if n not in by_name]
    extra = [n for n in by_name if n not in expected]
    if missing or extra:
        name, what = (missing[0], "missing") if missing else (extra[0], "unexpected")
        raise hf.CheckpointError(f"{path}: {what} tensor {name!r} (GGUF names, e.g. blk.N.attn_q.weight, map to "
                                 "HF names)")
    shapes = hf.param_shapes(config)
    for name, (leaf, layer, transposed) in expected.items():
        want = hf.hf_shape(shapes[leaf], layer, transposed)
        got = tuple(int(d) for d in reversed(by_name[name].shape))  # GGUF lists dimensions innermost first
        if got != want:
            raise hf.CheckpointError(f"{path}: tensor {by_name[name].name!r} has shape {got}, expected {want}")
    return GGUFFile(path, config, hf_dict, by_name, metadata)


def dequantised(file: GGUFFile, name: str) -> np.ndarray:
    """HF tensor `name` of `file` as float32 in HF layout (q and k rows of a llama file unpermuted)."""
    import gguf

    tensor = file.tensors[name]
    with reraised(hf.CheckpointError, f"{file.path}: tensor {tensor.name!r} has quantisation type "
                  f"{tensor.tensor_type.name}, which the gguf package cannot dequantise", NotImplementedError):
        values = gguf.quants.dequantize(tensor.data, tensor.tensor_type)
    values = np.asarray(values, np.float32).reshape(tuple(int(d) for d in reversed(tensor.shape)))
    if file.hf_config["model_type"] == "llama" and name.endswith(("q_proj.weight", "k_proj.weight")):
        c = file.config
        values = unpermute(values, c.num_heads if name.endswith("q_proj.weight") else c.num_kv_heads)
    return values


def load_gguf(path: str, compute_dtype: str = "float32", shardings: Any = None) -> Model:
    """A `transformer.Model` (float32 params) from GGUF file `path`; `shardings` as in `hf.load_pretrained`."""
    file = read_gguf(path, compute_dtype)
    params = hf.fill_params(hf.tensor_map(file.config), hf.param_shapes(file.config),
                            lambda name: (dequantised(file, name), path), shardings)
    return Model(file.config, params)


def file_tokenizer(path: str) -> tok_lib.HFTokenizer:
    """The tokenizer of GGUF file `path` (config `tokenizer.kind = "gguf"`)."""
    return tokenizer(read_gguf(path))


def chat_format(file: GGUFFile) -> chat_lib.ChatFormat:
    """The chat format of the file's `tokenizer.chat_template`: ChatML (`<|im_start|>role\\n...<|im_end|>\\n`)
    with the system text the template inserts before a conversation that has none (`None` if it inserts none);
    CheckpointError naming the file and key for a missing template or one of another format."""
    template = _required(file.metadata, "tokenizer.chat_template", file.path)
    if "<|im_start|>" not in template or "<|im_end|>" not in template:
        raise hf.CheckpointError(f"{file.path}: tokenizer.chat_template is not a ChatML template (no <|im_start|> and "
                                 "<|im_end|>): set tokenizer.chat_format to the model's format")
    default = _CHATML_DEFAULT_SYSTEM.search(template)
    return chat_lib.chatml(default_system=default.group(1) if default else None)


# a ChatML template's literal system turn (inserted when the first message is not a system message); the newline
# is a character or a Jinja escape
_CHATML_DEFAULT_SYSTEM = re.compile(r"'<\|im_start\|>system(?:\n|\\n)([^'{}]*)<\|im_end\|>")


def tokenizer(file: GGUFFile) -> tok_lib.HFTokenizer:
    """The file's tokenizer: byte-level BPE over `tokenizer.ggml.tokens` and `.merges`, its control tokens special,
    end of turn and padding from `tokenizer.ggml.eos_token_id` / `.padding_token_id`."""
    import tokenizers
    from tokenizers import decoders, models, pre_tokenizers

    meta, path = file.metadata, file.path
    kind, pre = meta.get("tokenizer.ggml.model"), meta.get("tokenizer.ggml.pre", "gpt-2")
    if kind != "gpt2":
        raise hf.CheckpointError(f"{path}: tokenizer.ggml.model = {kind!r} is not supported: use 'gpt2' "
                                 "(byte-level BPE)")
    if pre not in PRE_TOKENIZERS:
        raise hf.CheckpointError(f"{path}: tokenizer.ggml.pre = {pre!r} is not supported: use one of "
                                 f"{tuple(PRE_TOKENIZERS)}")
    tokens, types = (_required(meta, f"tokenizer.ggml.{k}", path) for k in ("tokens", "token_type"))
    merges = [tuple(m.split(" ", 1)) for m in _required(meta, "tokenizer.ggml.merges", path)]
    bpe = tokenizers.Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=merges))
    split = [pre_tokenizers.Digits(individual_digits=True)] if PRE_TOKENIZERS[pre] else []
    bpe.pre_tokenizer = pre_tokenizers.Sequence([*split, pre_tokenizers.ByteLevel(add_prefix_space=False)])
    bpe.decoder = decoders.ByteLevel()
    bpe.add_special_tokens([tokenizers.AddedToken(t, special=True, normalized=False)
                            for t, kind in zip(tokens, types) if kind == CONTROL])
    eos_id = _required(meta, "tokenizer.ggml.eos_token_id", path)
    eos, pad = tokens[eos_id], tokens[meta.get("tokenizer.ggml.padding_token_id", eos_id)]
    return tok_lib.HFTokenizer(bpe, eos_token=eos, pad_token=pad, source=path)

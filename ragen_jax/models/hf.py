"""HF checkpoint import / export: ``config.json`` + safetensors for Qwen2/Qwen2.5 and Llama-3 models.

``load_pretrained(path)`` maps every tensor by name onto the stacked parameter tree of
``ragen_jax.models.transformer`` (torch ``Linear.weight`` is ``[out, in]``, our kernels are ``[in, out]``:
transposed on the way in and out; per-layer tensors fill slot ``i`` of the ``[num_layers, ...]`` leaves).

Host memory: the loader builds the tree one leaf at a time. For a leaf it allocates one float32 buffer,
reads the tensors that fill it one by one with ``safetensors.safe_open`` (a bfloat16 tensor is converted
to float32 straight into the buffer), and passes the buffer to ``jax.device_put``: on the CPU backend's
default device the array aliases the 64-byte aligned buffer (no copy); on an accelerator, or to a given
sharding, it is transferred and the buffer dropped. So the host never holds more than the weights once,
plus one read tensor (and, off the CPU default device, one leaf in transit).

Supported: ``Qwen2ForCausalLM`` (q/k/v bias) and ``LlamaForCausalLM`` without attention/MLP bias; RoPE
theta under ``rope_theta`` (transformers 4) or ``rope_parameters`` (transformers 5), RoPE types
``default`` and ``llama3``; tied or untied LM head; float32, bfloat16, float16 or float64 tensors. Anything else
raises naming the unsupported value.

A bad folder raises :class:`CheckpointError` (a ``ragen_jax.errors.UserInputError``) naming the file, and the
tensor or key: a missing or malformed ``config.json``, an unsupported setting, no weights file, an index naming a
missing shard, a truncated or corrupt safetensors file, a missing, unexpected, wrong-shaped, non-float or
non-finite tensor. :func:`check_pretrained` runs every check but the last without reading the weights.
"""
from __future__ import annotations

import contextlib
import functools
import json
import os
from collections.abc import Callable, Iterator
from typing import Any

import jax
import numpy as np
import safetensors
import safetensors.numpy

from ragen_jax.errors import UserInputError, read_json, reraised
from ragen_jax.models.config import Llama3RopeScaling, ModelConfig
from ragen_jax.models.transformer import Model, init_params

QWEN2, LLAMA = "Qwen2ForCausalLM", "LlamaForCausalLM"
SUPPORTED_ARCHITECTURES = (QWEN2, LLAMA)
_MODEL_TYPES = {QWEN2: "qwen2", LLAMA: "llama"}
CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
FLOAT_DTYPES = ("F32", "BF16", "F16", "F64")  # safetensors dtype names the loader casts to float32
# config.json keys holding a positive int: required, then optional.
_SIZE_KEYS = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads")
_OPTIONAL_SIZE_KEYS = ("num_key_value_heads", "head_dim", "max_position_embeddings")
_LLAMA3_ROPE_KEYS = ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")
# Per-layer HF tensor "model.layers.{i}.<name>" -> (our "layers" leaf, whether it is a transposed Linear weight).
_LAYER_TENSORS = {
    "input_layernorm.weight": (("input_norm", "scale"), False),
    "self_attn.q_proj.weight": (("q_proj", "kernel"), True),
    "self_attn.q_proj.bias": (("q_proj", "bias"), False),
    "self_attn.k_proj.weight": (("k_proj", "kernel"), True),
    "self_attn.k_proj.bias": (("k_proj", "bias"), False),
    "self_attn.v_proj.weight": (("v_proj", "kernel"), True),
    "self_attn.v_proj.bias": (("v_proj", "bias"), False),
    "self_attn.o_proj.weight": (("o_proj", "kernel"), True),
    "post_attention_layernorm.weight": (("post_attn_norm", "scale"), False),
    "mlp.gate_proj.weight": (("gate_proj", "kernel"), True),
    "mlp.up_proj.weight": (("up_proj", "kernel"), True),
    "mlp.down_proj.weight": (("down_proj", "kernel"), True),
}
_GLOBAL_TENSORS = {
    "model.embed_tokens.weight": (("embed", "embedding"), False),
    "model.norm.weight": (("final_norm", "scale"), False),
    "lm_head.weight": (("lm_head", "kernel"), True),
}


class CheckpointError(UserInputError):
    """A model folder that cannot be loaded: the message names the file, and the tensor or config key."""


# ------------------------------------------------------------------------------------------------ config
def _architecture(hf: dict) -> str:
    architectures = hf.get("architectures") or []
    by_type = {t: a for a, t in _MODEL_TYPES.items()}
    name = architectures[0] if architectures else by_type.get(hf.get("model_type"), hf.get("model_type"))
    if name not in SUPPORTED_ARCHITECTURES:
        raise CheckpointError(f"unsupported architecture {name!r} (model_type {hf.get('model_type')!r}); "
                              f"supported: {SUPPORTED_ARCHITECTURES}")
    return name


def _rope(hf: dict) -> tuple[float, Llama3RopeScaling | None]:
    """(theta, scaling) from transformers 5's ``rope_parameters`` or transformers 4's ``rope_theta``/``rope_scaling``."""
    params = hf.get("rope_parameters")
    scaling = params if params is not None else hf.get("rope_scaling") or {}
    if not isinstance(scaling, dict):
        raise CheckpointError(f"RoPE settings {scaling!r} are not a JSON object")
    theta = scaling.get("rope_theta", hf.get("rope_theta")) if params is not None else hf.get("rope_theta")
    theta = _number("rope_theta", 10000.0 if theta is None else theta)  # None: the HF default of both architectures
    rope_type = scaling.get("rope_type", scaling.get("type", "default"))
    if rope_type == "default":
        return theta, None
    if rope_type != "llama3":
        raise CheckpointError(f"unsupported RoPE type {rope_type!r} (supported: 'default', 'llama3')")
    missing = [k for k in _LLAMA3_ROPE_KEYS if k not in scaling]
    if missing:
        raise CheckpointError(f"llama3 RoPE scaling lacks {missing}")
    factor, low, high, positions = (_number(k, scaling[k]) for k in _LLAMA3_ROPE_KEYS)
    return theta, Llama3RopeScaling(factor=factor, low_freq_factor=low, high_freq_factor=high,
                                    original_max_position_embeddings=int(positions))


def _number(key: str, value: Any) -> float:
    """`value` of config.json key `key` as a float; CheckpointError naming the key when it is not a number."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise CheckpointError(f"{key} = {value!r} is not a number")
    return float(value)


def config_from_hf(hf: dict, compute_dtype: str = "float32") -> tuple[ModelConfig, str]:
    """(ModelConfig, architecture) of a HF ``config.json`` dict; raises naming any unsupported setting."""
    arch = _architecture(hf)
    unsupported = {"hidden_act": hf.get("hidden_act", "silu") != "silu",
                   "attention_bias": arch == LLAMA and bool(hf.get("attention_bias")),
                   "mlp_bias": bool(hf.get("mlp_bias")),
                   "use_sliding_window": bool(hf.get("use_sliding_window")),
                   "layer_types": any(t != "full_attention" for t in hf.get("layer_types") or [])}
    for key, bad in unsupported.items():
        if bad:
            raise CheckpointError(f"unsupported {arch} setting {key} = {hf[key]!r}")
    missing = [k for k in _SIZE_KEYS if k not in hf]
    if missing:
        raise CheckpointError(f"lacks the required keys {missing}")
    for key in (*_SIZE_KEYS, *_OPTIONAL_SIZE_KEYS):
        value = hf.get(key)
        if value is not None and (type(value) is not int or value <= 0):
            raise CheckpointError(f"{key} = {value!r} is not a positive integer")
    heads = hf["num_attention_heads"]
    theta, scaling = _rope(hf)
    with reraised(CheckpointError, "invalid value", ValueError):  # ModelConfig's own checks, e.g. heads dividing
        return ModelConfig(
            vocab_size=hf["vocab_size"], d_model=hf["hidden_size"], num_layers=hf["num_hidden_layers"],
            num_heads=heads, num_kv_heads=hf.get("num_key_value_heads") or heads,
            head_dim=hf.get("head_dim") or hf["hidden_size"] // heads, mlp_dim=hf["intermediate_size"],
            rope_theta=theta, qkv_bias=arch == QWEN2, tie_embeddings=bool(hf.get("tie_word_embeddings", False)),
            norm_eps=_number("rms_norm_eps", hf.get("rms_norm_eps", 1e-6)),
            max_seq_len=hf.get("max_position_embeddings", 32768 if arch == QWEN2 else 2048),
            compute_dtype=compute_dtype, rope_scaling=scaling), arch


def config_to_hf(config: ModelConfig, architecture: str | None = None) -> dict:
    """The HF ``config.json`` dict of ``config`` (transformers 4 RoPE layout, which transformers 5 also reads).

    architecture: default Qwen2 when ``config.qkv_bias`` else Llama; HF Qwen2 always has q/k/v bias and HF
    Llama never has it alone, so a mismatch is an error.
    """
    architecture = architecture or (QWEN2 if config.qkv_bias else LLAMA)
    if architecture not in SUPPORTED_ARCHITECTURES:
        raise CheckpointError(f"unsupported architecture {architecture!r}; supported: {SUPPORTED_ARCHITECTURES}")
    if config.qkv_bias != (architecture == QWEN2):
        raise CheckpointError(f"architecture {architecture!r} cannot hold qkv_bias={config.qkv_bias}")
    hf = {"architectures": [architecture], "model_type": _MODEL_TYPES[architecture],
          "vocab_size": config.vocab_size, "hidden_size": config.d_model, "intermediate_size": config.mlp_dim,
          "num_hidden_layers": config.num_layers, "num_attention_heads": config.num_heads,
          "num_key_value_heads": config.num_kv_heads, "head_dim": config.head_dim, "hidden_act": "silu",
          "max_position_embeddings": config.max_seq_len, "rms_norm_eps": config.norm_eps,
          "rope_theta": config.rope_theta, "tie_word_embeddings": config.tie_embeddings, "torch_dtype": "float32"}
    s = config.rope_scaling
    if s is not None:
        hf["rope_scaling"] = {"rope_type": "llama3", "factor": s.factor, "low_freq_factor": s.low_freq_factor,
                              "high_freq_factor": s.high_freq_factor,
                              "original_max_position_embeddings": s.original_max_position_embeddings}
    if architecture == LLAMA:
        hf.update(attention_bias=False, mlp_bias=False)
    else:
        hf.update(use_sliding_window=False)
    return hf


# ------------------------------------------------------------------------------------------------ name map
def tensor_map(config: ModelConfig) -> dict[str, tuple[tuple[str, ...], int | None, bool]]:
    """HF tensor name -> (param leaf path, layer index or None, transposed) for every tensor of ``config``."""
    names = {}
    for name, (leaf, transposed) in _GLOBAL_TENSORS.items():
        if leaf[0] != "lm_head" or not config.tie_embeddings:
            names[name] = (leaf, None, transposed)
    for i in range(config.num_layers):
        for name, (leaf, transposed) in _LAYER_TENSORS.items():
            if config.qkv_bias or not name.endswith(".bias"):
                names[f"model.layers.{i}.{name}"] = (("layers", *leaf), i, transposed)
    return names


def param_shapes(config: ModelConfig) -> dict[tuple[str, ...], tuple[int, ...]]:
    """Param leaf path -> shape of `config`'s parameter tree (nothing allocated)."""
    shapes = jax.eval_shape(functools.partial(init_params, config), jax.random.key(0))
    return {tuple(k.key for k in path): leaf.shape for path, leaf in jax.tree_util.tree_leaves_with_path(shapes)}


def hf_shape(leaf_shape: tuple[int, ...], layer: int | None, transposed: bool) -> tuple[int, ...]:
    shape = leaf_shape[1:] if layer is not None else leaf_shape
    return shape[::-1] if transposed else shape


# ------------------------------------------------------------------------------------------------ loading
def _shard_files(path: str) -> tuple[str, list[str]]:
    """(the file listing the tensors: model.safetensors or the index, the safetensors files to open)."""
    single, index = os.path.join(path, WEIGHTS_FILE), os.path.join(path, INDEX_FILE)
    if os.path.isfile(single):
        return single, [single]
    if not os.path.isfile(index):
        raise CheckpointError(f"no {WEIGHTS_FILE} or {INDEX_FILE} in model folder {path}")
    stored = read_json(index, CheckpointError)
    weight_map = stored.get("weight_map") if isinstance(stored, dict) else None
    if not isinstance(weight_map, dict) or not all(isinstance(s, str) for s in weight_map.values()):
        raise CheckpointError(f"{index} lacks a weight_map of tensor name -> shard file name")
    for name, shard in weight_map.items():
        if os.path.basename(shard) != shard or not os.path.isfile(os.path.join(path, shard)):
            raise CheckpointError(f"{index} puts tensor {name!r} in shard {shard!r}, which is not a file of {path}")
    return index, [os.path.join(path, s) for s in sorted(set(weight_map.values()))]


def _set_path(tree: dict, path: tuple[str, ...], value: Any) -> None:
    """Sets `tree[path[0]][path[1]]...` = value, creating the dicts on the way."""
    for key in path[:-1]:
        tree = tree.setdefault(key, {})
    tree[path[-1]] = value


def read_config(path: str, compute_dtype: str = "float32") -> ModelConfig:
    """The ModelConfig of checkpoint folder `path`'s ``config.json`` (no weights read)."""
    config_file = os.path.join(path, CONFIG_FILE)
    if not os.path.isfile(config_file):
        raise CheckpointError(f"{config_file} does not exist: a model folder holds a HF {CONFIG_FILE} and safetensors")
    hf = read_json(config_file, CheckpointError)
    if not isinstance(hf, dict):
        raise CheckpointError(f"{config_file} holds a JSON {type(hf).__name__}, not a model config")
    try:
        return config_from_hf(hf, compute_dtype)[0]
    except CheckpointError as error:
        raise CheckpointError(f"{config_file}: {error}") from None


@contextlib.contextmanager
def _checked_folder(path: str, compute_dtype: str) -> Iterator[tuple[ModelConfig, dict, dict, dict]]:
    """(ModelConfig, `tensor_map`, leaf shapes, tensor name -> (file, open safetensors handle)) of a folder whose
    config, tensor names, shapes and dtypes are checked; the files stay open in the block."""
    config = read_config(path, compute_dtype)
    expected = tensor_map(config)
    leaf_shapes = param_shapes(config)
    source, files = _shard_files(path)
    with contextlib.ExitStack() as stack:
        location = {}
        for file in files:
            with reraised(CheckpointError, f"{file} is not a readable safetensors file (truncated or corrupt?)",
                          safetensors.SafetensorError, OSError):
                handle = stack.enter_context(safetensors.safe_open(file, framework="numpy"))
            location.update({name: (file, handle) for name in handle.keys()})
        _check_names(expected, location, config.tie_embeddings, source)
        for name, (leaf, layer, transposed) in expected.items():
            file, handle = location[name]
            tensor = handle.get_slice(name)
            want, got = hf_shape(leaf_shapes[leaf], layer, transposed), tuple(tensor.get_shape())
            if got != want:
                raise CheckpointError(f"tensor {name!r} has shape {got}, expected {want} from {CONFIG_FILE}: {file}")
            if tensor.get_dtype() not in FLOAT_DTYPES:
                raise CheckpointError(f"tensor {name!r} has dtype {tensor.get_dtype()}, expected one of "
                                      f"{FLOAT_DTYPES}: {file}")
        yield config, expected, leaf_shapes, location


def check_pretrained(path: str, compute_dtype: str = "float32") -> ModelConfig:
    """The ModelConfig of checkpoint folder `path` after every check :func:`load_pretrained` makes before reading
    the weights (config, files, tensor names, shapes, dtypes); CheckpointError naming the first bad file or tensor."""
    with _checked_folder(path, compute_dtype) as (config, *_):
        return config


def load_pretrained(path: str, compute_dtype: str = "float32", shardings: Any = None) -> Model:
    """Loads a HF Qwen2 / Llama-3 checkpoint folder into a :class:`Model` (float32 params).

    shardings: optional pytree of ``jax.sharding.Sharding`` matching the params (e.g. FSDP): each leaf is
      transferred straight to its sharding. Default: the default device.
    Raises CheckpointError naming the file and any missing, unexpected, wrong-shaped, non-float or non-finite
    tensor, unsupported setting or missing file.
    """
    with _checked_folder(path, compute_dtype) as (config, expected, leaf_shapes, location):
        def read(name: str) -> tuple[np.ndarray, str]:
            file, handle = location[name]
            return handle.get_tensor(name), file

        return Model(config, fill_params(expected, leaf_shapes, read, shardings))


def fill_params(expected: dict, leaf_shapes: dict, read: Callable[[str], tuple[np.ndarray, str]],
                shardings: Any = None) -> dict:
    """The float32 parameter tree from HF-named tensors: `expected` is a `tensor_map`, `read(name)` gives a tensor in
    HF layout and the file it came from (named by the non-finite error). One leaf is built at a time (module doc)."""
    params: dict = {}
    for leaf, shape in leaf_shapes.items():
        buffer = _aligned_empty(shape)
        for name, (leaf_of_name, layer, transposed) in expected.items():
            if leaf_of_name == leaf:
                tensor, file = read(name)
                target = buffer[layer] if layer is not None else buffer
                target[...] = tensor.T if transposed else tensor  # casts bfloat16/float16 into float32
                if not np.isfinite(target).all():
                    raise CheckpointError(f"tensor {name!r} holds NaN or infinite values: {file}")
        _set_path(params, leaf, _to_device(buffer, _subtree(shardings, leaf)))
        del buffer
    return params


def _check_names(expected: dict, present: dict, tied: bool, source: str) -> None:
    """CheckpointError naming `source` (the weights file or index) and the first missing or unexpected tensor."""
    ignored = {n for n in present if n.endswith("rotary_emb.inv_freq")}  # a derived buffer of old checkpoints
    head, embedding = "lm_head.weight", "model.embed_tokens.weight"
    if tied and head in present and embedding in present:  # some tied checkpoints store the head as a copy
        if not np.array_equal(present[head][1].get_tensor(head), present[embedding][1].get_tensor(embedding)):
            raise CheckpointError(f"tensor {head!r} differs from {embedding!r} although tie_word_embeddings is "
                                  f"true: {source}")
        ignored.add(head)
    missing = sorted(set(expected) - set(present), key=_natural)
    unexpected = sorted(set(present) - set(expected) - ignored, key=_natural)
    if missing:
        raise CheckpointError(f"missing tensor {missing[0]!r} ({len(missing)} missing: {missing[:8]}): {source}")
    if unexpected:
        raise CheckpointError(f"unexpected tensor {unexpected[0]!r} ({len(unexpected)} unexpected: "
                              f"{unexpected[:8]}): {source}")


def _natural(name: str) -> list:
    """Sort key putting "layers.2" before "layers.10"."""
    return [(0, int(p), "") if p.isdigit() else (1, 0, p) for p in name.split(".")]


def _subtree(tree: Any, path: tuple[str, ...]) -> Any:
    for key in path:
        if tree is None:
            return None
        tree = tree[key]
    return tree


def _aligned_empty(shape: tuple[int, ...], alignment: int = 64) -> np.ndarray:
    """An uninitialised float32 array whose data is ``alignment``-byte aligned (what XLA:CPU can alias)."""
    size = int(np.prod(shape)) * 4
    raw = np.empty(size + alignment, np.uint8)
    offset = -raw.ctypes.data % alignment
    return raw[offset:offset + size].view(np.float32).reshape(shape)


def _to_device(buffer: np.ndarray, sharding: Any) -> jax.Array:
    """On the CPU backend's default device the array aliases the aligned buffer (no copy); elsewhere it is
    transferred and the caller drops the buffer."""
    return jax.device_put(buffer, sharding)


# ------------------------------------------------------------------------------------------------ saving
def _host_tensors(config: ModelConfig, params: dict, names: list[str]) -> Iterator[tuple[str, np.ndarray]]:
    mapping = tensor_map(config)
    for name in names:
        leaf, layer, transposed = mapping[name]
        value = np.asarray(_subtree(params, leaf))  # a view on the CPU backend
        value = value[layer] if layer is not None else value
        yield name, np.ascontiguousarray(value.T if transposed else value, dtype=np.float32)


def save_pretrained(model: Model, path: str, architecture: str | None = None,
                    max_shard_size: int | None = None) -> None:
    """Writes ``config.json`` and float32 safetensors with HF names (bit-exact round trip with ``load_pretrained``).

    max_shard_size: bytes per shard; when the weights exceed it they go to ``model-0000k-of-0000n.safetensors``
    files plus ``model.safetensors.index.json`` (one shard is materialised on the host at a time).
    """
    config = model.config
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, CONFIG_FILE), "w", encoding="utf-8") as f:
        json.dump(config_to_hf(config, architecture), f, indent=2)
    leaf_shapes = param_shapes(config)
    sizes = {name: 4 * int(np.prod(hf_shape(leaf_shapes[leaf], layer, t)))
             for name, (leaf, layer, t) in tensor_map(config).items()}
    shards, current, current_size = [], [], 0
    for name, size in sizes.items():
        if current and max_shard_size is not None and current_size + size > max_shard_size:
            shards.append(current)
            current, current_size = [], 0
        current.append(name)
        current_size += size
    shards.append(current)
    metadata = {"format": "pt"}  # what transformers expects of safetensors files
    if len(shards) == 1:
        safetensors.numpy.save_file(dict(_host_tensors(config, model.params, shards[0])),
                                    os.path.join(path, WEIGHTS_FILE), metadata=metadata)
        return
    weight_map = {}
    for k, names in enumerate(shards):
        file = f"model-{k + 1:05d}-of-{len(shards):05d}.safetensors"
        safetensors.numpy.save_file(dict(_host_tensors(config, model.params, names)), os.path.join(path, file),
                                    metadata=metadata)
        weight_map.update({name: file for name in names})
    with open(os.path.join(path, INDEX_FILE), "w", encoding="utf-8") as f:
        json.dump({"metadata": {"total_size": sum(sizes.values())}, "weight_map": weight_map}, f, indent=2)

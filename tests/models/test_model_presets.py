"""Qwen2.5 presets (`model.preset`): the published shapes, their parameter counts, and how they meet explicit sizes.

Nothing the size of a real model is materialised: parameters are built under `jax.eval_shape`.
"""
from __future__ import annotations

import math
import re
import types

import jax
import pytest

from configs import base
from ragen_jax import config as cfg
from ragen_jax.config import ConfigError
from ragen_jax.models import presets, transformer
from ragen_jax.models.tokenizer import builtin
from ragen_jax.train import build

# (hidden, layers, heads, kv heads, MLP width) from the Qwen2.5 config.json files; the model cards' totals and
# non-embedding counts in billions, rounded as the cards print them.
PUBLISHED = {
    "qwen2.5-0.5b": ((896, 24, 14, 2, 4864), 0.49, 0.36),
    "qwen2.5-1.5b": ((1536, 28, 12, 2, 8960), 1.54, 1.31),
    "qwen2.5-3b": ((2048, 36, 16, 2, 11008), 3.09, 2.77),
}
VOCAB = 151936


def formula_count(hidden: int, layers: int, heads: int, kv_heads: int, mlp: int, vocab: int = VOCAB,
                  tied: bool = True) -> int:
    """Qwen2 parameters: embedding (+ untied head) + per layer q/k/v with bias, o, gate/up/down, 2 norms + final norm."""
    head_dim = hidden // heads
    q, kv = heads * head_dim, kv_heads * head_dim
    attention = (hidden * q + q) + 2 * (hidden * kv + kv) + q * hidden
    per_layer = attention + 3 * hidden * mlp + 2 * hidden
    return vocab * hidden * (1 if tied else 2) + layers * per_layer + hidden


def count(tree) -> int:
    return sum(math.prod(x.shape) for x in jax.tree.leaves(tree))


def preset_config(name: str, **model):
    config = base.get_config()
    config.model.preset = name
    for key, value in model.items():
        config.model[key] = value
    return config


@pytest.mark.parametrize("name", list(PUBLISHED))
def test_preset_has_the_published_shapes_and_parameter_count(name):
    (hidden, layers, heads, kv_heads, mlp), total_b, non_embedding_b = PUBLISHED[name]
    c = presets.preset(name)
    assert (c.d_model, c.num_layers, c.num_heads, c.num_kv_heads, c.mlp_dim) == (hidden, layers, heads, kv_heads, mlp)
    assert c.head_dim == hidden // heads and c.vocab_size == VOCAB and c.max_seq_len == 32768
    assert (c.rope_theta, c.norm_eps, c.qkv_bias, c.tie_embeddings, c.rope_scaling) == (1e6, 1e-6, True, True, None)
    expected = formula_count(hidden, layers, heads, kv_heads, mlp)
    built = count(jax.eval_shape(lambda: transformer.init_params(c, jax.random.key(0))))
    assert built == expected
    assert round(expected / 1e9, 2) == total_b
    assert round((expected - VOCAB * hidden) / 1e9, 2) == non_embedding_b


def test_the_0_5b_preset_builds_random_weights_of_the_exact_shapes():
    """`build.build_model` on a preset config, abstractly: the tree `init_params` would build, leaf by leaf."""
    config = preset_config("qwen2.5-0.5b")
    params = jax.eval_shape(lambda: build.build_model(config, builtin())[1])
    assert count(params) == formula_count(896, 24, 14, 2, 4864) == 494_032_768
    layers = params["layers"]
    assert params["embed"]["embedding"].shape == (VOCAB, 896) and "lm_head" not in params
    assert (layers["q_proj"]["kernel"].shape, layers["q_proj"]["bias"].shape) == ((24, 896, 896), (24, 896))
    assert (layers["k_proj"]["kernel"].shape, layers["v_proj"]["bias"].shape) == ((24, 896, 128), (24, 128))
    assert (layers["gate_proj"]["kernel"].shape, layers["down_proj"]["kernel"].shape) == ((24, 896, 4864),
                                                                                          (24, 4864, 896))
    assert {x.dtype.name for x in jax.tree.leaves(params)} == {"float32"}


def test_explicit_sizes_must_agree_with_the_preset():
    tokenizer = builtin()
    # left at the defaults, or set to the preset's own values: the preset's shapes
    agreeing = preset_config("qwen2.5-1.5b", d_model=1536, num_kv_heads=2, compute_dtype="bfloat16")
    c = build.build_model_config(agreeing, tokenizer)
    assert (c, c.compute_dtype) == (presets.preset("qwen2.5-1.5b", "bfloat16"), "bfloat16")
    for key, value in (("d_model", 1024), ("num_layers", 2), ("vocab_size", 512), ("rope_theta", 5e5),
                       ("tie_embeddings", False), ("norm_eps", 1e-5), ("mlp_dim", 1024)):
        with pytest.raises(ConfigError, match=re.escape(f"config.model.{key} = {value!r} is invalid: model.preset")):
            build.build_model_config(preset_config("qwen2.5-0.5b", **{key: value}), tokenizer)
    # a value equal to the base default cannot be told apart from an unset one (documented): mlp_dim 512 is the default
    assert build.build_model_config(preset_config("qwen2.5-0.5b", mlp_dim=512), tokenizer).mlp_dim == 4864
    # max_seq_len: the preset's 32,768 positions unless narrowed
    assert build.build_model_config(preset_config("qwen2.5-3b"), tokenizer).max_seq_len == 32768
    assert build.build_model_config(preset_config("qwen2.5-3b", max_seq_len=8192), tokenizer).max_seq_len == 8192
    with pytest.raises(ConfigError, match="config.model.max_seq_len = 65536 is invalid: .* 32768 positions at most"):
        build.build_model_config(preset_config("qwen2.5-3b", max_seq_len=65536), tokenizer)
    # a tokenizer larger than the 151,936 embedding rows (Qwen3.6's 248,044 tokens)
    with pytest.raises(ValueError, match="model.preset 'qwen2.5-0.5b' has vocab_size 151936 < the tokenizer's 248044"):
        build.build_model_config(preset_config("qwen2.5-0.5b"), types.SimpleNamespace(vocab_size=248044))


def test_validate_checks_the_preset_name_and_its_exclusion_with_a_checkpoint():
    with pytest.raises(ConfigError, match="config.model.preset = 'qwen2.5-7b' is invalid: allowed values are ''"):
        cfg.validate(preset_config("qwen2.5-7b"), num_devices=8)
    both = preset_config("qwen2.5-0.5b", pretrained_path="/models/Qwen2.5-0.5B")
    with pytest.raises(ConfigError, match="config.model.preset = 'qwen2.5-0.5b' is invalid: model.pretrained_path"):
        cfg.validate(both, num_devices=8)
    assert cfg.validate(preset_config("qwen2.5-0.5b"), num_devices=8).model.preset == "qwen2.5-0.5b"

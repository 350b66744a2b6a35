"""Published Qwen2.5 shapes (`model.preset`), for dry runs with random weights of the exact sizes.

Each preset is the architecture part of the model's HF `config.json`, read by `hf.config_from_hf` like a
checkpoint's, so a preset and a real checkpoint folder give the same `ModelConfig`. Sizes (Qwen/Qwen2.5-*
`config.json`; all three: Qwen2 architecture (q/k/v bias), SiLU, vocab_size 151,936 embedding rows,
max_position_embeddings 32,768, rope_theta 1e6, rms_norm_eps 1e-6, tied embeddings, no sliding window):

    preset          hidden  layers  heads  kv heads  head dim  MLP     parameters (model card)
    qwen2.5-0.5b    896     24      14     2         64        4864    494,032,768 (0.49B)
    qwen2.5-1.5b    1536    28      12     2         128       8960    1,543,714,304 (1.54B)
    qwen2.5-3b      2048    36      16     2         128       11008   3,085,938,688 (3.09B)

The instruct models share these shapes. How a preset combines with explicit `model.*` sizes is decided in
`ragen_jax.train.build.build_model_config`.
"""
from __future__ import annotations

from ragen_jax.config import MODEL_PRESETS
from ragen_jax.models import hf
from ragen_jax.models.config import ModelConfig

_QWEN2_5 = {"architectures": [hf.QWEN2], "model_type": "qwen2", "hidden_act": "silu", "vocab_size": 151936,
            "max_position_embeddings": 32768, "rope_theta": 1000000.0, "rms_norm_eps": 1e-6,
            "tie_word_embeddings": True, "use_sliding_window": False}
HF_CONFIGS = {
    "qwen2.5-0.5b": {**_QWEN2_5, "hidden_size": 896, "num_hidden_layers": 24, "num_attention_heads": 14,
                     "num_key_value_heads": 2, "intermediate_size": 4864},
    "qwen2.5-1.5b": {**_QWEN2_5, "hidden_size": 1536, "num_hidden_layers": 28, "num_attention_heads": 12,
                     "num_key_value_heads": 2, "intermediate_size": 8960},
    "qwen2.5-3b": {**_QWEN2_5, "hidden_size": 2048, "num_hidden_layers": 36, "num_attention_heads": 16,
                   "num_key_value_heads": 2, "intermediate_size": 11008},
}
assert tuple(HF_CONFIGS) == MODEL_PRESETS, "ragen_jax.config.MODEL_PRESETS names the presets validate accepts"

# The `model.*` keys a preset fixes (same names on ModelConfig); `max_seq_len` is only bounded by it.
ARCHITECTURE_KEYS = ("vocab_size", "d_model", "num_layers", "num_heads", "num_kv_heads", "mlp_dim", "rope_theta",
                     "qkv_bias", "tie_embeddings", "norm_eps")


def preset(name: str, compute_dtype: str = "float32") -> ModelConfig:
    """The ModelConfig of preset `name` (one of `MODEL_PRESETS`), max_seq_len = its max positions."""
    if name not in HF_CONFIGS:
        raise ValueError(f"unknown model preset {name!r}; presets: {', '.join(HF_CONFIGS)}")
    return hf.config_from_hf(HF_CONFIGS[name], compute_dtype)[0]

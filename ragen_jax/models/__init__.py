"""Language models behind one seam (lm.py: `CausalLM`), the decoder (Qwen2 / Llama-3 family) that implements it with
its value head and KV cache, tokenizers and chat formats. See transformer.py for the parameter tree.

Importing this package imports every architecture module, which registers its `model.arch` entry
(`ragen_jax.config.MODEL_ARCHS`): transformer.py registers "transformer".
"""
from ragen_jax.models.config import Llama3RopeScaling, ModelConfig
from ragen_jax.models.kv_cache import KVCache, init_cache, repeat_rows, take_rows, truncate
from ragen_jax.models.lm import CausalLM
from ragen_jax.models.transformer import (DecoderLM, Model, apply, apply_with_cache, hidden_states,
                                          hidden_states_with_cache, init_params, init_value_params,
                                          logits_from_hidden, value_from_hidden, values)

__all__ = [
    "CausalLM", "DecoderLM", "KVCache", "Llama3RopeScaling", "Model", "ModelConfig", "apply", "apply_with_cache",
    "hidden_states", "hidden_states_with_cache", "init_cache", "init_params", "init_value_params",
    "logits_from_hidden", "repeat_rows", "take_rows", "truncate", "value_from_hidden", "values",
]

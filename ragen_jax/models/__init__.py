"""Decoder LM (Qwen2 / Llama-3 family), value head and KV cache. See transformer.py for the parameter tree."""
from ragen_jax.models.config import Llama3RopeScaling, ModelConfig
from ragen_jax.models.kv_cache import KVCache, init_cache, repeat_rows, take_rows, truncate
from ragen_jax.models.transformer import (Model, apply, apply_with_cache, hidden_states, hidden_states_with_cache,
                                          init_params, init_value_params, logits_from_hidden, value_from_hidden,
                                          values)

__all__ = [
    "KVCache", "Llama3RopeScaling", "Model", "ModelConfig", "apply", "apply_with_cache", "hidden_states",
    "hidden_states_with_cache", "init_cache", "init_params", "init_value_params", "logits_from_hidden",
    "repeat_rows", "take_rows", "truncate", "value_from_hidden", "values",
]

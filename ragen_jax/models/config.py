"""`ModelConfig`: the static shape and numerics of a decoder LM (Qwen2 / Llama-3 family).

A frozen (hashable) dataclass, so it can be a static argument of `jax.jit`. Build it directly, from the
`model` section of `ragen_jax/defaults.py` with `ModelConfig.from_config`, or from a HF `config.json` (see
`ragen_jax.models.hf`).
"""
from __future__ import annotations

import dataclasses

import jax.numpy as jnp
import ml_collections

from ragen_jax.config import COMPUTE_DTYPES


@dataclasses.dataclass(frozen=True)
class Llama3RopeScaling:
    """Llama-3.1+ frequency-dependent RoPE rescaling (HF `rope_type: "llama3"`)."""

    factor: float
    low_freq_factor: float
    high_freq_factor: float
    original_max_position_embeddings: int


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """Sizes and numerics of the decoder; every field is static (changing one recompiles).

    head_dim: width of one attention head; `num_heads * head_dim` need not equal `d_model`.
    rope_scaling: None (plain RoPE) or `Llama3RopeScaling`.
    compute_dtype: "float32" | "bfloat16"; parameters stay float32 and logits come back float32.
    remat: recompute each decoder block in the backward pass (activation memory of one block instead of all).
    """

    vocab_size: int
    d_model: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    mlp_dim: int
    rope_theta: float = 10000.0
    qkv_bias: bool = False
    tie_embeddings: bool = True
    norm_eps: float = 1e-6
    max_seq_len: int = 4096
    compute_dtype: str = "float32"
    rope_scaling: Llama3RopeScaling | None = None
    remat: bool = False

    def __post_init__(self):
        for name in ("vocab_size", "d_model", "num_layers", "num_heads", "num_kv_heads", "head_dim", "mlp_dim",
                     "max_seq_len"):
            value = getattr(self, name)
            if not isinstance(value, int) or value <= 0:
                raise ValueError(f"ModelConfig.{name} = {value!r} is invalid: a positive int is required")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"ModelConfig.num_heads = {self.num_heads} is invalid: it must be a multiple of "
                             f"num_kv_heads = {self.num_kv_heads}")
        if self.head_dim % 2:
            raise ValueError(f"ModelConfig.head_dim = {self.head_dim} is invalid: RoPE needs an even head_dim")
        if self.compute_dtype not in COMPUTE_DTYPES:
            raise ValueError(f"ModelConfig.compute_dtype = {self.compute_dtype!r} is invalid: one of {COMPUTE_DTYPES}")
        if self.rope_theta <= 0 or self.norm_eps <= 0:
            raise ValueError(f"ModelConfig.rope_theta = {self.rope_theta!r} and norm_eps = {self.norm_eps!r} "
                             "must both be positive")

    @property
    def dtype(self) -> jnp.dtype:
        """The compute dtype as a jnp dtype."""
        return jnp.dtype(self.compute_dtype)

    @property
    def num_groups(self) -> int:
        """Query heads per key/value head (grouped-query attention)."""
        return self.num_heads // self.num_kv_heads

    @classmethod
    def from_config(cls, model: ml_collections.ConfigDict, vocab_size: int) -> "ModelConfig":
        """Builds the config from the `model` section of `ragen_jax/defaults.py`.

        `vocab_size` is the tokenizer's vocabulary size, used when `model.vocab_size == 0`; a nonzero
        `model.vocab_size` smaller than it is an error (token ids would fall outside the embedding).
        """
        size = model.vocab_size or vocab_size
        if size < vocab_size:
            raise ValueError(f"config.model.vocab_size = {model.vocab_size} is invalid: smaller than the "
                             f"tokenizer's vocabulary ({vocab_size})")
        if model.d_model % model.num_heads:
            raise ValueError(f"config.model.d_model = {model.d_model} is invalid: not a multiple of "
                             f"num_heads = {model.num_heads}")
        return cls(
            vocab_size=int(size),
            d_model=model.d_model,
            num_layers=model.num_layers,
            num_heads=model.num_heads,
            num_kv_heads=model.num_kv_heads,
            head_dim=model.d_model // model.num_heads,
            mlp_dim=model.mlp_dim,
            rope_theta=float(model.rope_theta),
            qkv_bias=bool(model.qkv_bias),
            tie_embeddings=bool(model.tie_embeddings),
            norm_eps=float(model.norm_eps),
            max_seq_len=model.max_seq_len,
            compute_dtype=model.compute_dtype,
        )

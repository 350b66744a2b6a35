"""RL objectives of StarPO: advantage estimators, losses, scoring rows with a model, and algorithm presets
(docs/rewards_and_objectives.md)."""
from ragen_jax.algos.advantages import bi_level_gae, gae, grpo, kl_in_reward, masked_whiten
from ragen_jax.algos.losses import (
    agg_loss,
    entropy_from_logits,
    kl_penalty,
    logprobs_and_entropy,
    masked_mean,
    policy_loss,
    value_loss,
)
from ragen_jax.algos.presets import (
    ALGORITHM_PRESETS,
    FILTER_PRESETS,
    kl_overrides,
    preset_config,
)

__all__ = [
    "ALGORITHM_PRESETS",
    "FILTER_PRESETS",
    "kl_overrides",
    "preset_config",
    "agg_loss",
    "bi_level_gae",
    "entropy_from_logits",
    "gae",
    "grpo",
    "kl_in_reward",
    "kl_penalty",
    "logprobs_and_entropy",
    "masked_mean",
    "masked_whiten",
    "policy_loss",
    "value_loss",
]

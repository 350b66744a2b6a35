"""Training: the update phase (critic and actor minibatch optimisation over a compacted batch)."""
from ragen_jax.train.update import (
    ActorHyper,
    CriticHyper,
    UpdateBatch,
    UpdateConfig,
    actor_update,
    critic_update,
    optimizer_init,
    optimizer_step,
    run_minibatches,
    token_logprobs,
    token_values,
)

__all__ = [
    "ActorHyper",
    "CriticHyper",
    "UpdateBatch",
    "UpdateConfig",
    "actor_update",
    "critic_update",
    "optimizer_init",
    "optimizer_step",
    "run_minibatches",
    "token_logprobs",
    "token_values",
]

"""The static structure of a training step (`train.step.TrainStep`), read once from the config: traced code reads
these, never the config (docs/architecture.md, design rule 3)."""
from __future__ import annotations

import dataclasses
import math

from ragen_jax.algos import estimators, presets
from ragen_jax.diagnostics import families, gradients
from ragen_jax.train import update


@dataclasses.dataclass(frozen=True)
class StepOptions:
    """The static structure of a step, read once from the config (`from_config`): traced code reads these, never
    the config, and a new value recompiles. Fields without a comment are the config keys of the same name
    (`filter_*`: `filter.*`; the algorithm switches: `algo.*`)."""

    num_groups: int  # the training rollout's geometry
    group_size: int
    metric_prefix: str  # the env's name: the rollout metrics' tag
    use_critic: bool  # the advantage estimator reads values (GAE): a critic is trained
    use_ref: bool  # a KL loss or KL reward: a reference policy is kept
    critic_warmup: int  # steps that train only the critic
    warmup_steps: int  # optim.warmup_steps of linear learning-rate warm-up
    reward_normalization: str  # rollout.reward_normalization
    filter_metric: str
    filter_strategy: str
    filter_type: str
    filter_top_p_mode: str
    loss_scaling: str  # filter.loss_scaling
    use_kl_in_reward: bool
    kl_penalty: str
    adv_estimator: str
    advantage: estimators.AdvantageOptions  # the estimators' switches (bi_level_gae, grpo_length_weight, ...)
    std_eps: float  # diagnostics.std_eps and ema_decay of the collapse metrics
    ema_decay: float
    update_config: update.UpdateConfig
    collapse: families.CollapseOptions
    grad_analysis: gradients.GradAnalysisOptions

    @classmethod
    def from_config(cls, config) -> "StepOptions":
        r, a, f, d = config.rollout, config.algo, config.filter, config.diagnostics
        return cls(
            num_groups=r.num_groups, group_size=r.group_size, metric_prefix=config.env.name,
            use_critic=presets.uses_critic(config), use_ref=presets.uses_reference(config),
            critic_warmup=a.critic_warmup, warmup_steps=config.optim.warmup_steps,
            reward_normalization=r.reward_normalization, filter_metric=f.metric, filter_strategy=f.strategy,
            filter_type=f.type, filter_top_p_mode=f.top_p_mode,
            loss_scaling=f.loss_scaling, use_kl_in_reward=a.use_kl_in_reward, kl_penalty=a.kl_penalty,
            adv_estimator=a.adv_estimator, advantage=estimators.AdvantageOptions.from_config(config),
            std_eps=d.std_eps, ema_decay=d.ema_decay, update_config=update.UpdateConfig.from_config(config),
            collapse=families.CollapseOptions.from_config(config),
            grad_analysis=gradients.GradAnalysisOptions.from_config(
                config, chunk_rows=math.gcd(16, r.num_groups * r.group_size)))

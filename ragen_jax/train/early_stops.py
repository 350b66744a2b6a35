"""The host side of RAGEN's three early-stop rules (docs/filtering.md#early-stops), fed one step or evaluation
at a time.

    stops = EarlyStops(config.filter, num_success_keys)
    reason = stops.after_step(metrics)            # None, or why the run should stop
    reason = stops.after_validation(success_rates)
    extra["early_stop"] = stops.to_json()          # travels in checkpoints; stops.load_json(...) restores it

The rules themselves are `ragen_jax.filtering.stop_rules` (pure functions of arrays): `filter.empty_stop_steps`
consecutive steps whose filter kept no group; a reward-variance collapse (`filter.rv_collapse_window` /
`rv_collapse_ratio`, reward filter metrics only); any validation success rate below `filter.val_success_floor` for
`filter.val_success_patience` evaluations in a row.
"""
from __future__ import annotations

from typing import Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from ragen_jax import filtering


class EarlyStops:
    def __init__(self, filter_config, num_success_keys: int):
        self.f = filter_config
        self.states = (filtering.empty_stop_init(), filtering.reward_variance_init(filter_config.rv_collapse_window),
                       filtering.validation_success_init(num_success_keys))

    def after_step(self, metrics: Mapping[str, float]) -> str | None:
        """Feeds one training step's metrics; returns the reason to stop, or None."""
        f = self.f
        empty, variance, low_val = self.states
        empty, stop_empty = filtering.empty_stop_update(empty, metrics["rollout/filter_kept_count"], f.empty_stop_steps)
        stop_variance = False
        if "rollout/in_group_reward_std" in metrics:  # the rule exists for reward filter metrics only
            variance, stop_variance = filtering.reward_variance_update(
                variance, metrics["rollout/in_group_reward_std"], metrics["rollout/filter_kept_count"] > 0,
                f.rv_collapse_ratio)
        self.states = (empty, variance, low_val)
        if bool(stop_empty):
            return f"the filter kept no group for {int(empty.consecutive_empty)} consecutive steps"
        if bool(stop_variance):
            return (f"reward-variance collapse (the last {f.rv_collapse_window} in-group reward stds < "
                    f"{f.rv_collapse_ratio} x their base)")
        return None

    def after_validation(self, success_rates: Sequence[float]) -> str | None:
        """Feeds one evaluation's `val-env/*/success` rates (always in the same key order)."""
        f = self.f
        empty, variance, low_val = self.states
        low_val, stop = filtering.validation_success_update(low_val, jnp.asarray(success_rates, jnp.float32),
                                                            f.val_success_floor, f.val_success_patience)
        self.states = (empty, variance, low_val)
        if bool(stop):
            return (f"validation success below {f.val_success_floor} for {f.val_success_patience} evaluations in a "
                    "row (early_stopped/low_validation_success)")
        return None

    def to_json(self) -> list:
        return [np.asarray(x).tolist() for x in jax.tree.leaves(self.states)]

    def load_json(self, leaves: list) -> None:
        """Restores the states saved by `to_json` (same config)."""
        self.states = jax.tree.unflatten(jax.tree.structure(self.states), [jnp.asarray(x) for x in leaves])

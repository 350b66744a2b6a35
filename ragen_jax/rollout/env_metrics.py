"""The env metrics of a rollout batch, logged by training (`train.step`) and, under `val-env/`, by validation."""
from __future__ import annotations

import jax
import jax.numpy as jnp

from ragen_jax.rollout.rollout import Trajectory


def rollout_metrics(traj: Trajectory, group_size: int, prefix: str) -> dict[str, jax.Array]:
    """Per-batch env metrics (RAGEN's `{tag}/...` names where they exist), f32 scalars."""
    f32 = lambda x: jnp.asarray(x, jnp.float32)  # noqa: E731
    taken = traj.turn_taken
    turns = taken.sum(axis=1)
    success = f32(traj.success)
    return {
        f"{prefix}/success": success.mean(),
        f"{prefix}/pass@{group_size}": success.reshape(-1, group_size).max(axis=1).mean(),
        f"{prefix}/episode_reward": traj.episode_reward.mean(),
        f"{prefix}/num_actions": f32(traj.num_actions).mean(),
        f"{prefix}/num_turns": f32(turns).mean(),
        f"{prefix}/format_ok_rate": f32((traj.format_ok & taken).sum()) / jnp.maximum(taken.sum(), 1),
        f"{prefix}/done_rate": f32(traj.done).mean(),
        f"{prefix}/cut_rate": f32(traj.cut).mean(),
        "response_length/mean": f32(traj.response_len.sum()) / jnp.maximum(taken.sum(), 1),
        "trajectory_length/mean": f32(traj.length).mean(),
    }

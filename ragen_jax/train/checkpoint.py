"""Training checkpoints: the `TrainState` pytree plus a JSON `extra` dict per saved step (orbax-checkpoint).

    ckpt = Checkpointer(run_dir / "checkpoints", max_to_keep=3, save_every=50)
    ckpt.save(step, state, {"config": config.to_dict(), "seed": seed, "metrics": last_metrics})
    ...
    ckpt.save(last_step, state, extra, force=True)      # the final step, whatever save_every says
    ckpt.close()                                       # waits for the asynchronous writes

    abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, train_step.init(key, params))  # or jax.eval_shape
    state, extra = ckpt.restore_latest(abstract)

Layout on disk (orbax `CheckpointManager` with two items): `<directory>/<step>/state` (every array of the
TrainState, `ocp.args.StandardSave`) and `<directory>/<step>/extra` (`ocp.args.JsonSave`).

Saving is asynchronous: `save` returns once the arrays are copied off the device, so the caller may donate the
state to the next step right away; the files are written in a background thread and complete at the next
`save`, `wait()` or `close()`.

A save that cannot be written (the disk full, the folder gone) raises `CheckpointWriteError`, one line naming the
step, the folder and the newest complete step, when it surfaces (`save`, `wait` or `close`); orbax writes each step
into a temporary folder renamed only once complete, so the earlier steps stay loadable and a resumed run never sees
the cut one.

Restoring needs an abstract target of the state (arrays or `jax.ShapeDtypeStruct`s, with shardings where the
state is sharded): it gives the pytree structure back (optax NamedTuples instead of lists, flax dataclasses,
None fields stay None), the dtypes and the placement. Before reading any array the checkpoint's metadata is
compared with the target, and a ValueError names each path that is missing, unexpected, or differs in shape or
dtype (orbax would otherwise cast dtypes silently).
"""
from __future__ import annotations

import contextlib
import json
import os
from typing import Any, Iterator

import jax
import orbax.checkpoint as ocp

from ragen_jax.errors import UserInputError

STATE, EXTRA = "state", "extra"
_MAX_LISTED = 8  # differing paths named in a structure-mismatch error


class CheckpointWriteError(UserInputError):
    """A checkpoint could not be written (an OSError such as a full disk); the message names the step and folder."""


class Checkpointer:
    """A sequence of step checkpoints in one directory, the newest `max_to_keep` kept.

    Args:
      directory: where the step folders live (created if missing; relative paths resolve against the cwd).
      max_to_keep: how many of the newest checkpoints to keep (older ones are deleted), >= 1.
      save_every: `save` writes steps that are multiples of it (and any step with `force=True`), >= 1.
    Multi-host runs call every method on all processes (orbax coordinates who writes what).
    """

    def __init__(self, directory: str | os.PathLike, max_to_keep: int = 3, save_every: int = 50):
        if not str(directory):
            raise ValueError("Checkpointer directory is empty: give the folder for the checkpoints")
        if max_to_keep < 1:
            raise ValueError(f"Checkpointer max_to_keep = {max_to_keep}: keep at least 1 checkpoint")
        if save_every < 1:
            raise ValueError(f"Checkpointer save_every = {save_every}: must be >= 1")
        self.directory = os.path.abspath(os.fspath(directory))  # orbax requires an absolute path
        self.max_to_keep, self.save_every = max_to_keep, save_every
        options = ocp.CheckpointManagerOptions(max_to_keep=max_to_keep, create=True)
        # Handlers named up front, so that a fresh manager (a resumed run) can read metadata before any save.
        handlers = {STATE: ocp.StandardCheckpointHandler(), EXTRA: ocp.JsonCheckpointHandler()}
        self._manager = ocp.CheckpointManager(self.directory, item_handlers=handlers, options=options)
        self._writing: int | None = None  # the newest step whose save was started

    @contextlib.contextmanager
    def _writes(self) -> Iterator[None]:
        """Re-raises an OSError of an (asynchronous) write as CheckpointWriteError, once."""
        try:
            yield
        except OSError as error:
            step, self._writing = self._writing, None
            complete = [s for s in self._manager.all_steps() if s != step]
            newest = f"step {max(complete)}" if complete else "none"
            raise CheckpointWriteError(f"checkpoint step {step} could not be written to {self.directory}: {error} "
                                       f"(the newest complete checkpoint: {newest})") from error

    # ------------------------------------------------------------------------------------------ saving
    def should_save(self, step: int, force: bool = False) -> bool:
        """True when `save(step, ..., force)` would write: a multiple of save_every (or forced), not yet saved."""
        return (force or step % self.save_every == 0) and step not in self.all_steps()

    def save(self, step: int, state: Any, extra: dict, force: bool = False) -> bool:
        """Saves `state` (a pytree of arrays) and `extra` (a JSON-serialisable dict) as checkpoint `step`.

        Returns whether a checkpoint was started: steps that are not multiples of `save_every` are skipped unless
        `force`, and a step that already has a checkpoint is never overwritten. Asynchronous (see module doc).
        """
        step = int(step)
        _check_json(extra)
        if not self.should_save(step, force):
            return False
        args = ocp.args.Composite(**{STATE: ocp.args.StandardSave(state), EXTRA: ocp.args.JsonSave(extra)})
        with self._writes():  # the previous save completes here
            self._manager.wait_until_finished()
        self._writing = step
        with self._writes():
            # The decision is ours (should_save); orbax's own policy would also save the first step of a run.
            return self._manager.save(step, args=args, force=True)

    def clear(self) -> None:
        """Deletes every saved step (a run that starts over in this directory: old steps would block its saves)."""
        self.wait()
        for step in self.all_steps():
            self._manager.delete(step)

    def wait(self) -> None:
        """Blocks until every started save is on disk."""
        with self._writes():
            self._manager.wait_until_finished()

    def close(self) -> None:
        """Waits for pending saves and releases orbax's threads."""
        with self._writes():
            self._manager.close()

    def __enter__(self) -> "Checkpointer":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ------------------------------------------------------------------------------------------ restoring
    def all_steps(self) -> list[int]:
        """Saved steps, ascending (including a save still being written)."""
        return sorted(self._manager.all_steps())

    def latest_step(self) -> int | None:
        """The newest saved step, None when the directory holds no checkpoint."""
        return self._manager.latest_step()

    def restore(self, step: int, abstract_state: Any) -> tuple[Any, dict]:
        """(state, extra) of checkpoint `step`, with the structure, dtypes and shardings of `abstract_state`.

        Args:
          step: a saved step (see `all_steps`).
          abstract_state: the state's pytree with arrays or `jax.ShapeDtypeStruct` leaves, e.g.
            `jax.eval_shape(train_step.init, key, params)`; leaves without a sharding restore on the default device.
        Raises:
          FileNotFoundError: no checkpoint for `step` in the directory (the error lists the saved steps).
          ValueError: the checkpoint's arrays differ from `abstract_state` (paths, shapes or dtypes named).
        """
        self.wait()
        step = int(step)
        steps = self.all_steps()
        if step not in steps:
            raise FileNotFoundError(f"no checkpoint for step {step} in {self.directory} (saved steps: {steps})")
        target = jax.tree.map(ocp.utils.to_shape_dtype_struct, abstract_state)
        self._check_matches(step, target)
        args = ocp.args.Composite(**{STATE: ocp.args.StandardRestore(target), EXTRA: ocp.args.JsonRestore()})
        restored = self._manager.restore(step, args=args)
        return restored[STATE], restored[EXTRA]

    def restore_latest(self, abstract_state: Any) -> tuple[Any, dict]:
        """`restore` of the newest step; FileNotFoundError naming the directory when it holds no checkpoint."""
        self.wait()
        step = self.latest_step()
        if step is None:
            raise FileNotFoundError(f"no checkpoint to restore in {self.directory}: the directory holds no saved step")
        return self.restore(step, abstract_state)

    def _check_matches(self, step: int, target: Any) -> None:
        """UserInputError naming the paths where checkpoint `step` and `target` differ (structure, shape, dtype)."""
        stored = ocp.tree.to_flat_dict(self._manager.item_metadata(step)[STATE].tree)
        wanted = ocp.tree.to_flat_dict(target)
        problems = [f"missing from the checkpoint: {_path(p)}" for p in wanted if p not in stored]
        problems += [f"in the checkpoint but not in the target: {_path(p)}" for p in stored if p not in wanted]
        for p in wanted.keys() & stored.keys():
            have, want = stored[p], wanted[p]
            if tuple(have.shape) != tuple(want.shape) or jax.numpy.dtype(have.dtype) != jax.numpy.dtype(want.dtype):
                problems.append(f"{_path(p)}: checkpoint {have.dtype}{list(have.shape)}, "
                                f"target {want.dtype}{list(want.shape)}")
        if problems:
            listed = "; ".join(sorted(problems)[:_MAX_LISTED])
            more = f" (and {len(problems) - _MAX_LISTED} more)" if len(problems) > _MAX_LISTED else ""
            raise UserInputError(f"checkpoint {self.directory}/{step} does not match the abstract state: {listed}{more}"
                                 " (another model's run? --config.checkpoint.resume=False starts over)")


def _path(keys: tuple) -> str:
    return "/".join(str(k) for k in keys)


def _check_json(extra: dict) -> None:
    """TypeError naming the first entry of `extra` that JSON cannot encode."""
    if not isinstance(extra, dict):
        raise TypeError(f"checkpoint extra must be a dict, got {type(extra).__name__}")
    for key, value in extra.items():
        try:
            json.dumps({key: value})
        except (TypeError, ValueError) as error:
            raise TypeError(f"checkpoint extra[{key!r}] is not JSON-serialisable: {error}") from None

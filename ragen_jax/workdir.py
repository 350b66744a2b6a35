"""A run's working directory: `--workdir=DIR` of the entry points (the Flax examples' convention).

    config = workdir.prepare(config, "runs/bandit")        # before train(config) or Sweep(config, points).run()

Everything of a run lives in DIR: `config.json` (the resolved config, indented JSON), `metrics.jsonl` and the
TensorBoard events (`logging.dir` defaults to DIR), `checkpoints/` (`checkpoint.dir` defaults to DIR/checkpoints),
`report.png`; a sweep's members each get a folder of metrics. Running the same command again resumes from the newest
checkpoint (`checkpoint.resume` is on in a workdir whatever the config file says). A DIR whose config.json differs
from the new config in a key outside `RESUMABLE` is refused with a `WorkdirError` naming the keys (so is a DIR whose
config.json is unreadable, one holding checkpoints without a config.json, and one that cannot be written); a fresh
DIR, or `--config.checkpoint.resume=False` on the command line (the run starts over: the loop drops the earlier run's
metrics and checkpoints), writes config.json anew.
"""
from __future__ import annotations

import json
import os
from typing import Any, Collection, Mapping

import ml_collections

from ragen_jax import distributed
from ragen_jax.config import apply_overrides
from ragen_jax.errors import UserInputError, read_json, reraised

CONFIG_FILE = "config.json"
CHECKPOINTS = "checkpoints"
# Keys (or key prefixes ending in ".") a resumed run may change: how far it runs (train.total_steps extends a
# finished run), where and how often it logs and saves, and how each batch is split over the devices (the same
# results up to float reduction order). Everything else would make the resumed run a different experiment.
RESUMABLE = ("train.total_steps", "checkpoint.", "logging.", "mesh.data", "mesh.fsdp")
_MAX_LISTED = 6  # differing keys named in the refusal


class WorkdirError(UserInputError):
    """A workdir that holds a run of another config (the message names the differing keys), holds checkpoints
    without their config.json, or cannot be written."""


def with_dirs(config: ml_collections.ConfigDict, workdir: str,
              overridden: Collection[str] = ()) -> ml_collections.ConfigDict:
    """A copy of `config` with `logging.dir` = workdir, `checkpoint.dir` = workdir/checkpoints and
    `checkpoint.resume` on, except the keys in `overridden` (those the command line set explicitly, e.g.
    `{"checkpoint.resume"}`): a config file's own dirs and resume setting give way to the workdir."""
    placed = {"logging.dir": workdir, "checkpoint.dir": os.path.join(workdir, CHECKPOINTS), "checkpoint.resume": True}
    return apply_overrides(config, {k: v for k, v in placed.items() if k not in overridden})


def differences(stored: Mapping[str, Any], new: Mapping[str, Any]) -> list[str]:
    """`key (stored -> new)` of every dotted key outside RESUMABLE whose value differs (or exists on one side only)."""
    old, now = _flatten(stored), _flatten(new)
    keys = [k for k in dict.fromkeys([*old, *now]) if not k.startswith(RESUMABLE) and old.get(k) != now.get(k)]
    return [f"{k} ({_show(old, k)} -> {_show(now, k)})" for k in keys]


def prepare(config: ml_collections.ConfigDict, workdir: str, overridden: Collection[str] = (),
            extra: Mapping[str, Any] | None = None) -> ml_collections.ConfigDict:
    """`with_dirs(config, workdir, overridden)`, checked against and then written to `<workdir>/config.json`.

    Args:
      config: the run's config; workdir: the run's folder (created if missing); overridden: as in `with_dirs`;
      extra: more of the run's identity stored and compared next to the config keys (a sweep's `{"sweep": points}`).
    Raises:
      WorkdirError: with `checkpoint.resume` on, config.json holds another config or is unreadable, or checkpoints
        lie there without one; the folder cannot be written.
    """
    if not workdir:
        raise WorkdirError("--workdir is empty: give the run's folder, e.g. --workdir=runs/bandit")
    config = with_dirs(config, workdir, overridden)
    resolved = json.loads(json.dumps({**config.to_dict(), **(extra or {})}))  # as it reads back from the file
    path = os.path.join(workdir, CONFIG_FILE)
    if config.checkpoint.resume and os.path.exists(path):
        differing = differences(read_json(path, WorkdirError, "a run's config"), resolved)
        if differing:
            listed = ", ".join(differing[:_MAX_LISTED])
            more = f" and {len(differing) - _MAX_LISTED} more" if len(differing) > _MAX_LISTED else ""
            raise WorkdirError(f"{path} holds a run of another config: {listed}{more}; rerun with its config, use a "
                               "fresh --workdir, or pass --config.checkpoint.resume=False to start over")
    elif config.checkpoint.resume and _holds_checkpoints(config.checkpoint.dir):
        raise WorkdirError(f"{config.checkpoint.dir} holds checkpoints but {path} does not exist, so they may be "
                           "another config's: use a fresh --workdir, or pass --config.checkpoint.resume=False to "
                           "start over")
    if distributed.is_main_process():
        with reraised(WorkdirError, f"--workdir={workdir} cannot be written", OSError):
            os.makedirs(workdir, exist_ok=True)
            with open(path + ".tmp", "w", encoding="utf-8") as f:
                json.dump(resolved, f, indent=2)
            os.replace(path + ".tmp", path)
    return config


def _holds_checkpoints(directory: str) -> bool:
    """Whether `directory` exists and holds anything (a checkpoint step folder)."""
    return os.path.isdir(directory) and any(os.scandir(directory))


def read_config(workdir: str) -> ml_collections.ConfigDict:
    """The locked config stored in `<workdir>/config.json` of a single run, its dirs moved to `workdir` when they were
    the workdir's defaults (a copied or moved run folder); WorkdirError when there is none or the folder holds a
    sweep."""
    path = os.path.join(workdir, CONFIG_FILE)
    if not os.path.exists(path):
        raise WorkdirError(f"{path} does not exist: --workdir names the folder of a run started with --workdir")
    stored = read_json(path, WorkdirError, "a run's config")
    if "sweep" in stored:
        raise WorkdirError(f"{workdir} holds a sweep (its checkpoints stack the members): give a single run's workdir")
    config = ml_collections.ConfigDict(stored)
    config.lock()
    if config.checkpoint.dir == os.path.join(config.logging.dir, CHECKPOINTS):
        config = with_dirs(config, workdir, overridden={"checkpoint.resume"})
    return config


def _flatten(tree: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    out = {}
    for key, value in tree.items():
        if isinstance(value, Mapping) and value:
            out.update(_flatten(value, f"{prefix}{key}."))
        else:
            out[prefix + key] = value
    return out


def _show(flat: Mapping[str, Any], key: str) -> str:
    return json.dumps(flat[key]) if key in flat else "unset"

"""Metric logs of a training run: one JSON line per logged step plus TensorBoard scalars, and console summaries.

    writer = MetricsWriter(run_dir, tensorboard=True, every=1)
    writer.truncate_after(resume_step)          # on resume only: drop what the interrupted run logged later
    writer.write(step, metrics)                 # metrics: name -> float / numpy or jax scalar
    writer.close()
    rows = read_metrics(run_dir)                # [{"step": 1, "train/success": 0.5, ...}, ...]

`<directory>/metrics.jsonl` holds `{"step": step, **metrics}` per logged step in insertion order. The file is
strict JSON: non-finite values (NaN, +-inf) are written as `null` and read back as NaN. Floats are written
with Python's shortest round-trip repr, so a run resumed with `truncate_after` and continued deterministically
leaves the same bytes as an uninterrupted run. TensorBoard event files (tensorboardX, no TensorFlow) go to the
same directory; after `truncate_after(step)` the next event file carries a purge marker at `step + 1`, so
TensorBoard discards the interrupted run's later points.
"""
from __future__ import annotations

import gzip
import json
import math
import os
from typing import Any, Iterable, Mapping

import jax
import numpy as np

METRICS_FILE = "metrics.jsonl"


class MetricsWriter:
    """Writes the metrics of every `every`-th step (or a forced one) to `<directory>/metrics.jsonl` and TensorBoard.

    Args:
      directory: the run's log folder (created if missing); None or "" writes nothing to disk (write() still
        checks and converts its input, so a run without logs fails the same way as one with logs).
      tensorboard: also write TensorBoard scalars (tag = metric name) next to the JSON lines.
      every: steps that are multiples of it are written, >= 1.
    Multi-host runs log from one process (e.g. `directory if jax.process_index() == 0 else None`).
    """

    def __init__(self, directory: str | os.PathLike | None, tensorboard: bool = True, every: int = 1):
        if every < 1:
            raise ValueError(f"MetricsWriter every = {every}: must be >= 1")
        self.every, self.tensorboard = every, tensorboard
        self.directory = os.path.abspath(os.fspath(directory)) if directory else None
        self.path = os.path.join(self.directory, METRICS_FILE) if self.directory else None
        if self.directory:
            os.makedirs(self.directory, exist_ok=True)
        self._file = None
        self._summary_writer = None
        self._purge_step: int | None = None

    def should_write(self, step: int, force: bool = False) -> bool:
        return force or step % self.every == 0

    def write(self, step: int, metrics: Mapping[str, Any], force: bool = False) -> bool:
        """Logs `metrics` (scalars: float, int, bool, numpy or jax 0-d/size-1 arrays) at `step`.

        Returns whether the step was logged (`every`, or `force`). One device-to-host transfer for all values.
        Raises ValueError naming a metric that is not a scalar, or a metric called "step".
        """
        if not self.should_write(step, force):
            return False
        values = to_floats(metrics)
        if self.path is None:
            return True
        if self._file is None:
            self._file = open(self.path, "a", encoding="utf-8")
        self._file.write(_encode_line(int(step), values))
        self._file.flush()  # a crash loses at most the line being written (truncate_after drops such a tail)
        if self.tensorboard:
            writer = self._tensorboard_writer()
            for name, value in values.items():
                if math.isfinite(value):  # NaN = not computed this step (e.g. no valid reasoning): no point
                    writer.add_scalar(name, value, global_step=int(step))
        return True

    def truncate_after(self, step: int) -> int:
        """Drops the logged lines with step > `step` (resuming from checkpoint `step`); returns how many.

        A final line cut short by a crash is dropped too; any other unreadable line raises ValueError.
        TensorBoard: the next event file purges points at steps >= step + 1.
        """
        if self.path is None:
            return 0
        self._close_file()
        self._close_tensorboard()
        self._purge_step = int(step) + 1
        if not os.path.exists(self.path):
            return 0
        with open(self.path, encoding="utf-8") as f:
            lines = f.readlines()
        rows = _parse_lines(lines, self.path, drop_partial_tail=True)
        kept = [line for line, row in zip(lines, rows) if row["step"] <= step]
        temporary = self.path + ".tmp"
        with open(temporary, "w", encoding="utf-8") as f:
            f.writelines(kept)
        os.replace(temporary, self.path)
        return len(lines) - len(kept)

    def flush(self) -> None:
        if self._file is not None:
            self._file.flush()
        if self._summary_writer is not None:
            self._summary_writer.flush()

    def close(self) -> None:
        self._close_file()
        self._close_tensorboard()

    def __enter__(self) -> "MetricsWriter":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _tensorboard_writer(self):
        if self._summary_writer is None:
            from tensorboardX import SummaryWriter  # imported on first use: runs without TensorBoard skip it

            self._summary_writer = SummaryWriter(logdir=self.directory, purge_step=self._purge_step)
            self._purge_step = None
        return self._summary_writer

    def _close_file(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None

    def _close_tensorboard(self) -> None:
        if self._summary_writer is not None:
            self._summary_writer.close()
            self._summary_writer = None


def to_floats(metrics: Mapping[str, Any]) -> dict[str, float]:
    """Python floats of scalar metrics (one `jax.device_get` for all); ValueError names a non-scalar or "step"."""
    if "step" in metrics:
        raise ValueError('metric name "step" is reserved for the step number of each logged line')
    host = jax.device_get(dict(metrics))
    values = {}
    for name, value in host.items():
        array = np.asarray(value)
        if array.size != 1 or array.dtype.kind not in "biufV":  # bool, int, float; bfloat16 is "V"
            raise ValueError(f"metric {name!r} must be a numeric scalar, got {array.dtype}{list(array.shape)}")
        values[name] = float(array.reshape(()))
    return values


def read_metrics(path: str | os.PathLike) -> list[dict]:
    """The rows of a metrics.jsonl (or of `<path>/metrics.jsonl` for a directory; a gzipped `metrics.jsonl.gz`,
    as archived results are kept, when there is no plain one): `step` int, values float (null read back as NaN).
    ValueError names the file and line of an unreadable line."""
    path = os.fspath(path)
    if os.path.isdir(path):
        plain = os.path.join(path, METRICS_FILE)
        path = plain if os.path.exists(plain) or not os.path.exists(plain + ".gz") else plain + ".gz"
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as f:
        return _parse_lines(f.readlines(), path, drop_partial_tail=False)


def summary_line(step: int, metrics: Mapping[str, Any], keys: Iterable[str]) -> str:
    """A short console line of the chosen metrics, e.g. `step 12 | train/success 0.5 | actor/pg_loss -0.0123`.

    Keys missing from `metrics` are left out (e.g. critic metrics of a GRPO run); values print with 4 significant
    digits.
    """
    parts = [f"step {int(step)}"]
    parts += [f"{key} {float(np.asarray(metrics[key])):.4g}" for key in keys if key in metrics]
    return " | ".join(parts)


def throughput(metrics: Mapping[str, float], env_name: str, batch_size: int) -> dict[str, float]:
    """RAGEN's throughput of one step from its metrics: `perf/generated_tokens`, the tokens the rollout sampled (the
    trajectory's `sampled` mask summed over its B = `batch_size` rows, as `response_length/mean` x
    `<env>/num_turns` x B: tokens per taken turn x taken turns), and `perf/generated_tokens_per_s`, those over the
    whole step's `timing_s/step` (scoring and the update included). {} when a key is missing."""
    try:
        tokens = round(metrics["response_length/mean"] * metrics[f"{env_name}/num_turns"] * batch_size)
        seconds = metrics["timing_s/step"]
    except KeyError:
        return {}
    return {"perf/generated_tokens": float(tokens), "perf/generated_tokens_per_s": tokens / max(seconds, 1e-9)}


def _encode_line(step: int, values: dict[str, float]) -> str:
    row = {"step": step, **{k: (v if math.isfinite(v) else None) for k, v in values.items()}}
    return json.dumps(row, allow_nan=False) + "\n"


def _parse_lines(lines: list[str], path: str, drop_partial_tail: bool) -> list[dict]:
    rows = []
    for number, line in enumerate(lines, start=1):
        try:
            row = json.loads(line)
            step = row["step"]
        except (json.JSONDecodeError, KeyError, TypeError) as error:
            if drop_partial_tail and number == len(lines) and not line.endswith("\n"):
                break  # the line a crash cut short
            raise ValueError(f"{path}:{number}: not a metrics line ({error}): {line[:80]!r}") from None
        rows.append({"step": step, **{k: (math.nan if v is None else float(v)) for k, v in row.items()
                                      if k != "step"}})
    return rows

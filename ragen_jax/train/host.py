"""What a single run (`train.loop`) and a sweep (`train.sweep`) share on the host: their files, the resume-or-start
decision and the console progress (closed whatever ends the run), and the timed, ahead-of-time compiled programs.

    with RunFiles(config, [config.logging.dir]) as files:        # one metrics folder per run or sweep member
        state, extra = files.restore_or_start(abstract_state, fresh_state, log)   # extra is None on a fresh start
        progress = files.progress(initial=int(state.step), desc="train", log=log)
        step = Timed(jax.jit(...), "step")
        (state, metrics), timing = step(state, key, hyper)       # timing: {"timing_s/step": s, ...}
        progress.update({**metrics, **timing}, summary_line(...), validated)   # the bar's postfix, or the line
        ...                                                       # files.checkpointer.save, files.writers[i].write

On leaving the block, normally or by an exception (a failing step, Ctrl-C), the bar, the metrics files and the
checkpointer are closed: the asynchronous checkpoint writes started so far complete, so the newest saved step is
loadable and the metrics lines written so far are on disk.
"""
from __future__ import annotations

import contextlib
import math
import os
import sys
import time
from typing import Any, Callable, Mapping, Sequence

import jax
import tqdm

from ragen_jax import distributed
from ragen_jax.train import transcripts
from ragen_jax.train.checkpoint import Checkpointer
from ragen_jax.train.metrics_log import MetricsWriter


class RunFiles(contextlib.ExitStack):
    """The checkpointer (`checkpoint.dir`; None when it is "") and one MetricsWriter per folder of `log_dirs` (only on
    the main process; a None or "" folder writes nothing) of a run with `config`."""

    def __init__(self, config, log_dirs: Sequence[str | None]):
        super().__init__()
        c, lg = config.checkpoint, config.logging
        self.config, self.main = config, distributed.is_main_process()
        self.checkpointer = None
        if c.dir:
            self.checkpointer = self.enter_context(
                Checkpointer(c.dir, max_to_keep=c.max_to_keep, save_every=c.save_freq))
        self.writers = [self.enter_context(MetricsWriter((d or None) if self.main else None,
                                                         tensorboard=lg.tensorboard, every=lg.every))
                        for d in log_dirs]

    def restore_or_start(self, abstract_state: Any, fresh_state: Callable[[], Any],
                         log: Callable[[str], None] | None) -> tuple[Any, dict | None]:
        """(the newest checkpoint's state and extra, its later metrics lines dropped) when `checkpoint.resume` finds
        one, else (`fresh_state()`, None) after `start_over`. `abstract_state` carries the shardings to restore to."""
        c = self.config.checkpoint
        if self.checkpointer is not None and c.resume and self.checkpointer.latest_step() is not None:
            state, extra = self.checkpointer.restore_latest(abstract_state)
            for writer in self.writers:
                writer.truncate_after(int(state.step))
            if log is not None:
                log(f"resumed from step {int(state.step)} in {c.dir}")
            return state, extra
        start_over(self.checkpointer, self.writers)
        return fresh_state(), None

    def progress(self, initial: int, desc: str, log: Callable[[str], None] | None, file=None) -> "Progress":
        """The console progress from step `initial` to `train.total_steps` (`Progress`): a bar when
        `logging.progress_bar` is on and `file` (default stderr) is a terminal, on the main process; closed with
        the files."""
        file = sys.stderr if file is None else file
        bar = None
        if self.config.logging.progress_bar and self.main and file.isatty():
            bar = tqdm.tqdm(total=self.config.train.total_steps, initial=initial, desc=desc, unit="step", file=file)
            self.callback(bar.close)
        return Progress(self.config.env.name, bar, log)


# The bar's postfix: (label, metric key; "{env}" is the env's name).
POSTFIX = (("success", "{env}/success"), ("reward_std", "rollout/in_group_reward_std"),
           ("kept", "rollout/filter_kept_ratio"), ("mi_z", "collapse_first_turn_sample/mi_zscore"),
           ("s/step", "timing_s/step"))


class Progress:
    """Console progress of a run's steps. With a tqdm `bar` each step moves it and sets its postfix to POSTFIX's
    values (a value missing or NaN this step, e.g. the MI z-score on a step without diagnostics, keeps the last
    one shown), and the summary line is printed above the bar (on the bar's console) only on validated steps;
    without one (not a terminal, `logging.progress_bar` off) every step's summary line goes to `log` (None:
    silent)."""

    def __init__(self, env_name: str, bar: tqdm.tqdm | None, log: Callable[[str], None] | None):
        self.bar, self.log = bar, log
        self.keys = [(label, key.format(env=env_name)) for label, key in POSTFIX]
        self.postfix: dict[str, str] = {}

    def update(self, metrics: Mapping[str, float], line: str, validated: bool = False) -> None:
        """One step done: `metrics` its floats (of one member of a sweep, or their mean), `line` its summary."""
        if self.bar is None:
            if self.log is not None:
                self.log(line)
            return
        for label, key in self.keys:
            if key in metrics and math.isfinite(metrics[key]):
                self.postfix[label] = f"{metrics[key]:.3g}"
        self.bar.set_postfix(self.postfix, refresh=False)
        self.bar.update(1)
        if validated:
            self.bar.write(line, file=self.bar.fp)

    def write(self, line: str) -> None:
        """A line that is not a step's summary (e.g. an early stop): above the bar, else to `log`."""
        if self.bar is not None:
            self.bar.write(line, file=self.bar.fp)
        elif self.log is not None:
            self.log(line)


class Timed:
    """A `jax.jit` function compiled ahead of time on its first call (`lower(*args).compile()`), its calls timed.

        step = Timed(jax.jit(train_step, ...), "step")
        out, timing = step(*args)    # {"timing_s/step": s}; the first call adds "timing_s/lower_step" (tracing and
                                     # lowering) and "timing_s/compile_step" (XLA, or the persistent cache's load)

    `timing_s/<name>` is the wall time of the call until its outputs are ready, compilation excluded. Later calls
    must pass arguments of the first call's shapes, dtypes and shardings (the loop's steps do).
    """

    def __init__(self, jitted, name: str):
        self.jitted, self.name, self.executable = jitted, name, None

    def __call__(self, *args) -> tuple[Any, dict[str, float]]:
        timing = {}
        if self.executable is None:
            start = time.perf_counter()
            lowered = self.jitted.lower(*args)
            lowered_at = time.perf_counter()
            self.executable = lowered.compile()
            timing = {f"timing_s/lower_{self.name}": lowered_at - start,
                      f"timing_s/compile_{self.name}": time.perf_counter() - lowered_at}
        start = time.perf_counter()
        out = jax.block_until_ready(self.executable(*args))
        timing[f"timing_s/{self.name}"] = time.perf_counter() - start
        return out, timing


def start_over(checkpointer: Checkpointer | None, writers: Sequence[MetricsWriter]) -> None:
    """Empties the folders of a run that starts from step 0: an earlier run's checkpoints (which would block this
    run's saves), metrics lines (which it would append to) and transcripts."""
    if checkpointer is not None:
        checkpointer.clear()
    for writer in writers:
        if writer.path is not None and os.path.exists(writer.path):
            writer.truncate_after(-1)
        transcripts.clear(writer.directory)

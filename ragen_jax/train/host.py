"""What a single run (`train.loop`) and a sweep (`train.sweep`) share on the host: their files, the resume-or-start
decision and the progress bar, closed whatever ends the run.

    with RunFiles(config, [config.logging.dir]) as files:        # one metrics folder per run or sweep member
        state, extra = files.restore_or_start(abstract_state, fresh_state, log)   # extra is None on a fresh start
        bar = files.progress_bar(initial=int(state.step), desc="train")
        ...                                                       # files.checkpointer.save, files.writers[i].write

On leaving the block, normally or by an exception (a failing step, Ctrl-C), the bar, the metrics files and the
checkpointer are closed: the asynchronous checkpoint writes started so far complete, so the newest saved step is
loadable and the metrics lines written so far are on disk.
"""
from __future__ import annotations

import contextlib
import os
from typing import Any, Callable, Sequence

import tqdm

from ragen_jax import distributed
from ragen_jax.train.checkpoint import Checkpointer
from ragen_jax.train.metrics import MetricsWriter


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

    def progress_bar(self, initial: int, desc: str) -> tqdm.tqdm:
        """A bar to `train.total_steps` (shown when `logging.progress_bar` is on, on the main process)."""
        bar = tqdm.tqdm(total=self.config.train.total_steps, initial=initial, desc=desc, unit="step",
                        disable=not (self.config.logging.progress_bar and self.main))
        self.callback(bar.close)
        return bar


def start_over(checkpointer: Checkpointer | None, writers: Sequence[MetricsWriter]) -> None:
    """Empties the folders of a run that starts from step 0: an earlier run's checkpoints (which would block this
    run's saves) and metrics lines (which it would append to)."""
    if checkpointer is not None:
        checkpointer.clear()
    for writer in writers:
        if writer.path is not None and os.path.exists(writer.path):
            writer.truncate_after(-1)

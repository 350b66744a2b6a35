"""Per-phase timings (`logging.phase_timings`): the training step run as its four phases (`train.step.PHASES`), each
its own jitted, timed program, with the one-program step's results.

    phased = PhasedStep(train_step, state_sharding, replicated)
    (state, metrics, sample), timing = phased(state, key, hyper)      # as Timed(jax.jit(train_step.with_transcripts))
    # timing: timing_s/rollout, timing_s/diagnostics, timing_s/prepare, timing_s/update, and timing_s/step (their
    # sum); on the first call also timing_s/lower_<phase> and timing_s/compile_<phase>

Why opt-in. The default step is ONE XLA program (docs/architecture.md): no host round trip between phases, one
dispatch, and XLA is free to fuse and schedule across them; a phase inside it cannot be timed from the host. RAGEN's
`timing_s/gen`, `old_log_prob`, `update_actor`, ... come from a trainer that runs its phases one by one; this class
does the same to measure them: the phases are the same pure functions the one-program step calls
(`TrainStep.with_transcripts`), jitted apart, their intermediates (the Trajectory, the prepared update rows) kept on
the device between them. Costs: four compilations instead of one, a dispatch and a device-to-host wait per phase,
and no fusion across phase boundaries. The metrics are the one-program step's (tests/train/test_step.py compares them
at float32 rounding: XLA may fuse the separate programs differently); only timing_s/ and perf/ differ.

Which work falls in which phase: rollout = generation and the environments (and the transcripts' rows); diagnostics
= the collapse diagnostics (a trivial program on steps without them); prepare = old / reference log-probs, values,
episode scores, the filter, token rewards and advantages; update = the gradient analysis (on its schedule), the critic
and actor updates. Single runs only (a vectorised sweep refuses `logging.phase_timings`).
"""
from __future__ import annotations

from typing import Any

import jax

from ragen_jax.train.host import Timed
from ragen_jax.train.hyper import Hyper
from ragen_jax.train.step import PHASES, TrainState, TrainStep


class PhasedStep:
    """`train_step.with_transcripts` as four timed programs (module doc); the update phase donates the state.

    Args:
      train_step: the TrainStep; state_sharding: the TrainState's shardings (the update phase's output keeps them,
        so every step's state has the first call's layout); replicated: a replicated sharding (the new state's
        metrics); transform: `(phase name, fn) -> fn` applied before jitting each phase (a sweep's vmap,
        `train.sweep.Sweep.phased_step`); None keeps the phases as they are.
    """

    def __init__(self, train_step: TrainStep, state_sharding: Any, replicated: Any, transform=None):
        self.train_step = train_step
        self.transform = transform or (lambda name, fn: fn)
        self.programs: dict[str, Timed] = {}
        self.options = {name: {} for name in PHASES}
        self.options["update"] = {"donate_argnums": 0, "out_shardings": (state_sharding, replicated)}

    def __call__(self, state: TrainState, key: jax.Array, hyper: Hyper) -> tuple[tuple, dict[str, float]]:
        timing: dict[str, float] = {}

        def phase(name: str, fn, *args):
            if name not in self.programs:
                self.programs[name] = Timed(jax.jit(self.transform(name, fn), **self.options[name]), name)
            out, phase_timing = self.programs[name](*args)
            timing.update(phase_timing)
            return out

        out = self.train_step.with_transcripts(state, key, hyper, phase)
        timing["timing_s/step"] = sum(timing[f"timing_s/{name}"] for name in PHASES)
        return out, timing

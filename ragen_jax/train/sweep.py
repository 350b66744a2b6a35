"""Vectorised sweeps: S runs that differ only in traced values, trained by ONE compiled step (docs/architecture.md,
design rule 3).

    points = grid({"filter.value": [0.25, 0.5, 1.0], "train.seed": [0, 1]})     # 6 members
    state, histories = Sweep(config, points).run()                              # histories[i]: member i's rows

Each member is `config` with its overrides (keys from `train.hyper.SWEEPABLE`: values that live in the step's
`Hyper`, the env's params, the seed, or the host-side early-stop rules). The members' Hypers, step keys and
TrainStates are stacked along a leading axis, the step is vmapped over it (`sharding.vmap_members`: vmap axis and
`spmd_axis_name` "sweep"), and the mesh's `sweep` axis splits the members over devices (`mesh.sweep` must divide S;
data x fsdp split each member's batch as in a single run). With `mesh.sweep_loop_phases` (members on one device) the
phases it names run member after member in the same program instead (`Sweep.over_members`, `lax.map`). Member i
computes exactly what `train(member_config)` would (up to float reduction order): same initial parameters (the SFT
warm start runs once per distinct seed), same keys, so members with equal seeds see common random numbers. The host
loop is the single run's (`train.loop.HostLoop`); `Sweep` gives it the stacked layout.

Differences from S separate runs, by construction of vmap: the step counter is shared (all members run
`train.total_steps` unless stopped); a branch that some member takes runs for all and is discarded for the others by
a select (`sharding.sweep_max`). Early stops (docs/filtering.md#early-stops) apply per member: a stopped member's state
is held from then on and its rows end (`<logging.dir>/sweep.json` lists each stop); the sweep ends when every member has
stopped or at `train.total_steps`. Metrics go to `<logging.dir>/<member name>/metrics.jsonl`, transcripts of each
member's validation rollout and training batch to `<logging.dir>/<member name>/samples/` (`train.transcripts`; the
step returns the members' training rows with a leading member axis); checkpoints
(`checkpoint.dir`) hold the stacked state. Timings as in `train.loop`: `timing_s/step` and the compile times are the
shared step's (the same in every member's row), `perf/generated_tokens` each member's own tokens (their sum over the
members is what the step generated). Metrics come back replicated, so the host loop also runs multi-host as
`train.loop.train` does (tested there for single runs only). A sweep that fails mid-way leaves its newest checkpoint
loadable and its metrics on disk (tests/train/test_host.py).
"""
from __future__ import annotations

import functools
import itertools
import json
import os
from typing import Any, Callable, Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from environments.pytrees import tree_select
from ragen_jax import config as config_lib
from ragen_jax import distributed, sharding
from ragen_jax import metrics as metrics_lib
from ragen_jax.config import apply_overrides
from ragen_jax.train.build import build_env
from ragen_jax.train.early_stops import EarlyStops
from ragen_jax.train.loop import HostLoop
from ragen_jax.train.phases import PhasedStep
from ragen_jax.train.hyper import SWEEPABLE, Hyper
from ragen_jax.train.step import TrainState

ZIP = "/"  # joins the keys of a zipped axis: {"a/b": [(1, 2), (3, 4)]} varies a and b together


def grid(axes: Mapping[str, Sequence[Any]]) -> list[dict[str, Any]]:
    """The cartesian product of `{key: values}` as a list of override dicts (the last key varies fastest). A key
    `"a/b"` is a zipped axis: each of its values is a tuple `(value of a, value of b)`, so a and b vary together
    (e.g. the arms of a study, each a combination of settings)."""
    for key, values in axes.items():
        width = len(key.split(ZIP))
        if width > 1 and any(not isinstance(v, tuple) or len(v) != width for v in values):
            raise ValueError(f"sweep axis {key!r} zips {width} keys: each value must be a tuple of {width}, "
                             f"got {list(values)}")

    def point(combination) -> dict[str, Any]:
        overrides = {}
        for key, value in zip(axes, combination):
            overrides.update(zip(key.split(ZIP), value) if ZIP in key else {key: value})
        return overrides

    return [point(combination) for combination in itertools.product(*axes.values())]


def member_name(overrides: Mapping[str, Any]) -> str:
    """A directory-safe name of one member, e.g. `filter.value=0.5,train.seed=1` (`base` when empty)."""
    return ",".join(f"{k}={v}" for k, v in overrides.items()) or "base"


def stack(trees: Sequence[Any]) -> Any:
    """Stacks equal-structure pytrees along a new leading axis."""
    return jax.tree.map(lambda *xs: jnp.stack(xs), *trees)


def unstack(tree: Any, index: int) -> Any:
    return jax.tree.map(lambda x: x[index], tree)


def member_of(tree: Any, axes: Any, index) -> Any:
    """Member `index` of a stacked `tree` whose vmap `axes` (a prefix tree of 0 and None) say which parts are
    stacked (0) and which are shared (None, kept as they are)."""
    return jax.tree.map(lambda axis, sub: sub if axis is None else unstack(sub, index), axes, tree,
                        is_leaf=lambda x: x is None)


class Sweep(HostLoop):
    """S members of one config (see module doc) trained by the host loop (`train.loop.HostLoop`) with the vmapped
    step; `run()` trains them, the other members serve tests and tools.

    Args:
      config: the base config; points: one override dict per member (`grid` builds a grid);
      log: where progress lines go (None: silent).
    Raises:
      ConfigError: a key outside SWEEPABLE, an invalid member config, or `mesh.sweep` not dividing S.
    """

    desc = "sweep"

    def __init__(self, config, points: Sequence[Mapping[str, Any]], log: Callable[[str], None] | None = print):
        if not points:
            raise config_lib.ConfigError("sweep points", points, "need at least one member")
        for point in points:
            for key in point:
                if key not in SWEEPABLE:
                    raise config_lib.ConfigError(key, point[key], f"not sweepable in one compiled step "
                                                 f"(structural); sweepable keys: {', '.join(SWEEPABLE)}")
        self.points = [dict(p) for p in points]
        configs = [config_lib.validate(apply_overrides(config, p)) for p in self.points]
        self.names = [member_name(p) for p in self.points]
        if config.logging.phase_timings:
            raise config_lib.ConfigError("logging.phase_timings", True, "a vectorised sweep runs its step as one "
                                         "program; per-phase timings are for single runs (train.phases)")
        if len(self.points) % config.mesh.sweep:
            raise config_lib.ConfigError("mesh.sweep", config.mesh.sweep,
                                         f"must divide the {len(self.points)} sweep members")
        self.loop_phases = config_lib.loop_phases(config)
        super().__init__(config, configs, log)
        env_params = [build_env(c, self.parts.tokenizer)[1] for c in self.configs]
        self.hypers = [Hyper.from_config(c, p) for c, p in zip(self.configs, env_params)]

    def run(self) -> tuple[TrainState, list[list[dict]]]:
        """Trains every member for `train.total_steps` steps or until it stops early (`<logging.dir>/sweep.json`
        lists the stops). Returns (stacked final state, metrics rows per member)."""
        state, histories, fired = self.loop()
        lg = self.config.logging
        if lg.dir and distributed.is_main_process():
            with open(os.path.join(lg.dir, metrics_lib.SWEEP_FILE), "w", encoding="utf-8") as f:
                json.dump({"members": self.points, "names": self.names, "early_stop": fired}, f, indent=1)
        return state, histories

    @staticmethod
    def stack_states(states: Sequence[TrainState]) -> TrainState:
        """Member states stacked along a leading axis, the shared step counter kept a scalar. Every leaf is a new
        buffer (the step donates the stacked state; the members' states stay usable)."""
        return stack(states).replace(step=jnp.array(states[0].step))

    def _state_axes(self, state: TrainState) -> TrainState:
        """vmap axes of a stacked state: the step counter is shared, everything else has the member axis."""
        return jax.tree.map(lambda _: 0, state).replace(step=None)

    def hyper(self) -> tuple[Hyper, Hyper, Hyper]:
        """(hyper, vmap axes, shardings): leaves that differ between members stacked (axis 0, split over the mesh's
        sweep axis), shared ones kept as they are (axis None, replicated), so what is not swept stays unbatched and
        its branches stay real branches under vmap."""
        leaves = [jax.tree.leaves(h) for h in self.hypers]
        treedef = jax.tree.structure(self.hypers[0])
        shared = [all(np.array_equal(np.asarray(ls[i]), np.asarray(leaves[0][i])) for ls in leaves)
                  for i in range(len(leaves[0]))]
        values = [leaves[0][i] if same else jnp.stack([ls[i] for ls in leaves]) for i, same in enumerate(shared)]
        members, replicated = self._members_sharding(), sharding.replicated(self.mesh)
        return (treedef.unflatten(values), treedef.unflatten([None if same else 0 for same in shared]),
                treedef.unflatten([replicated if same else members for same in shared]))

    def member_step(self, state: TrainState, key: jax.Array, hyper: Hyper, stopped: jax.Array):
        """One member's step, (state, metrics, its training batch's transcripts.Sample); a member that has stopped
        early (bool[] `stopped`) keeps its state (its metrics and sample are computed but not logged), so it ends
        where a separate run would have ended."""
        new_state, metrics, sample = self.train_step.with_transcripts(state, key, hyper)
        held = tree_select(stopped, state, new_state)
        return held.replace(step=new_state.step), metrics, sample  # the shared counter moves on

    def step_fn(self, abstract_state: TrainState):
        """The jitted step of every member over (stacked state, stacked step keys, `hyper()[0]`, stopped bool[S]),
        sharded on the mesh: `member_step` vmapped, or with `mesh.sweep_loop_phases` its phases each vmapped or
        looped over the members (`over_members`)."""
        axes = self._state_axes(abstract_state)
        _, hyper_axes, hyper_sharding = self.hyper()
        if self.loop_phases:
            def stepped(state, keys, hyper, stopped):
                def phase(name, fn, *args):
                    return self.over_members(name, fn, axes, hyper_axes)(*args)
                new_state, metrics, sample = self.train_step.with_transcripts(state, keys, hyper, phase)
                held = jax.vmap(tree_select)(stopped, state.replace(step=None), new_state.replace(step=None))
                return held.replace(step=new_state.step), metrics, sample
        else:
            stepped = sharding.vmap_members(self.member_step, in_axes=(axes, 0, hyper_axes, 0), out_axes=(axes, 0, 0))
        state_sharding, replicated = self.state_sharding(abstract_state), sharding.replicated(self.mesh)
        members = self._members_sharding()
        # metrics (a few scalars per member) and samples (a few rows per member): replicated, every process can read
        # them (multi-host)
        return jax.jit(stepped, in_shardings=(state_sharding, members, hyper_sharding, members),
                       out_shardings=(state_sharding, replicated, replicated), donate_argnums=0)

    def phased_step(self, abstract_state: TrainState) -> PhasedStep:
        """The vmapped step as four timed programs, called as (stacked state, stacked step keys, `hyper()[0]`), for
        measuring the phases of a sweep (`train.phases`; experiments/benchmarks/study_throughput.py). Every member
        steps: the host loop's per-member early stops need the fused `step_fn`, which holds a stopped member."""
        axes = self._state_axes(abstract_state)
        _, hyper_axes, _ = self.hyper()
        return PhasedStep(self.train_step, self.state_sharding(abstract_state), sharding.replicated(self.mesh),
                          lambda name, fn: self.over_members(name, fn, axes, hyper_axes))

    def over_members(self, name: str, fn, axes: TrainState, hyper_axes: Hyper):
        """Phase `fn(state, key, hyper, *inputs)` (`train.step.PHASES`) of every member: vmapped, or, for a phase in
        `mesh.sweep_loop_phases`, one member after another (`lax.map`). A loop runs each member's matmuls at its
        own shapes, where vmap turns them into batched matmuls with per-member weights, which the CPU runs at a
        lower rate (docs/performance.md#the-ppo-study-sweep-a-member-costs-14x-a-single-run). The update phase's
        new state keeps the shared step counter unbatched."""
        def run(state, key, hyper, *inputs):
            in_axes = (axes, 0, hyper_axes, *[0] * len(inputs))
            operands = (state, key, hyper, *inputs)
            if name not in self.loop_phases:
                out_axes = (axes, 0) if name == "update" else 0
                return sharding.vmap_members(fn, in_axes=in_axes, out_axes=out_axes)(*operands)
            out = jax.lax.map(lambda i: fn(*member_of(operands, in_axes, i)), jnp.arange(self.size))
            if name == "update":
                new_state, metrics = out
                return new_state.replace(step=new_state.step[0]), metrics
            return out
        return run

    def _members_sharding(self):
        return jax.sharding.NamedSharding(self.mesh, jax.sharding.PartitionSpec(sharding.SWEEP_AXIS))

    def state_sharding(self, abstract_state: TrainState) -> TrainState:
        shardings = sharding.state_shardings(abstract_state, self.mesh, stacked=True)
        return shardings.replace(step=sharding.replicated(self.mesh))

    # --- the host loop's hooks (train.loop.HostLoop) ------------------------------------------------------------
    def banner(self) -> str:
        return f"sweep of {self.size} members on mesh {dict(self.mesh.shape)}: {', '.join(self.names)}"

    def log_dirs(self) -> list[str | None]:
        lg = self.config.logging
        return [os.path.join(lg.dir, name) if lg.dir else None for name in self.names]

    def label(self, member: int) -> str:
        return f"[{self.names[member]}] "

    def combine(self, states: Sequence[TrainState]) -> TrainState:
        return self.stack_states(states)

    def split(self, tree: Any) -> list[Any]:
        return [unstack(tree, i) for i in range(self.size)]

    @functools.cached_property
    def _step_inputs(self) -> tuple[jax.Array, Hyper]:
        """(stacked step keys, `hyper()[0]`) on the mesh."""
        hyper, _, hyper_sharding = self.hyper()
        return (jax.device_put(jnp.stack([k[2] for k in self.keys]), self._members_sharding()),
                jax.device_put(hyper, hyper_sharding))

    def step_args(self, stopped: list[bool]) -> tuple:
        return *self._step_inputs, jax.device_put(np.array(stopped), self._members_sharding())

    def validate_fn(self, validate):
        return jax.jit(sharding.vmap_members(validate), out_shardings=sharding.replicated(self.mesh))

    def checkpoint_extra(self, stops: list[EarlyStops], fired: list[dict], rows: dict[int, dict]) -> dict:
        return {"early_stop": [s.to_json() for s in stops], "fired": fired, "members": self.names}

    def load_extra(self, extra: dict, stops: list[EarlyStops]) -> list[dict]:
        for member_stops, saved in zip(stops, extra["early_stop"]):
            member_stops.load_json(saved)
        return extra["fired"]

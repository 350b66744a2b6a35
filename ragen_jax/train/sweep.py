"""Vectorised sweeps: S runs that differ only in traced values, trained by ONE compiled step (docs/architecture.md,
design rule 3).

    points = grid({"filter.value": [0.25, 0.5, 1.0], "train.seed": [0, 1]})     # 6 members
    state, histories = Sweep(config, points).run()                              # histories[i]: member i's rows

Each member is `config` with its overrides (keys from `SWEEPABLE`: values that live in the step's `Hyper`, the env's
params, the seed, or the host-side early-stop rules). The members' Hypers, step keys and TrainStates are stacked
along a leading axis, the step is `jax.vmap`-ed over it with `spmd_axis_name="sweep"`, and the mesh's `sweep` axis
splits the members over devices (`mesh.sweep` must divide S; data x fsdp split each member's batch as in a single
run). Member i computes exactly what `train(member_config)` would (up to float reduction order): same initial parameters (the SFT warm start runs
once per distinct seed), same keys, so members with equal seeds see common random numbers.

Differences from S separate runs, by construction of vmap: the step counter is shared (all members run
`train.total_steps` unless stopped); a branch that some member takes runs for all and is discarded for the others by
a select (`sharding.sweep_max`). Early stops (docs/filtering.md#early-stops) apply per member: a stopped member's state
is held from then on and its rows end (`<logging.dir>/sweep.json` lists each stop); the sweep ends when every member has
stopped or at `train.total_steps`. Metrics go to `<logging.dir>/<member name>/metrics.jsonl`, transcripts of each
member's validation rollout to `<logging.dir>/<member name>/samples/` (`train.transcripts`); checkpoints
(`checkpoint.dir`) hold the stacked state. Timings as in `train.loop`: `timing_s/step` and the compile times are the
shared step's (the same in every member's row), `perf/generated_tokens` each member's own tokens (their sum over the
members is what the step generated). Metrics come back replicated, so the host loop also runs multi-host as
`train.loop.train` does (tested there for single runs only).
"""
from __future__ import annotations

import itertools
import json
import os
from typing import Any, Callable, Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from environments.pytrees import tree_select
from ragen_jax import config as config_lib
from ragen_jax import compile_cache, distributed, sharding
from ragen_jax import metrics as metrics_lib
from ragen_jax.algos.presets import apply_overrides
from ragen_jax.train import transcripts, validation
from ragen_jax.train.build import build, build_env
from ragen_jax.train.early_stops import EarlyStops
from ragen_jax.train.host import RunFiles, Timed
from ragen_jax.train.loop import initial_params, log_compile, make_validator, run_keys, summary_keys
from ragen_jax.train.metrics import summary_line, throughput, to_floats
from ragen_jax.train.step import Hyper, TrainState, TrainStep

SWEEPABLE = ("filter.value", "filter.eps", "algo.gamma", "algo.lam", "algo.high_level_gamma", "algo.kl_coef",
             "algo.kl_loss_coef", "algo.entropy_coeff", "algo.clip_ratio_low", "algo.clip_ratio_high",
             "algo.clip_ratio_c", "algo.value_clip", "algo.zero_task_advantage", "optim.actor_lr", "optim.critic_lr",
             "rollout.temperature", "rollout.top_p", "env.success_rate", "train.seed",
             # host-side early-stop rules (docs/filtering.md#early-stops), applied per member
             "filter.empty_stop_steps", "filter.rv_collapse_window", "filter.rv_collapse_ratio",
             "filter.val_success_floor", "filter.val_success_patience")


def grid(axes: Mapping[str, Sequence[Any]]) -> list[dict[str, Any]]:
    """The cartesian product of `{key: values}` as a list of override dicts (the last key varies fastest)."""
    keys = list(axes)
    return [dict(zip(keys, values)) for values in itertools.product(*(axes[k] for k in keys))]


def member_name(overrides: Mapping[str, Any]) -> str:
    """A directory-safe name of one member, e.g. `filter.value=0.5,train.seed=1` (`base` when empty)."""
    return ",".join(f"{k}={v}" for k, v in overrides.items()) or "base"


def stack(trees: Sequence[Any]) -> Any:
    """Stacks equal-structure pytrees along a new leading axis."""
    return jax.tree.map(lambda *xs: jnp.stack(xs), *trees)


def unstack(tree: Any, index: int) -> Any:
    return jax.tree.map(lambda x: x[index], tree)


class Sweep:
    """S members of one config (see module doc); `run()` trains them, the other members serve tests and tools.

    Args:
      config: the base config; points: one override dict per member (`grid` builds a grid);
      log: where progress lines go (None: silent).
    Raises:
      ConfigError: a key outside SWEEPABLE, an invalid member config, or `mesh.sweep` not dividing S.
    """

    def __init__(self, config, points: Sequence[Mapping[str, Any]], log: Callable[[str], None] | None = print):
        if not points:
            raise config_lib.ConfigError("sweep points", points, "need at least one member")
        for point in points:
            for key in point:
                if key not in SWEEPABLE:
                    raise config_lib.ConfigError(key, point[key], f"not sweepable in one compiled step "
                                                 f"(structural); sweepable keys: {', '.join(SWEEPABLE)}")
        self.config, self.points = config, [dict(p) for p in points]
        self.log = log if distributed.is_main_process() else None
        self.configs = [config_lib.validate(apply_overrides(config, p)) for p in self.points]
        self.names = [member_name(p) for p in self.points]
        if len(self.points) % config.mesh.sweep:
            raise config_lib.ConfigError("mesh.sweep", config.mesh.sweep,
                                         f"must divide the {len(self.points)} sweep members")
        compile_cache.enable(config.logging.compilation_cache)
        self.mesh = sharding.make_mesh(config)
        self.parts = build(config)
        self.train_step = TrainStep(config, self.parts.env, self.parts.tokenizer, self.parts.model_config,
                                    self.parts.chat_format)
        env_params = [build_env(c, self.parts.tokenizer)[1] for c in self.configs]
        self.hypers = [Hyper.from_config(c, p) for c, p in zip(self.configs, env_params)]
        self.keys = [run_keys(c.train.seed) for c in self.configs]  # (init, sft, step) per member

    @property
    def size(self) -> int:
        return len(self.points)

    def initial_states(self) -> list[TrainState]:
        """Each member's state before step 1 (one SFT warm start per distinct seed)."""
        params_by_seed = {}
        states = []
        for c, (init_key, sft_key, _) in zip(self.configs, self.keys):
            if c.train.seed not in params_by_seed:
                params_by_seed[c.train.seed] = initial_params(c, self.parts, self.train_step, sft_key, self.log)
            states.append(self.train_step.init(init_key, params_by_seed[c.train.seed]))
        return states

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
        """One member's step; a member that has stopped early (bool[] `stopped`) keeps its state (its metrics are
        computed but not logged), so it ends where a separate run would have ended."""
        new_state, metrics = self.train_step(state, key, hyper)
        held = tree_select(stopped, state, new_state)
        return held.replace(step=new_state.step), metrics  # the shared counter moves on

    def step_fn(self, abstract_state: TrainState):
        """The jitted, vmapped `member_step` over (stacked state, stacked step keys, `hyper()[0]`, stopped
        bool[S]), sharded on the mesh."""
        axes = self._state_axes(abstract_state)
        _, hyper_axes, hyper_sharding = self.hyper()
        vmapped = jax.vmap(self.member_step, in_axes=(axes, 0, hyper_axes, 0), out_axes=(axes, 0),
                           axis_name=sharding.SWEEP_AXIS, spmd_axis_name=sharding.SWEEP_AXIS)
        state_sharding = self.state_sharding(abstract_state)
        members = self._members_sharding()
        # metrics are a few scalars per member: replicated, every process can read them (multi-host)
        return jax.jit(vmapped, in_shardings=(state_sharding, members, hyper_sharding, members),
                       out_shardings=(state_sharding, sharding.replicated(self.mesh)), donate_argnums=0)

    def _members_sharding(self):
        return jax.sharding.NamedSharding(self.mesh, jax.sharding.PartitionSpec(sharding.SWEEP_AXIS))

    def state_sharding(self, abstract_state: TrainState) -> TrainState:
        shardings = sharding.state_shardings(abstract_state, self.mesh, stacked=True)
        return shardings.replace(step=sharding.replicated(self.mesh))

    def run(self) -> tuple[TrainState, list[list[dict]]]:
        """Trains every member for `train.total_steps` steps or until it stops early. Returns (stacked final state,
        metrics rows per member)."""
        lg, total = self.config.logging, self.config.train.total_steps
        validate_fn, success_keys = make_validator(self.config, self.parts)
        keys = summary_keys(self.config) + tuple(success_keys)
        batch_size = self.config.rollout.num_groups * self.config.rollout.group_size
        stops = [EarlyStops(cfg.filter, len(success_keys)) for cfg in self.configs]
        fired: list[dict[str, Any]] = [{} for _ in self.names]
        self._log(f"sweep of {self.size} members on mesh {dict(self.mesh.shape)}: {', '.join(self.names)}")
        log_dirs = [os.path.join(lg.dir, name) if lg.dir else None for name in self.names]
        with RunFiles(self.config, log_dirs) as files, jax.set_mesh(self.mesh):
            writers, checkpointer = files.writers, files.checkpointer
            states = self.initial_states()
            abstract = jax.eval_shape(self.stack_states, states)
            state_sharding = self.state_sharding(abstract)
            state, extra = files.restore_or_start(sharding.with_shardings(abstract, state_sharding),
                                                  lambda: jax.device_put(self.stack_states(states), state_sharding),
                                                  self.log)
            if extra is not None:
                for member_stops, saved in zip(stops, extra["early_stop"]):
                    member_stops.load_json(saved)
                fired = extra["fired"]
            step_fn = Timed(self.step_fn(abstract), "step")
            step_keys = jax.device_put(jnp.stack([k[2] for k in self.keys]), self._members_sharding())
            hyper, _, hyper_sharding = self.hyper()
            hyper = jax.device_put(hyper, hyper_sharding)
            vmapped_eval = None
            if validate_fn is not None:
                vmapped_eval = Timed(jax.jit(jax.vmap(validate_fn, axis_name=sharding.SWEEP_AXIS,
                                                      spmd_axis_name=sharding.SWEEP_AXIS),
                                             out_shardings=sharding.replicated(self.mesh)), "testing")
            histories: list[list[dict]] = [[] for _ in self.names]
            progress = files.progress(int(state.step), "sweep", self.log)
            if int(state.step) == 0:
                rows = {i: {} for i in range(self.size)}
                if self._validate(vmapped_eval, state, 0, rows, writers, stops, fired, success_keys, progress):
                    for i, row in rows.items():
                        writers[i].write(0, row, force=True)
                        progress.write(f"[{self.names[i]}] " + summary_line(0, row, success_keys))
            while int(state.step) < total and not all(fired):
                stopped = [bool(f) for f in fired]
                (state, metrics), timing = step_fn(state, step_keys, hyper,
                                                   jax.device_put(np.array(stopped), self._members_sharding()))
                log_compile(progress, timing)
                step = int(state.step)
                metrics = jax.device_get(metrics)  # one transfer for all members
                rows = {i: {**to_floats(unstack(metrics, i)), **timing} for i in range(self.size) if not stopped[i]}
                for i, row in rows.items():
                    row.update(throughput(row, self.config.env.name, batch_size))
                    self._stop(fired, i, step, stops[i].after_step(row), progress)
                validated = self._validate(vmapped_eval, state, step, rows, writers, stops, fired, success_keys,
                                           progress)
                for i, row in rows.items():
                    histories[i].append(row)
                    writers[i].write(step, row, force=validated)
                progress.update({k: float(np.mean([row[k] for row in rows.values()])) for k in rows[min(rows)]},
                                "\n".join(f"[{self.names[i]}] " + summary_line(step, row, keys)
                                          for i, row in rows.items()), validated)
                if checkpointer is not None:
                    extra = {"early_stop": [s.to_json() for s in stops], "fired": fired, "members": self.names}
                    checkpointer.save(step, state, extra, force=step == total or all(fired))
            if lg.dir and files.main:
                with open(os.path.join(lg.dir, metrics_lib.SWEEP_FILE), "w", encoding="utf-8") as f:
                    json.dump({"members": self.points, "names": self.names, "early_stop": fired}, f, indent=1)
        return state, histories

    def _validate(self, vmapped_eval, state, step, rows, writers, stops, fired, success_keys, progress) -> bool:
        """Validates the members in `rows` ({member: row}) and writes their transcripts, when due after `step`;
        merges the metrics and timings into `rows`. Returns whether it validated."""
        c = self.config
        validating = validation.should_validate(step, c.train.test_freq, c.train.total_steps)
        sampling = transcripts.due(step, c.logging.samples_every)
        if vmapped_eval is None or not (validating or sampling):
            return False
        (val, sample), timing = vmapped_eval(state.actor)
        log_compile(progress, timing)
        val, sample = jax.device_get((val, sample))
        for i, row in rows.items():
            row.update(timing)
            if validating:
                row.update(to_floats(unstack(val, i)))
                self._stop(fired, i, step, stops[i].after_validation([row[k] for k in success_keys]), progress)
            if sampling:
                transcripts.write(writers[i].directory, step,
                                  transcripts.records(unstack(sample, i), self.parts.tokenizer))
        return validating

    def _stop(self, fired: list[dict], member: int, step: int, reason: str | None, progress) -> None:
        """Records a member's first early stop (docs/filtering.md#early-stops): from the next step on its state is
        held."""
        if reason is not None and not fired[member]:
            fired[member].update(step=step, reason=reason)
            progress.write(f"[{self.names[member]}] early stop at step {step}: {reason} "
                           "(docs/filtering.md#early-stops)")

    def _log(self, text: str) -> None:
        if self.log is not None:
            self.log(text)

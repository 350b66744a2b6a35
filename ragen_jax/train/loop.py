"""The host loop around the compiled step: build, warm start or resume, step, validate, log, checkpoint, stop early.

    state, history = train(config)          # config from `ragen_jax.config.load` or a configs/*.py file

One host loop (`HostLoop.loop`) trains S >= 1 members of one config; a single run (`train`, `SingleRun`) is its
one-member case and runs the plain step, a vectorised sweep (`ragen_jax.train.sweep.Sweep`) its vmapped one. Only this
loop touches the host: it logs the step's metrics (console, `<logging.dir>/metrics.jsonl`, TensorBoard), validates the
actor before training and every `train.test_freq` steps (`train.validation`, metrics under `val-env/` in the same
step's row; step 0 is the untrained policy), saves checkpoints every `checkpoint.save_freq` steps and at the end, and
runs RAGEN's early stops per member (docs/filtering.md#early-stops, `train.early_stops`); unlike RAGEN, which stops
before that step's actor update, the step has already updated when the loop sees its metrics. The stop states travel
in the checkpoints. The step key is the same every step (the step folds its own counter in), so a resumed run repeats
an uninterrupted one exactly. The files, the resume-or-start decision and the console progress are
`train.host.RunFiles`, closed on any exit (a failing step too); a fresh start warm-starts (SFT) once per distinct seed,
a resumed one does not.

Every `logging.samples_every` steps (step 0 included) the validation rollout's first trajectories are decoded to
`<logging.dir>/samples/step_N.jsonl` (`train.transcripts`; the rollout runs once for a step that also validates), and
the training batch's first ones, which the step returns beside its metrics, to `samples/train_step_N.jsonl`.
Timings and throughput, RAGEN's families, in each step's row: `timing_s/step` (the compiled step, until its outputs
are ready), `timing_s/testing` (the validation rollout, transcripts included), and on the process's first call of
each program `timing_s/lower_step` / `timing_s/compile_step` (and `_testing`): tracing + lowering, and XLA's
compilation, timed apart by compiling ahead of time (`train.host.Timed`); `perf/generated_tokens` and
`perf/generated_tokens_per_s` (over `timing_s/step`). With `logging.phase_timings` a single run's step runs as four
programs (`train.phases.PhasedStep`, same metrics), adding `timing_s/rollout`, `timing_s/diagnostics`,
`timing_s/prepare` and `timing_s/update` (`timing_s/step` is their sum; lower/compile times per phase). The
persistent compilation cache (`logging.compilation_cache`, `ragen_jax.compile_cache`) is enabled first, so a resumed
or repeated run loads the compiled programs instead of compiling them.

The step runs on the mesh of `config.mesh` (`ragen_jax.sharding`): the batch split over data x fsdp, parameters
and optimizer states split over fsdp; with one device that is the plain single-device step. Vectorised sweeps
(`mesh.sweep` > 1) run through `ragen_jax.train.sweep`. Multi-host: `ragen_jax.distributed.initialize()` first,
then the same call on every process; only process 0 logs and writes metrics.
"""
from __future__ import annotations

from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from ragen_jax import config as config_lib
from ragen_jax import compile_cache, distributed, sharding
from ragen_jax.diagnostics import faithfulness
from ragen_jax.train import sft, transcripts, validation
from ragen_jax.train.build import build
from ragen_jax.train.early_stops import EarlyStops
from ragen_jax.train.host import RunFiles, Timed
from ragen_jax.train.own_reasoning import OwnReasoning
from ragen_jax.train.phases import PhasedStep
from ragen_jax.train.metrics_log import summary_line, throughput, to_floats
from ragen_jax.train.hyper import Hyper
from ragen_jax.train.step import TrainState, TrainStep
from ragen_jax.train.validation import Validator

SUMMARY_KEYS = ("success", "episode_reward", "rollout/in_group_reward_std", "rollout/filter_kept_ratio",
                "actor/entropy", "collapse_first_turn_sample/mi_estimate", "collapse_first_turn_sample/mi_zscore",
                "collapse_trajectory_sample/mi_estimate", "timing_s/step", "perf/generated_tokens_per_s")
# validation runs at RAGEN's `val_kwargs` top_p of 1.0, not the training top_p
VALIDATION_TOP_P = 1.0


def run_keys(seed: int) -> tuple[jax.Array, jax.Array, jax.Array]:
    """(init_key, sft_key, step_key) of a run with `train.seed` = seed."""
    return tuple(jax.random.split(jax.random.key(seed), 3))


def summary_keys(config) -> tuple[str, ...]:
    return tuple(f"{config.env.name}/{k}" if "/" not in k else k for k in SUMMARY_KEYS)


def initial_params(config, parts, train_step: TrainStep, sft_key: jax.Array, log: Callable[[str], None] | None):
    """The actor's parameters before RL: the built model, warm-started on environment demonstrations when
    `train.sft_steps` > 0 (`train.sft`)."""
    t = config.train
    if t.sft_steps <= 0:
        return parts.params
    rollout = train_step.rollout
    own = None
    if t.sft_reasoning == "own":
        own = OwnReasoning(rollout, parts.params, parts.tokenizer, temperature=config.rollout.temperature,
                           top_p=config.rollout.top_p)
    params, _ = sft.warm_start(rollout, parts.tokenizer, parts.params, parts.env_params, sft_key,
                               t.sft_steps, t.sft_lr, batch_size=t.sft_batch_size or None,
                               oracle_prob=t.sft_oracle_prob, log=log, micro_batch=t.sft_micro_batch_size or None,
                               own=own)
    return params


def starting_model(config, log: Callable[[str], None] | None = print):
    """(parts, params): the built parts (`train.build`) and the parameters a training run with `config` starts RL from
    (its SFT warm start when `train.sft_steps` > 0, with the run's own SFT key)."""
    config_lib.validate(config)
    parts = build(config)
    train_step = TrainStep(config, parts.env, parts.tokenizer, parts.model_config, parts.chat_format)
    return parts, initial_params(config, parts, train_step, run_keys(config.train.seed)[1], log)


def make_validator(config, parts):
    """(validate, its success keys): `validate(params) -> (validation metrics, transcripts.Sample)` runs the
    validation rollout (`train.validation.Validator`, top-p VALIDATION_TOP_P) once for both its metrics and the
    transcripts of its first rows; pure (jit it). (None, []) when neither `train.test_freq` nor
    `logging.samples_every` is on; no success keys without validation (`train.test_freq` <= 0)."""
    if config.train.test_freq <= 0 and config.logging.samples_every <= 0:
        return None, []
    validator = Validator(config, parts.env, parts.tokenizer, parts.model_config, parts.chat_format)
    rows = max(transcripts.COUNT, config.diagnostics.faithfulness_prompts)  # the transcripts', the scorer's

    def validate(params):
        traj, metrics = validator.run(params, parts.env_params, jnp.float32(VALIDATION_TOP_P))
        return metrics, transcripts.select(traj, validator.rollout, count=rows)

    if config.train.test_freq <= 0:
        return validate, []
    return validate, validation.success_keys(jax.eval_shape(validate, parts.params)[0])


def make_faithfulness(config, parts) -> faithfulness.Faithfulness | None:
    """The validation batch's faithfulness scorer (`diagnostics.faithfulness`), or None when
    `diagnostics.faithfulness_prompts` or validation (`train.test_freq`) is off."""
    count = config.diagnostics.faithfulness_prompts
    if count <= 0 or config.train.test_freq <= 0:
        return None
    if not faithfulness.supported(parts.env):
        raise config_lib.ConfigError("diagnostics.faithfulness_prompts", count,
                                     f"the {config.env.name} env lists no facts of its observations (TextEnv.facts)")
    validator = Validator(config, parts.env, parts.tokenizer, parts.model_config, parts.chat_format)
    return faithfulness.Faithfulness(validator, parts.tokenizer, parts.env_params, count)


def compile_line(timing: dict[str, float]) -> str | None:
    """`compiled <name> in 12.3 s (traced and lowered in 1.2 s)` of a `Timed` call's first timing, else None."""
    names = [k.removeprefix("timing_s/compile_") for k in timing if k.startswith("timing_s/compile_")]
    return next((f"compiled {n} in {timing[f'timing_s/compile_{n}']:.1f} s (traced and lowered in "
                 f"{timing[f'timing_s/lower_{n}']:.1f} s)" for n in names), None)


class HostLoop:
    """The host loop over S >= 1 members (`configs`, each the base `config` with its overrides) trained by one
    compiled step. Subclasses say how the members' states and metrics are laid out: `SingleRun` (S = 1, the plain
    step), `train.sweep.Sweep` (a leading member axis, the vmapped step).

    Set up here: the mesh, the built parts (`train.build`), the TrainStep and each member's (init, sft, step) keys
    (`self.keys`); subclasses set `self.hypers` (one `Hyper` per member)."""

    desc = "train"  # the progress bar's label
    hypers: list[Hyper]

    def __init__(self, config, configs: Sequence[Any], log: Callable[[str], None] | None):
        self.config, self.configs = config, list(configs)
        self.log = log if distributed.is_main_process() else None
        compile_cache.enable(config.logging.compilation_cache)
        self.mesh = sharding.make_mesh(config)
        self.parts = build(config)
        self.train_step = TrainStep(config, self.parts.env, self.parts.tokenizer, self.parts.model_config,
                                    self.parts.chat_format)
        self.keys = [run_keys(c.train.seed) for c in self.configs]  # (init, sft, step) per member

    @property
    def size(self) -> int:
        return len(self.configs)

    def initial_states(self) -> list[TrainState]:
        """Each member's state before step 1 (one SFT warm start per distinct seed)."""
        params_by_seed = {}
        states = []
        for c, (init_key, sft_key, _) in zip(self.configs, self.keys):
            if c.train.seed not in params_by_seed:
                params_by_seed[c.train.seed] = initial_params(c, self.parts, self.train_step, sft_key, self.log)
            states.append(self.train_step.init(init_key, params_by_seed[c.train.seed]))
        return states

    # --- the layout of the members, set by subclasses ---------------------------------------------------------
    def banner(self) -> str:
        """The line logged before the run starts."""
        raise NotImplementedError

    def log_dirs(self) -> list[str | None]:
        """Each member's metrics folder (None: none)."""
        raise NotImplementedError

    def label(self, member: int) -> str:
        """The prefix of a member's console lines."""
        raise NotImplementedError

    def combine(self, states: Sequence[TrainState]) -> TrainState:
        """The loop's state from the members' states (`initial_states`)."""
        raise NotImplementedError

    def split(self, tree: Any) -> list[Any]:
        """The members' parts of a host-side output of the step or the validator (one tree per member)."""
        raise NotImplementedError

    def state_sharding(self, abstract_state: TrainState) -> TrainState:
        raise NotImplementedError

    def step_fn(self, abstract_state: TrainState):
        """The jitted step: (state, *step_args(stopped)) -> (state, metrics, the training batch's first rows, a
        transcripts.Sample)."""
        raise NotImplementedError

    def timed_step(self, abstract_state: TrainState):
        """The step as the loop calls it: (state, *step_args(stopped)) -> ((state, metrics, sample), timing);
        `step_fn` compiled ahead of time and timed (`train.host.Timed`)."""
        return Timed(self.step_fn(abstract_state), "step")

    def step_args(self, stopped: list[bool]) -> tuple:
        """The step's arguments after the state, given which members have stopped early."""
        raise NotImplementedError

    def validate_fn(self, validate):
        """The jitted validator of the loop's actor parameters, from `make_validator`'s per-member `validate`."""
        raise NotImplementedError

    def checkpoint_extra(self, stops: list[EarlyStops], fired: list[dict], rows: dict[int, dict]) -> dict:
        """What a checkpoint saves beside the state: the stop states, and `rows` ({member: this step's row})."""
        raise NotImplementedError

    def load_extra(self, extra: dict, stops: list[EarlyStops]) -> list[dict]:
        """Restores `checkpoint_extra`'s stop states into `stops`; returns each member's recorded stop ({} if none)."""
        raise NotImplementedError

    # --- the loop ---------------------------------------------------------------------------------------------
    def loop(self) -> tuple[TrainState, list[list[dict]], list[dict]]:
        """Trains every member for `train.total_steps` steps or until it stops early. Returns (final state, metrics
        rows per member, each member's early stop: {"step", "reason"}, or {} when it ran to the end)."""
        config, total = self.config, self.config.train.total_steps
        validate_fn, success_keys = make_validator(config, self.parts)
        scorer = make_faithfulness(config, self.parts)
        keys = summary_keys(config) + tuple(success_keys)
        batch_size = config.rollout.num_groups * config.rollout.group_size
        stops = [EarlyStops(c.filter, len(success_keys)) for c in self.configs]
        fired: list[dict[str, Any]] = [{} for _ in self.configs]
        self._log(self.banner())
        with RunFiles(config, self.log_dirs()) as files, jax.set_mesh(self.mesh):
            writers, checkpointer = files.writers, files.checkpointer
            init_keys = [k[0] for k in self.keys]
            abstract = jax.eval_shape(
                lambda: self.combine([self.train_step.init(k, self.parts.params) for k in init_keys]))
            state_sharding = self.state_sharding(abstract)
            state, extra = files.restore_or_start(
                sharding.with_shardings(abstract, state_sharding),
                lambda: jax.device_put(self.combine(self.initial_states()), state_sharding), self.log)
            if extra is not None:
                fired = self.load_extra(extra, stops)
            step_fn = self.timed_step(abstract)
            validate = None if validate_fn is None else Timed(self.validate_fn(validate_fn), "testing")
            histories: list[list[dict]] = [[] for _ in self.configs]
            progress = files.progress(int(state.step), self.desc, self.log)

            def validate_into(rows: dict[int, dict], step: int, params, reasons: dict[int, str | None]) -> bool:
                """Validates `params` (the loop's actor) for the members in `rows` ({member: row}) and writes their
                transcripts when due after `step`, the metrics and timings merged into `rows`; a member without a
                stop reason this step yet feeds its success rates to its stops (into `reasons`). Returns whether it
                validated."""
                validating = validation.should_validate(step, config.train.test_freq, total)
                sampling = transcripts.due(step, config.logging.samples_every)
                if validate is None or not (validating or sampling):
                    return False
                (val, sample), timing = validate(params)
                log_compile(progress, timing)
                val, sample = (self.split(x) for x in jax.device_get((val, sample)))
                for i, row in rows.items():
                    row.update(timing)
                    if validating:
                        row.update(to_floats(val[i]))
                        if scorer is not None:
                            row.update(scorer(sample[i]))
                        reasons[i] = reasons.get(i) or stops[i].after_validation([row[k] for k in success_keys])
                    if sampling:
                        write_transcripts(i, step, sample[i], "val")
                return validating

            def write_transcripts(member: int, step: int, sample: transcripts.Sample, batch: str) -> None:
                first = jax.tree.map(lambda x: x[:transcripts.COUNT], sample)  # validation samples hold more rows
                transcripts.write(writers[member].directory, step, transcripts.records(first, self.parts.tokenizer),
                                  batch)

            def record_stops(step: int, reasons: dict[int, str | None]) -> list[str]:
                """Records each member's first early stop; returns their console lines."""
                lines = []
                for i, reason in reasons.items():
                    if reason is not None and not fired[i]:
                        fired[i] = {"step": step, "reason": reason}
                        lines.append(f"{self.label(i)}early stop at step {step}: {reason} "
                                     "(docs/filtering.md#early-stops)")
                return lines

            if int(state.step) == 0:
                rows, reasons = {i: {} for i in range(self.size)}, {}
                if validate_into(rows, 0, state.actor, reasons):
                    for i, row in rows.items():
                        writers[i].write(0, row, force=True)
                        progress.write(self.label(i) + summary_line(0, row, success_keys))
                    for line in record_stops(0, reasons):
                        progress.write(line)
            while int(state.step) < total and not all(fired):
                stopped = [bool(f) for f in fired]
                (state, metrics, sample), timing = step_fn(state, *self.step_args(stopped))
                log_compile(progress, timing)
                step = int(state.step)
                members = self.split(jax.device_get(metrics))  # one transfer for all members
                rows = {i: {**to_floats(m), **timing} for i, m in enumerate(members) if not stopped[i]}
                if transcripts.due(step, config.logging.samples_every):
                    samples = self.split(jax.device_get(sample))
                    for i in rows:
                        write_transcripts(i, step, samples[i], "train")
                reasons = {}
                for i, row in rows.items():
                    row.update(throughput(row, config.env.name, batch_size))
                    reasons[i] = stops[i].after_step(row)
                validated = validate_into(rows, step, state.actor, reasons)
                for i, row in rows.items():
                    histories[i].append(row)
                    writers[i].write(step, row, force=validated)
                progress.update({k: float(np.mean([row[k] for row in rows.values()])) for k in rows[min(rows)]},
                                "\n".join(self.label(i) + summary_line(step, row, keys) for i, row in rows.items()),
                                validated)
                stop_lines = record_stops(step, reasons)
                if checkpointer is not None:
                    checkpointer.save(step, state, self.checkpoint_extra(stops, fired, rows),
                                      force=step == total or all(fired))
                for line in stop_lines:
                    progress.write(line)
        return state, histories, fired

    def _log(self, text: str) -> None:
        if self.log is not None:
            self.log(text)


class SingleRun(HostLoop):
    """One run of `config` (`mesh.sweep` = 1): the plain, un-vmapped step, its metrics under `logging.dir`."""

    def __init__(self, config, log: Callable[[str], None] | None = print):
        config_lib.validate(config)
        if config.mesh.sweep != 1:
            raise config_lib.ConfigError("mesh.sweep", config.mesh.sweep, "a single run uses sweep = 1; vectorised "
                                         "sweeps run through ragen_jax.train.sweep")
        super().__init__(config, [config], log)
        self.hypers = [Hyper.from_config(config, self.parts.env_params)]

    def banner(self) -> str:
        return f"mesh {dict(self.mesh.shape)} over {self.mesh.devices.size} of {jax.device_count()} devices"

    def log_dirs(self) -> list[str | None]:
        return [self.config.logging.dir]

    def label(self, member: int) -> str:
        return ""

    def combine(self, states: Sequence[TrainState]) -> TrainState:
        (state,) = states
        return state

    def split(self, tree: Any) -> list[Any]:
        return [tree]

    def state_sharding(self, abstract_state: TrainState) -> TrainState:
        return sharding.state_shardings(abstract_state, self.mesh)

    def step_fn(self, abstract_state: TrainState):
        state_sharding, replicated = self.state_sharding(abstract_state), sharding.replicated(self.mesh)
        return jax.jit(self.train_step.with_transcripts, in_shardings=(state_sharding, replicated, replicated),
                       out_shardings=(state_sharding, replicated, replicated), donate_argnums=0)

    def timed_step(self, abstract_state: TrainState):
        if not self.config.logging.phase_timings:
            return super().timed_step(abstract_state)
        return PhasedStep(self.train_step, self.state_sharding(abstract_state), sharding.replicated(self.mesh))

    def step_args(self, stopped: list[bool]) -> tuple:
        return self.keys[0][2], self.hypers[0]

    def validate_fn(self, validate):
        return jax.jit(validate, out_shardings=sharding.replicated(self.mesh))

    def checkpoint_extra(self, stops: list[EarlyStops], fired: list[dict], rows: dict[int, dict]) -> dict:
        return {"early_stop": stops[0].to_json(), "metrics": rows[0]}

    def load_extra(self, extra: dict, stops: list[EarlyStops]) -> list[dict]:
        stops[0].load_json(extra["early_stop"])
        return [{}]


def train(config, log: Callable[[str], None] | None = print) -> tuple[TrainState, list[dict]]:
    """Runs `config.train.total_steps` steps (fewer on an early stop). Returns (final TrainState, metrics per step)."""
    state, (history,), _ = SingleRun(config, log).loop()
    return state, history


def log_compile(progress, timing: dict[str, float]) -> None:
    """Writes `compile_line(timing)` through `progress` (a `train.host.Progress`) on a program's first call."""
    line = compile_line(timing)
    if line is not None:
        progress.write(line)

"""Validation of the locked experiment config, run before anything compiles.

`validate(config)` raises `ConfigError` (a `ragen_jax.errors.UserInputError`) whose message names the key, the
offending value and what is allowed. The name tuples below are the single source of the fixed choices the rest of
the package accepts; the choices that grow (filter metrics and strategies, advantage estimators, loss aggregation
modes, model architectures) are `Registry`s instead, filled where each one is implemented
(docs/filtering.md#adding-a-filter-metric-or-strategy), and validation reads their names. `apply_overrides` sets
dotted keys on a copy of a config (task settings, presets, sweep members).
"""
from __future__ import annotations

import copy
import importlib
import math
import os
from types import SimpleNamespace
from typing import Any, Callable, Iterable, Iterator, Mapping

import ml_collections

from ragen_jax.errors import UserInputError


class Registry(Mapping[str, SimpleNamespace]):
    """The choices of one config key that grow: name -> entry, in registration order.

    An entry is registered next to its implementation, `@REGISTRY.register("name", **metadata)` on the function,
    and is a `SimpleNamespace(name=..., fn=<the function>, **metadata)`. The registry itself lives here, in the
    light config module, so validation can read the names; its entries live in `home`, a jax module, which is
    imported the first time the registry is read (reading it from `config.validate` therefore imports `home`;
    importing this module still does not). The entries are static choices: callers look them up in Python, at
    trace time, never inside a traced function.

    Args:
      key: the config key the names are the values of (named in the errors).
      home: the module that registers the entries.
      defaults: metadata an entry gets unless its registration sets it; `required`: metadata it must set.
    """

    def __init__(self, key: str, home: str, defaults: Mapping[str, Any] | None = None,
                 required: tuple[str, ...] = ()):
        self.key, self.home = key, home
        self._defaults, self._required = dict(defaults or {}), required
        self._entries: dict[str, SimpleNamespace] = {}
        self._loaded = False

    def register(self, name: str, **metadata: Any) -> Callable[[Callable], Callable]:
        """Decorator: registers the function as the entry `name` (a name registered twice is a bug: ValueError)."""
        missing = [k for k in self._required if k not in metadata]
        if missing:
            raise TypeError(f"{self.key} {name!r}: the registration must set {', '.join(missing)}")

        def decorator(fn: Callable) -> Callable:
            if name in self._entries:
                raise ValueError(f"{self.key} {name!r} is already registered (by {self._entries[name].fn!r})")
            self._entries[name] = SimpleNamespace(name=name, fn=fn, **{**self._defaults, **metadata})
            return fn

        return decorator

    def unregister(self, name: str) -> None:
        """Removes the entry `name` (for tests that register a temporary one)."""
        del self._entries[name]

    def entry(self, name: str) -> SimpleNamespace:
        """The entry `name`; a ConfigError naming `key` and the registered names if there is none."""
        check_choice(self.key, name, self)
        return self._entries[name]

    def _all(self) -> dict[str, SimpleNamespace]:
        if not self._loaded:
            importlib.import_module(self.home)  # its registrations fill `_entries`; no-op while it is importing
            self._loaded = True
        return self._entries

    def __getitem__(self, name: str) -> SimpleNamespace:
        return self._all()[name]

    def __iter__(self) -> Iterator[str]:
        return iter(tuple(self._all()))

    def __len__(self) -> int:
        return len(self._all())

    def __repr__(self) -> str:
        return f"Registry({self.key!r}: {', '.join(self._all())})"


ALGORITHMS = ("ppo", "dapo", "grpo", "drgrpo")
# algo.adv_estimator: entry.fn(inputs, hyper, options) -> (advantages f32[B, T], returns f32[B, T], metrics)
# (algos/estimators.py); `uses_critic`: it reads critic values (a critic is trained); `min_group_size`: the
# rollout.group_size it needs.
ADV_ESTIMATORS = Registry("algo.adv_estimator", "ragen_jax.algos.estimators", defaults={"min_group_size": 1},
                          required=("uses_critic",))
# filter.strategy: entry.fn(scores, candidate, value, largest, top_p_mode, eps) -> bool[N] (filtering/selection.py);
# `value_ok(value) -> bool` and `value_rule` (the error's "needs ...") check filter.value.
FILTER_STRATEGIES = Registry("filter.strategy", "ragen_jax.filtering.selection",
                             defaults={"value_ok": lambda value: 0.0 < value <= 1.0, "value_rule": "a value in (0, 1]"})
FILTER_TYPES = ("largest", "smallest")
# filter.metric: entry.fn(values f32[N, G]) -> f32[N] group scores (filtering/selection.py); `quantity`: the
# per-trajectory value it scores ("reward" | "entropy" | "length"); `min_group_size`: the rollout.group_size it needs.
FILTER_METRICS = Registry("filter.metric", "ragen_jax.filtering.selection", defaults={"min_group_size": 1},
                          required=("quantity",))
TOP_P_MODES = ("linear", "softmax")
KL_ESTIMATORS = ("kl", "k1", "abs", "mse", "k2", "low_var_kl", "low-var-kl", "k3")
# algo.loss_agg_mode: entry.fn(loss f32[B, T], mask f32[B, T]) -> f32 scalar (algos/losses.py `agg_loss`).
LOSS_AGG_MODES = Registry("algo.loss_agg_mode", "ragen_jax.algos.losses")
LOSS_SCALINGS = ("none", "linear", "sqrt")
REWARD_NORMALIZATIONS = ("identity", "mean", "mean_std", "asym_clip")
BUCKET_MODES = ("quantile", "fixed_rv")
STEP_PHASES = ("rollout", "diagnostics", "prepare", "update")  # the training step's phases, in order (train.step)
QWEN_TOKENIZERS = ("qwen2.5", "qwen3.6")  # the real vocabularies of ragen_jax/models/qwen_tokenizer.py
TOKENIZER_KINDS = ("builtin", "json", "gguf", *QWEN_TOKENIZERS)
CHAT_FORMATS = ("plain", "chatml", "llama3")
AUTO_CHAT_FORMAT = "auto"  # tokenizer.chat_format recognised from a GGUF file's tokenizer.chat_template
COMPUTE_DTYPES = ("float32", "bfloat16")
SFT_REASONINGS = ("env", "own")  # train.sft_reasoning (train/demonstrations.py)
# model.arch: entry.fn(model_config) -> a `ragen_jax.models.lm.CausalLM` (the class itself), registered in its
# architecture module, which ragen_jax/models/__init__.py imports (models/transformer.py: "transformer").
MODEL_ARCHS = Registry("model.arch", "ragen_jax.models")
# ragen_jax/models/presets.py: published shapes with random weights, then checkpoints shipped in installed packages
SHAPE_PRESETS = ("qwen2.5-0.5b", "qwen2.5-1.5b", "qwen2.5-3b")
SHIPPED_PRESETS = ("smollm2-135m-instruct",)
MODEL_PRESETS = (*SHAPE_PRESETS, *SHIPPED_PRESETS)

# Keys that must be >= 0: coefficients, learning rates, penalties' magnitudes are signed and excluded.
NON_NEGATIVE_KEYS = (
    "algo.entropy_coeff",
    "algo.kl_loss_coef",
    "algo.kl_coef",
    "algo.clip_ratio_low",
    "algo.clip_ratio_high",
    "algo.value_clip",
    "algo.gamma",
    "algo.lam",
    "algo.high_level_gamma",
    "optim.actor_lr",
    "optim.critic_lr",
    "optim.weight_decay",
    "optim.grad_clip",
    "train.sft_lr",
    "rollout.temperature",
    "rollout.val_temperature",
    "filter.eps",
    # schedules and counts where 0 means off / "the default"
    "train.total_steps",
    "train.test_freq",
    "logging.samples_every",
    "train.sft_steps",
    "diagnostics.collapse_every",
    "diagnostics.grad_analysis_every",
    "diagnostics.grad_analysis_num_groups",
    "diagnostics.grad_analysis_group_size",
    "algo.score_width_tiers",
    "rollout.top_k",
    "algo.critic_warmup",
    "optim.warmup_steps",
    "filter.empty_stop_steps",
    "filter.rv_collapse_window",
    "filter.rv_collapse_ratio",
    "filter.val_success_patience",
    "diagnostics.std_eps",
    "diagnostics.faithfulness_prompts",
    "model.vocab_size",
)
POSITIVE_INT_KEYS = (
    "rollout.num_groups",
    "rollout.group_size",
    "rollout.max_turn",
    "rollout.max_actions_per_turn",
    "rollout.max_actions_per_traj",
    "rollout.response_length",
    "rollout.max_model_len",
    "rollout.val_num_groups",
    "rollout.val_group_size",
    "algo.ppo_epochs",
    "algo.ppo_mini_batch_size",
    "diagnostics.num_samples",
    "diagnostics.score_width_tiers",
    "mesh.fsdp",
    "mesh.sweep",
    "checkpoint.save_freq",
    "checkpoint.max_to_keep",
    "logging.every",
    "diagnostics.grad_analysis_num_buckets",
    # the sizes of a model built from the config (a preset's or a folder's own are checked where they are read)
    "model.d_model",
    "model.num_layers",
    "model.num_heads",
    "model.num_kv_heads",
    "model.mlp_dim",
    "model.max_seq_len",
)
# Keys that are probabilities or decay rates: in [0, 1].
UNIT_INTERVAL_KEYS = (
    "train.sft_oracle_prob",
    "env.success_rate",
    "rollout.top_p",
    "filter.val_success_floor",
    "diagnostics.ema_decay",
    "optim.b1",
    "optim.b2",
)
# Keys that divide or scale by themselves: > 0.
POSITIVE_KEYS = ("model.rope_theta", "model.norm_eps")


class ConfigError(UserInputError):
    """An invalid config value; the message names the key, the value and what is allowed."""

    def __init__(self, key: str, value: Any, allowed: str):
        self.key, self.value, self.allowed = key, value, allowed
        super().__init__(f"config.{key} = {value!r} is invalid: {allowed}")


def _get(config: ml_collections.ConfigDict, key: str) -> Any:
    node = config
    for part in key.split("."):
        node = node[part]
    return node


def check_choice(key: str, value: Any, choices: Iterable[str]) -> None:
    """ConfigError naming `key` unless `value` is one of `choices` (also used where a module takes the value
    directly, e.g. the filter functions)."""
    if value not in choices:
        raise ConfigError(key, value, "allowed values are " + ", ".join(repr(c) for c in choices))


def _check_choice(config, key: str, choices: Iterable[str]) -> None:
    check_choice(key, _get(config, key), choices)


def _check_filter_value(config) -> None:
    strategy, value = FILTER_STRATEGIES[config.filter.strategy], config.filter.value
    if not strategy.value_ok(value) or not math.isfinite(value):
        raise ConfigError("filter.value", value, f"{strategy.name} needs {strategy.value_rule}")


def mesh_data_size(config: ml_collections.ConfigDict, num_devices: int) -> int:
    """The size of the mesh's `data` axis: `-1` takes every device left after fsdp and sweep; an explicit size may
    leave devices unused (the mesh spans the first data * fsdp * sweep devices) but not ask for more than exist."""
    fixed = config.mesh.fsdp * config.mesh.sweep
    if config.mesh.data == -1:
        if num_devices % fixed:
            raise ConfigError("mesh.fsdp", config.mesh.fsdp, f"fsdp * sweep = {fixed} must divide the {num_devices} devices")
        return num_devices // fixed
    if config.mesh.data < 1 or config.mesh.data * fixed > num_devices:
        raise ConfigError(
            "mesh.data", config.mesh.data,
            f"data * fsdp * sweep must be at most the {num_devices} devices (or data = -1 for all of them)",
        )
    return config.mesh.data


def loop_phases(config: ml_collections.ConfigDict) -> tuple[str, ...]:
    """The step phases a vectorised sweep runs member after member (`mesh.sweep_loop_phases`, comma-separated)."""
    return tuple(p.strip() for p in config.mesh.sweep_loop_phases.split(",") if p.strip())


def validate(config: ml_collections.ConfigDict, num_devices: int | None = None) -> ml_collections.ConfigDict:
    """Checks every constraint that would otherwise fail late (or silently) inside a compiled step.

    Args:
      config: a config built from `configs.base.get_config()`.
      num_devices: devices the mesh spans; `None` means `jax.device_count()`.
    Returns:
      The same config, for chaining.
    Raises:
      ConfigError: naming the first offending key.
    """
    _check_choice(config, "algo.name", ALGORITHMS)
    _check_choice(config, "algo.adv_estimator", ADV_ESTIMATORS)
    _check_choice(config, "algo.kl_loss_type", KL_ESTIMATORS)
    _check_choice(config, "algo.kl_penalty", KL_ESTIMATORS)
    _check_choice(config, "algo.loss_agg_mode", LOSS_AGG_MODES)
    _check_choice(config, "filter.strategy", FILTER_STRATEGIES)
    _check_choice(config, "filter.type", FILTER_TYPES)
    _check_choice(config, "filter.metric", FILTER_METRICS)
    _check_choice(config, "filter.top_p_mode", TOP_P_MODES)
    _check_choice(config, "filter.loss_scaling", LOSS_SCALINGS)
    _check_choice(config, "rollout.reward_normalization", REWARD_NORMALIZATIONS)
    _check_choice(config, "diagnostics.grad_analysis_bucket_mode", BUCKET_MODES)
    for phase in loop_phases(config):
        check_choice("mesh.sweep_loop_phases", phase, STEP_PHASES)
    if loop_phases(config) and config.mesh.sweep != 1:
        raise ConfigError("mesh.sweep_loop_phases", config.mesh.sweep_loop_phases,
                          "loops over the members of one device: needs mesh.sweep = 1")
    _check_choice(config, "tokenizer.kind", TOKENIZER_KINDS)
    _check_choice(config, "tokenizer.chat_format", (*CHAT_FORMATS, AUTO_CHAT_FORMAT))
    _check_choice(config, "model.arch", MODEL_ARCHS)
    _check_choice(config, "model.compute_dtype", COMPUTE_DTYPES)
    _check_choice(config, "train.sft_reasoning", SFT_REASONINGS)
    _check_choice(config, "model.preset", ("", *MODEL_PRESETS))
    _check_filter_value(config)

    for key in NON_NEGATIVE_KEYS:
        value = _get(config, key)
        if not value >= 0:
            raise ConfigError(key, value, "must be >= 0")
        if not math.isfinite(value):
            raise ConfigError(key, value, "must be finite")
    for key in POSITIVE_INT_KEYS:
        value = _get(config, key)
        if not value >= 1:
            raise ConfigError(key, value, "must be >= 1")
    for key in UNIT_INTERVAL_KEYS:
        value = _get(config, key)
        if not 0.0 <= value <= 1.0:
            raise ConfigError(key, value, "must be in [0, 1]")
    for key in POSITIVE_KEYS:
        value = _get(config, key)
        if not 0.0 < value < math.inf:
            raise ConfigError(key, value, "must be > 0 and finite")
    if config.rollout.response_length >= config.rollout.max_model_len:  # the exact bound needs the prompts: Rollout
        raise ConfigError("rollout.response_length", config.rollout.response_length, "a turn's prompt and response "
                          f"must fit in rollout.max_model_len = {config.rollout.max_model_len}")
    if not config.algo.clip_ratio_c > 1.0:
        raise ConfigError("algo.clip_ratio_c", config.algo.clip_ratio_c,
                          "the dual-clip bound must be > 1 (it caps the loss of negative advantages at c times)")

    group_size = config.rollout.group_size
    min_group_size = FILTER_METRICS[config.filter.metric].min_group_size  # 2 for the variance metrics
    if group_size < min_group_size:
        raise ConfigError(
            "rollout.group_size", group_size,
            f"filter.metric={config.filter.metric!r} needs a group_size >= {min_group_size}"
        )
    estimator = ADV_ESTIMATORS[config.algo.adv_estimator]
    if group_size < estimator.min_group_size:  # 2 for grpo
        raise ConfigError("rollout.group_size", group_size,
                          f"the {estimator.name} advantage estimator needs a group_size >= {estimator.min_group_size}")
    if config.diagnostics.grad_analysis_group_size == 1:
        raise ConfigError("diagnostics.grad_analysis_group_size", 1,
                          "a group's reward variance needs at least 2 rollouts (0 = rollout.group_size)")
    val_batch = config.rollout.val_num_groups * config.rollout.val_group_size
    if config.diagnostics.faithfulness_prompts > val_batch:
        raise ConfigError("diagnostics.faithfulness_prompts", config.diagnostics.faithfulness_prompts,
                          f"scores validation prompts: at most rollout.val_num_groups x val_group_size = {val_batch}")
    if config.train.sft_batch_size < 0:
        raise ConfigError("train.sft_batch_size", config.train.sft_batch_size,
                          "must be >= 0 (0 = the rollout's batch size)")
    sft_batch = config.train.sft_batch_size or config.rollout.num_groups * group_size
    sft_micro = config.train.sft_micro_batch_size
    if sft_micro < 0 or (sft_micro and sft_batch % sft_micro):
        raise ConfigError("train.sft_micro_batch_size", sft_micro,
                          f"must be 0 (the whole batch) or divide the warm-start batch of {sft_batch} rows")
    cache = config.logging.compilation_cache
    if cache not in ("", "auto") and os.path.isfile(os.path.expanduser(cache)):
        raise ConfigError("logging.compilation_cache", cache, '"auto", "" (off) or a folder, not a file')
    if config.model.preset in SHAPE_PRESETS and config.model.pretrained_path:
        raise ConfigError("model.preset", config.model.preset,
                          "model.pretrained_path already fixes the shapes and weights: set one of the two (only a "
                          "shipped preset takes weights trained from it)")
    if config.tokenizer.kind == "json" and not config.tokenizer.path:
        raise ConfigError("tokenizer.path", config.tokenizer.path, "tokenizer.kind='json' needs the path of a tokenizer.json")
    if config.tokenizer.chat_format == AUTO_CHAT_FORMAT and config.tokenizer.kind != "gguf":
        raise ConfigError("tokenizer.chat_format", AUTO_CHAT_FORMAT,
                          "is recognised from a GGUF file's chat template: needs tokenizer.kind='gguf'")
    if config.tokenizer.kind in QWEN_TOKENIZERS and config.tokenizer.chat_format != "chatml":
        raise ConfigError("tokenizer.chat_format", config.tokenizer.chat_format,
                          f"tokenizer.kind={config.tokenizer.kind!r} has only ChatML's markers: use 'chatml'")

    if num_devices is None:
        import jax  # deferred: validating a config should not need a backend unless asked

        num_devices = jax.device_count()
    batch_parts = mesh_data_size(config, num_devices) * config.mesh.fsdp
    batch = config.rollout.num_groups * group_size
    if batch % batch_parts:
        raise ConfigError(
            "rollout.num_groups", config.rollout.num_groups,
            f"the batch num_groups * group_size = {batch} must be divisible by the mesh's data * fsdp axes "
            f"({batch_parts}): the batch is split over both",
        )
    if batch % config.algo.ppo_mini_batch_size:
        raise ConfigError(
            "algo.ppo_mini_batch_size", config.algo.ppo_mini_batch_size,
            f"must divide the batch num_groups * group_size = {batch}",
        )
    micro = config.algo.ppo_micro_batch_size
    if micro < 0 or (micro and config.algo.ppo_mini_batch_size % micro):
        raise ConfigError(
            "algo.ppo_micro_batch_size", micro,
            f"must be 0 (whole minibatch) or divide algo.ppo_mini_batch_size = {config.algo.ppo_mini_batch_size}",
        )
    return config


def load(argv: list[str], num_devices: int | None = None,
         stored: ml_collections.ConfigDict | None = None) -> ml_collections.ConfigDict:
    """Parses `--config=FILE` plus `--config.a.b=value` overrides from a command line, then validates.

    `argv[0]` is the program name, as in `sys.argv`; `num_devices` as in `validate`. The config file's
    `get_config()` must return a locked ConfigDict, so an override naming a key that does not exist (a typo)
    raises instead of being ignored. With `stored` (e.g. a workdir's config.json) the overrides apply to it and
    `argv` holds no `--config=FILE`.

    Example:
      load(["train", "--config=configs/base.py", "--config.filter.value=0.9"])
    """
    from absl import flags
    from ml_collections import config_flags

    flag_values = flags.FlagValues()
    if stored is None:
        config_flags.DEFINE_config_file(
            "config", default=None, help_string="experiment config file", flag_values=flag_values,
            lock_config=True, sys_argv=list(argv),
        )
    else:
        config_flags.DEFINE_config_dict("config", stored, flag_values=flag_values, sys_argv=list(argv))
    flag_values(list(argv))
    if flag_values.config is None:
        raise ConfigError("--config", None, "pass --config=configs/<task>.py")
    return validate(flag_values.config, num_devices)


def apply_overrides(config: ml_collections.ConfigDict, overrides: Mapping[str, Any]) -> ml_collections.ConfigDict:
    """A copy of `config` with dotted keys set; an unknown key raises KeyError naming it."""
    config = copy.deepcopy(config)
    for dotted, value in overrides.items():
        *parents, leaf = dotted.split(".")
        node = config
        for part in parents:
            node = node[part]
        if leaf not in node:
            raise KeyError(f"config.{dotted} does not exist in the config schema")
        node[leaf] = value
    return config

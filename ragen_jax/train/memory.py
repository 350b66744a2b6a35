"""Device-memory estimate of a training run, from shapes alone (nothing is materialised).

    model_config = build.build_model_config(config, tokenizer)
    est = memory.estimate(config, model_config, num_devices=8)
    print(memory.format_table(est))

Every size comes from the code that allocates the array, run under `jax.eval_shape`, with the model the config's
`model.arch` names (`models.lm.make`): parameters from its `init_params` / `init_value_params`, AdamW states from
`update.optimizer_init`, the KV cache from its `init_cache`, hidden states from its `hidden_states`, a block of
logits from its `logits_from_hidden` as `losses.block_positions` sizes it. Rows, by the phase of a step that holds them:

    resident       actor parameters (float32), actor AdamW (mu, nu float32 + count); with a critic
                   (algo.adv_estimator = "gae") its parameters and AdamW; with KL on (use_kl_loss or
                   use_kl_in_reward) the reference parameters
    rollout        KV cache [layers, B, kv heads, rollout.max_model_len, head dim] x (k, v), compute dtype,
                   B = num_groups x group_size
    scoring        final hidden states [B, L-1, D] (L = max_model_len) and one block of logits f32[B, c, V]: old
                   (and reference) log-probs score the whole batch in one forward, unembedding c positions at a
                   time (c = update.logits_chunk // (B x V), at least 1)
    actor update   gradients x 2 (the micro-batch accumulator and one micro-batch's gradient), the micro-batch's
                   hidden states and one block of logits, each with its cotangent
    critic update  critic gradients x 2

Per device: a parameter-like leaf is split over the mesh's fsdp axis when `sharding.fsdp_spec` splits it (else
replicated); a batch-major array over data x fsdp when its rows divide (`sharding.shard_batch`'s rule), else
counted whole. A sweep's members each hold their own state on their own devices, so per-device figures do not
depend on `mesh.sweep`.

The estimated peak is resident + the largest phase. It is a LOWER bound: not counted are the per-layer
activations the backward pass keeps (per layer about [micro, L, mlp_dim] several times, unless remat), XLA
temporaries and fragmentation, the collapse diagnostics' and gradient analysis' own caches and forwards.
"""
from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
import numpy as np

from ragen_jax import sharding
from ragen_jax.algos import losses
from ragen_jax.algos.presets import uses_critic, uses_reference
from ragen_jax.models import lm
from ragen_jax.models.config import ModelConfig
from ragen_jax.train import update

GIB = 2 ** 30
RESIDENT, ROLLOUT, SCORING = "resident", "rollout", "scoring"
ACTOR_UPDATE, CRITIC_UPDATE = "actor update", "critic update"
PHASES = (ROLLOUT, SCORING, ACTOR_UPDATE, CRITIC_UPDATE)


@dataclasses.dataclass(frozen=True)
class Row:
    """One array (or tree of arrays) of a step: `size` bytes in all (one copy), `per_device` on one device."""

    name: str
    what: str
    phase: str
    size: int
    per_device: int


@dataclasses.dataclass(frozen=True)
class Estimate:
    """The rows of `estimate` and what they assume: the mesh (sweep, data, fsdp), the policy, whether a critic and a
    reference exist, the rollout batch (rows x tokens) and the update's micro-batch rows."""

    rows: tuple[Row, ...]
    mesh: tuple[int, int, int]
    num_params: int
    model_config: ModelConfig
    critic: bool
    reference: bool
    batch: int
    length: int
    micro: int

    def phase_bytes(self, phase: str) -> int:
        """Per-device bytes of the rows of `phase`."""
        return sum(r.per_device for r in self.rows if r.phase == phase)

    @property
    def peak_phase(self) -> str:
        return max(PHASES, key=self.phase_bytes)

    @property
    def peak_per_device(self) -> int:
        """Resident + the largest phase, per device (a lower bound of the real peak: see the module doc)."""
        return self.phase_bytes(RESIDENT) + self.phase_bytes(self.peak_phase)


def num_params(shapes) -> int:
    """Total elements of a pytree of arrays / ShapeDtypeStructs."""
    return sum(math.prod(x.shape) for x in jax.tree.leaves(shapes))


def param_shapes(model: lm.CausalLM):
    """ShapeDtypeStructs of `model.init_params(key)` (no parameter is built)."""
    return jax.eval_shape(model.init_params, jax.random.key(0))


def _nbytes(x) -> int:
    return math.prod(x.shape) * np.dtype(x.dtype).itemsize


def _dtype_name(dtype) -> str:
    return {"float32": "f32", "bfloat16": "bf16", "int32": "i32"}.get(np.dtype(dtype).name, np.dtype(dtype).name)


def _param_like(name: str, what: str, phase: str, shapes, fsdp: int, copies: int = 1) -> Row:
    """A row of `copies` trees shaped like `shapes`, each leaf split over fsdp where `fsdp_spec` splits it."""
    leaves = jax.tree.leaves(shapes)
    per_device = sum(_nbytes(x) // (fsdp if "fsdp" in sharding.fsdp_spec(tuple(x.shape), fsdp) else 1)
                     for x in leaves)
    return Row(name, what, phase, copies * sum(_nbytes(x) for x in leaves), copies * per_device)


def _batch_major(name: str, phase: str, array, batch_parts: int, copies: int = 1, label: str = "",
                 axis: int = 0) -> Row:
    """A row of `copies` arrays shaped like `array`, whose batch dimension `axis` splits over data x fsdp when it
    divides (else counted whole on every device)."""
    size = copies * _nbytes(array)
    shape = f"{_dtype_name(array.dtype)}[{', '.join(str(n) for n in array.shape)}]"
    what = f"{label}{copies} x {shape}" if copies > 1 else label + shape
    return Row(name, what, phase, size, size // batch_parts if array.shape[axis] % batch_parts == 0 else size)


def estimate(config, model_config: ModelConfig, num_devices: int) -> Estimate:
    """The memory rows of one training step of `config` with policy `model_config` on `num_devices` devices.

    Args:
      config: a `ragen_jax/defaults.py` config, validated for `num_devices` (its mesh resolves against them).
      model_config: the policy's shapes, e.g. `ragen_jax.train.build.build_model_config(config, tokenizer)`, of the
        `model.arch` architecture.
      num_devices: devices the mesh spans (`mesh.data = -1` takes all of them after fsdp and sweep).
    Returns:
      An `Estimate`; sizes in bytes.
    """
    r, a = config.rollout, config.algo
    mesh = sharding.mesh_shape(config, num_devices)
    _, data, fsdp = mesh
    parts = data * fsdp
    batch, length = r.num_groups * r.group_size, r.max_model_len
    micro = a.ppo_micro_batch_size or a.ppo_mini_batch_size
    update_config = update.UpdateConfig.from_config(config)
    model = lm.make(config.model.arch, model_config)
    actor = param_shapes(model)
    count = num_params(actor)
    opt = jax.eval_shape(functools.partial(update.optimizer_init, config=update_config), actor)

    rows = [_param_like("actor parameters", f"{count:,} x f32", RESIDENT, actor, fsdp),
            _param_like("actor AdamW", "mu, nu: 2 x f32 per parameter", RESIDENT, opt, fsdp)]
    critic = None
    if uses_critic(config):
        critic = jax.eval_shape(model.init_value_params, jax.random.key(0))
        critic_opt = jax.eval_shape(functools.partial(update.optimizer_init, config=update_config), critic)
        rows += [_param_like("critic parameters", f"{num_params(critic):,} x f32 (backbone + value head)", RESIDENT,
                             critic, fsdp),
                 _param_like("critic AdamW", "mu, nu: 2 x f32 per parameter", RESIDENT, critic_opt, fsdp)]
    if uses_reference(config):
        rows.append(_param_like("reference parameters", f"{count:,} x f32 (KL on)", RESIDENT, actor, fsdp))

    cache = jax.eval_shape(functools.partial(model.init_cache, batch, length))
    rows.append(_batch_major("KV cache", ROLLOUT, cache.k, parts, copies=2, label="k, v: ", axis=1))

    def hidden(rows_at_once: int):
        tokens = jax.ShapeDtypeStruct((rows_at_once, length - 1), jnp.int32)
        return jax.eval_shape(model.hidden_states, actor, tokens)

    def logits_block(rows_at_once: int):
        size = losses.block_positions(rows_at_once, length - 1, model_config.vocab_size, update_config.logits_chunk)
        states = hidden(rows_at_once)
        block = jax.ShapeDtypeStruct((rows_at_once, size, states.shape[-1]), states.dtype)
        return jax.eval_shape(model.logits_from_hidden, actor, block)

    rows.append(_batch_major("hidden states, scoring pass", SCORING, hidden(batch), parts))
    rows.append(_batch_major("logits block, scoring pass", SCORING, logits_block(batch), parts))
    rows.append(_param_like("actor gradients", "sum + micro-batch: 2 x f32 per parameter", ACTOR_UPDATE,
                            actor, fsdp, copies=2))
    rows.append(_batch_major("hidden + cotangent, micro-batch", ACTOR_UPDATE, hidden(micro), parts, copies=2))
    rows.append(_batch_major("logits block + cotangent", ACTOR_UPDATE, logits_block(micro), parts, copies=2))
    if critic is not None:
        rows.append(_param_like("critic gradients", "sum + micro-batch: 2 x f32 per parameter", CRITIC_UPDATE,
                                critic, fsdp, copies=2))
    return Estimate(tuple(rows), mesh, count, model_config, critic is not None, uses_reference(config), batch, length,
                    micro)


def format_table(est: Estimate, title: str = "") -> str:
    """The estimate as a text table in GiB (one copy and per device), with the resident total and the peak."""
    c = est.model_config
    sweep, data, fsdp = est.mesh
    head = [title] if title else []
    head.append(f"policy: {est.num_params:,} parameters (d_model {c.d_model}, {c.num_layers} layers, {c.num_heads} "
                f"heads / {c.num_kv_heads} kv heads x {c.head_dim}, mlp {c.mlp_dim}, vocab {c.vocab_size}), "
                f"compute {c.compute_dtype}")
    yes = {True: "yes", False: "no"}
    head.append(f"critic: {yes[est.critic]} (only with GAE advantages); reference: {yes[est.reference]} (only with "
                f"a KL loss or KL reward); rollout batch {est.batch} rows x {est.length} tokens; update micro-batch "
                f"{est.micro} rows")
    head.append(f"mesh: sweep {sweep} x data {data} x fsdp {fsdp} (per device: parameters / fsdp, batch / data x fsdp)")
    name_w = max(len(r.name) for r in est.rows)
    what_w = max(len(r.what) for r in est.rows)
    lines = head + ["", f"{'phase':<13}  {'item':<{name_w}}  {'shape':<{what_w}}  {'GiB':>9}  {'GiB/device':>10}"]
    for row in est.rows:
        lines.append(f"{row.phase:<13}  {row.name:<{name_w}}  {row.what:<{what_w}}  {row.size / GIB:>9.2f}  "
                     f"{row.per_device / GIB:>10.2f}")
    resident, peak = est.phase_bytes(RESIDENT), est.peak_per_device
    lines += ["", f"resident per device: {resident / GIB:.2f} GiB; largest phase: {est.peak_phase} "
                  f"({est.phase_bytes(est.peak_phase) / GIB:.2f} GiB)",
              f"estimated peak per device: {peak / GIB:.2f} GiB = resident + largest phase",
              "(a lower bound: activations kept for the backward pass, XLA temporaries and the diagnostics' caches "
              "are not counted)"]
    return "\n".join(lines)

"""The compiled training step on the tiny FrozenLake geometry: two algorithm structures, no recompiles for new
hyperparameter values, exact no-ops when the filter keeps nothing, critic warm-up, determinism, the step run as
separately timed phases, the training batch's transcripts.

The policy starts as the scripted bigram model of the rollout tests (its answers are mostly well formed, so the
collapse metrics have valid reasoning to score). The steps built only for one test leave the collapse diagnostics
out: a smaller program to compile."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import environments
from configs import base
from ragen_jax import config as config_lib
from ragen_jax import models
from ragen_jax.algos import presets
from ragen_jax.models import chat
from ragen_jax.models.tokenizer import builtin
from ragen_jax.train import transcripts
from ragen_jax.train.phases import PhasedStep
from ragen_jax.train.hyper import Hyper
from ragen_jax.train.step import PHASES, TrainStep
from tests.guards import no_network
from tests.rollout.helpers import scripted_params
from tests.tiny import TINY_FROZEN_LAKE

TINY = {**TINY_FROZEN_LAKE, "diagnostics.num_samples": 4, "diagnostics.score_width_tiers": 1,
        "algo.score_width_tiers": 1, "model.tie_embeddings": False, "optim.actor_lr": 1e-2, "optim.critic_lr": 1e-2}


def build(algorithm: str, kl: str = "off", **overrides):
    config = config_lib.apply_overrides(presets.preset_config(base.get_config(), algorithm, kl=kl),
                                     {**TINY, **overrides})
    config_lib.validate(config, num_devices=1)  # the step runs on one device (no mesh yet)
    tokenizer = builtin()
    env, env_params = environments.make(config.env.name, tokenizer)
    model_config = models.ModelConfig.from_config(config.model, tokenizer.vocab_size)
    train_step = TrainStep(config, env, tokenizer, model_config, chat.plain())
    params = scripted_params(model_config, tokenizer, scale=2.0)  # mostly well-formed answers: finite MI
    traces = []

    def counted(state, key, hyper):
        traces.append(1)
        return train_step(state, key, hyper)

    return train_step, jax.jit(counted), train_step.init(jax.random.key(1), params), Hyper.from_config(config, env_params), traces


def changed(a, b) -> bool:
    return any(not np.array_equal(x, y) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))


def same_bits(a, b) -> bool:
    return jax.tree.structure(a) == jax.tree.structure(b) and all(
        np.asarray(x).dtype == np.asarray(y).dtype and np.asarray(x).tobytes() == np.asarray(y).tobytes()
        for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))


@pytest.fixture(scope="module")
def grpo():
    return build("grpo", **{"diagnostics.grad_analysis_every": 1})


def test_grpo_steps_update_the_actor_without_recompiling(grpo):
    train_step, step, state0, hyper, traces = grpo
    assert state0.critic is None and state0.ref is None
    state1, m1 = step(state0, jax.random.key(2), hyper)
    assert int(state1.step) == 1 and changed(state0.actor, state1.actor)
    for name in ("frozen_lake/success", "frozen_lake/episode_reward", "rollout/filter_kept_ratio", "actor/pg_loss",
                 "collapse_first_turn_sample/mi_estimate", "collapse_trajectory_sample/mi_estimate", "actor/entropy"):
        assert name in m1 and np.isfinite(float(m1[name])), name
    assert float(m1["rollout/filter_kept_ratio"]) == 1.0  # the GRPO preset does not filter
    assert float(m1["actor/num_updates"]) == 2  # two minibatches of 2 rows (= one group each)
    assert float(m1["grad_norm/all/sample_count"]) == 4  # the analysis runs on the kept training rows
    # a new filter value and temperature are traced: same compiled step
    state2, m2 = step(state1, jax.random.key(3), hyper.replace(filter_value=jnp.float32(0.5),
                                                               actor=hyper.actor._replace(temperature=jnp.float32(0.7))))
    assert len(traces) == 1 and int(state2.step) == 2
    # top-p 0.5 of the reward-variance mass: each kept group is one minibatch, dropped ones are skipped
    assert float(m2["actor/num_updates"]) == float(m2["rollout/filter_kept_count"])


def test_grpo_step_is_deterministic(grpo):
    _, step, state0, hyper, _ = grpo
    _, a = step(state0, jax.random.key(7), hyper)
    _, b = step(state0, jax.random.key(7), hyper)
    for k in a:
        np.testing.assert_array_equal(np.asarray(a[k]), np.asarray(b[k]), err_msg=k)


def test_a_nonfinite_loss_skips_the_updates_and_the_next_clean_step_trains(grpo):
    """A NaN entropy coefficient (traced, so the same compiled step) makes the actor loss and its gradients NaN
    after a real rollout, log-probs and advantages: both minibatch updates are skipped and counted, the actor and
    its optimizer state (moments, step count) keep every bit; the following clean step trains as usual."""
    _, step, state0, hyper, traces = grpo
    poisoned = hyper.replace(actor=hyper.actor._replace(entropy_coeff=jnp.float32(jnp.nan)))
    state1, m1 = step(state0, jax.random.key(2), poisoned)
    assert int(state1.step) == 1 and np.isnan(float(m1["actor/grad_norm"]))
    assert float(m1["actor/num_updates"]) == 2 and float(m1["actor/nonfinite_skips"]) == 2
    assert same_bits(state0.actor, state1.actor) and same_bits(state0.actor_opt, state1.actor_opt)
    state2, m2 = step(state1, jax.random.key(3), hyper)
    assert float(m2["actor/num_updates"]) == 2 and float(m2["actor/nonfinite_skips"]) == 0
    assert changed(state1.actor, state2.actor) and changed(state1.actor_opt, state2.actor_opt)
    assert all(np.isfinite(x).all() for x in jax.tree.leaves(state2.actor)) and len(traces) == 1


def test_a_whole_step_runs_with_sockets_blocked(grpo):
    _, step, state0, hyper, _ = grpo
    with no_network():
        state1, metrics = jax.block_until_ready(step(state0, jax.random.key(9), hyper))
    assert changed(state0.actor, state1.actor) and np.isfinite(float(metrics["actor/pg_loss"]))


def test_nothing_kept_means_nothing_changes(grpo):
    """include_zero=False (traced: the same compiled step) drops groups of zero reward variance; greedy decoding
    (temperature 0) gives every member of a group the same trajectory, so nothing is kept and the update skips every
    minibatch: no parameter or optimizer-state change at all."""
    _, step, state0, hyper, traces = grpo
    greedy = hyper.replace(filter_include_zero=jnp.bool_(False),
                           actor=hyper.actor._replace(temperature=jnp.float32(0)))
    state1, m = step(state0, jax.random.key(4), greedy)
    assert len(traces) == 1
    assert float(m["rollout/filter_kept_ratio"]) == 0.0 and float(m["rollout/empty_after_filter"]) == 1.0
    assert not changed(state0.actor, state1.actor) and not changed(state0.actor_opt, state1.actor_opt)
    assert float(m["actor/num_updates"]) == 0


def test_ppo_with_kl_loss_trains_the_critic_warms_up_and_analyses_a_separate_batch():
    _, step, state0, hyper, _ = build("ppo", kl="loss", **{"algo.critic_warmup": 1, "diagnostics.collapse_every": 0,
                                                           "diagnostics.grad_analysis_every": 2,
                                                           "diagnostics.grad_analysis_num_groups": 3})
    assert state0.critic is not None and state0.ref is not None
    state1, m1 = step(state0, jax.random.key(5), hyper)
    assert changed(state0.critic, state1.critic) and not changed(state0.actor, state1.actor)  # step 1 <= warm-up
    state2, m2 = step(state1, jax.random.key(6), hyper)
    assert changed(state1.actor, state2.actor) and not changed(state0.ref, state2.ref)
    assert "actor/kl_loss" in m2 and np.isfinite(float(m2["critic/vf_loss"]))
    # gradient analysis at steps 1, 3, ... (RAGEN's (step - 1) % every == 0): NaN at step 2
    assert np.isfinite(float(m1["grad_norm/all/snr"])) and np.isnan(float(m2["grad_norm/all/snr"]))
    assert float(m1["grad_norm/all/sample_count"]) == 6  # a separate unfiltered batch of 3 groups x 2


def test_phase_timings_give_the_one_program_step_and_its_training_transcripts(grpo):
    """`logging.phase_timings` (train/phases.py): the four phases as separate programs give the one-program step's
    metrics and new state (asserted to float32 rounding, as XLA may fuse the separate programs differently), and time
    each phase. The rollout phase's transcripts of the training batch decode to the
    text of its trajectories and carry their rewards and success: here the whole batch (B = 4 = transcripts.COUNT),
    so their means are the step's metrics."""
    train_step, step, state0, hyper, _ = grpo
    want_state, want = step(state0, jax.random.key(2), hyper)
    device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    phased = PhasedStep(train_step, device, device)
    (got_state, got, sample), timing = phased(jax.tree.map(jnp.copy, state0), jax.random.key(2), hyper)  # donated
    assert sorted(got) == sorted(want)
    for k in want:
        np.testing.assert_allclose(np.asarray(got[k]), np.asarray(want[k]), rtol=1e-6, atol=1e-7, err_msg=k)
    for a, b in zip(jax.tree.leaves(got_state), jax.tree.leaves(want_state)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-6, atol=1e-7)
    for name in PHASES:
        assert timing[f"timing_s/{name}"] > 0 and timing[f"timing_s/compile_{name}"] > 0
    assert timing["timing_s/step"] == pytest.approx(sum(timing[f"timing_s/{name}"] for name in PHASES))
    _, timing = phased(jax.tree.map(jnp.copy, state0), jax.random.key(2), hyper)
    assert sorted(timing) == sorted([f"timing_s/{name}" for name in PHASES] + ["timing_s/step"])  # compiled once

    (traj, _, rollout_sample), _ = phased.programs["rollout"](state0, jax.random.key(2), hyper)  # no recompile
    tokenizer = builtin()
    rows = transcripts.records(jax.device_get(sample), tokenizer)
    assert len(rows) == traj.tokens.shape[0] == transcripts.COUNT and same_bits(sample, rollout_sample)
    for b, row in enumerate(rows):
        assert row["chat"] == tokenizer.decode(np.asarray(traj.tokens[b, :traj.length[b]]))
        assert row["group"] == b // 2 and row["success"] == bool(traj.success[b])
        assert [t["reward"] for t in row["turns"]] == pytest.approx(
            np.asarray(traj.turn_reward[b])[np.asarray(traj.turn_taken[b])])
        for turn in row["turns"]:  # each turn's sampled response follows its "<think>" prefill in the chat text
            assert "<think>" + turn["response"] in row["chat"] and turn["reasoning"] in turn["response"]
    assert np.mean([r["success"] for r in rows]) == pytest.approx(float(want["frozen_lake/success"]))
    assert np.mean([r["episode_reward"] for r in rows]) == pytest.approx(float(want["frozen_lake/episode_reward"]))

"""Validation rollouts: fixed prompts and key (same params -> identical metrics), the val_* geometry, seed and
temperature, RAGEN's `val-env/` keys, and the validation schedule.

The reference is a `Rollout` built here from explicit arguments and called with `jax.random.key(val_seed)` and
the validation temperature; two compiled functions in all (`Validator.run` and the reference rollout)."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import environments
from configs import base
from ragen_jax import config as config_lib
from ragen_jax import models
from ragen_jax.models import chat
from ragen_jax.models.tokenizer import builtin
from ragen_jax.rollout.env_metrics import rollout_metrics
from ragen_jax.rollout.rollout import Rollout
from ragen_jax.train.validation import Validator, should_validate, success_keys
from tests.rollout.helpers import scripted_params
from tests.tiny import TINY_FROZEN_LAKE

VAL_GROUPS, VAL_SEED, VAL_TEMPERATURE = 3, 7, 0.5
TINY = {**TINY_FROZEN_LAKE, "rollout.val_num_groups": VAL_GROUPS, "rollout.val_group_size": 1,
        "rollout.val_seed": VAL_SEED, "rollout.val_temperature": VAL_TEMPERATURE, "model.tie_embeddings": False}


@pytest.fixture(scope="module")
def setup():
    config = config_lib.apply_overrides(base.get_config(), TINY)
    config_lib.validate(config, num_devices=1)
    tokenizer = builtin()
    env, env_params = environments.make("frozen_lake", tokenizer)
    model_config = models.ModelConfig.from_config(config.model, tokenizer.vocab_size)
    validator = Validator(config, env, tokenizer, model_config, chat.plain())
    reference = Rollout(env, tokenizer, chat.plain(), models.DecoderLM(model_config), num_groups=VAL_GROUPS,
                        group_size=1, max_turn=2, response_length=16, max_len=1024)
    return dict(validator=validator, run=jax.jit(validator.run), reference=jax.jit(reference), env_params=env_params,
                scripted=scripted_params(model_config, tokenizer, scale=2.0),  # mostly well-formed answers
                noisy=scripted_params(model_config, tokenizer, scale=0.5))  # another policy on the same prompts


def host(tree):
    return jax.tree.map(np.asarray, tree)


def validate(setup, params):
    """(Trajectory, metrics) of the compiled `Validator.run`, numpy leaves."""
    return host(setup["run"](params, setup["env_params"], jnp.float32(1.0)))


def reference_run(setup, params, seed=VAL_SEED, temperature=VAL_TEMPERATURE):
    return host(setup["reference"](params, jax.random.key(seed), setup["env_params"], jnp.float32(temperature),
                                   jnp.float32(1.0)))


def assert_same_trajectories(a, b):
    for name, x, y in zip(a.__dataclass_fields__, jax.tree.leaves(a), jax.tree.leaves(b)):
        np.testing.assert_array_equal(x, y, err_msg=name)


def assert_val_env_metrics(metrics, traj):
    """`metrics` are the reference's `rollout_metrics` under `val-env/` (up to f32 summation order: the validator
    reduces inside its compiled function, the reference here op by op)."""
    expected = host(rollout_metrics(traj, 1, "frozen_lake"))
    assert sorted(metrics) == sorted(f"val-env/{k}" for k in expected)
    for k, v in expected.items():
        value = metrics[f"val-env/{k}"]
        assert value.dtype == np.float32 and value.shape == (), k
        np.testing.assert_allclose(value, v, rtol=1e-6, atol=1e-7, err_msg=k)


def test_validation_is_the_reference_rollout_under_val_env_keys(setup):
    traj, metrics = validate(setup, setup["scripted"])
    reference = reference_run(setup, setup["scripted"])
    assert_same_trajectories(traj, reference)
    assert_val_env_metrics(metrics, reference)
    # the val_* geometry: val_num_groups prompts of val_group_size = 1 rollout, so pass@1 is the success rate
    assert traj.success.shape == (VAL_GROUPS,) and list(traj.group_ids) == list(range(VAL_GROUPS))
    assert metrics["val-env/frozen_lake/success"] == np.float32(traj.success.mean())
    assert metrics["val-env/frozen_lake/pass@1"] == metrics["val-env/frozen_lake/success"]
    assert success_keys(metrics) == ["val-env/frozen_lake/success"]
    # __call__ gives the same keys without the batch
    shapes = jax.eval_shape(setup["validator"], setup["scripted"], setup["env_params"], jnp.float32(1.0))
    assert sorted(shapes) == sorted(metrics)


def test_val_seed_and_temperature_matter(setup):
    """Another seed gives other prompts and another temperature other sampling log-probs, so the equality above
    pins the validator's key to val_seed and its temperature to val_temperature."""
    ours = reference_run(setup, setup["scripted"])
    other_seed = reference_run(setup, setup["scripted"], seed=VAL_SEED + 1)
    other_temperature = reference_run(setup, setup["scripted"], temperature=1.0)
    assert not np.array_equal(ours.tokens, other_seed.tokens)
    assert not np.array_equal(ours.sample_logp, other_temperature.sample_logp)


def test_same_params_give_identical_results_and_new_params_a_new_rollout(setup):
    first, second = validate(setup, setup["scripted"]), validate(setup, setup["scripted"])
    assert_same_trajectories(first[0], second[0])
    np.testing.assert_equal(first[1], second[1])
    traj, metrics = validate(setup, setup["noisy"])
    assert not np.array_equal(traj.tokens, first[0].tokens)  # the same prompts, other responses
    reference = reference_run(setup, setup["noisy"])
    assert_same_trajectories(traj, reference)
    assert_val_env_metrics(metrics, reference)


def test_success_keys_select_validation_successes_in_order():
    metrics = {"val-env/sokoban/success": 0.0, "val-env/frozen_lake/success": 1.0, "frozen_lake/success": 0.5,
               "val-env/frozen_lake/pass@1": 1.0, "val-env/response_length/mean": 3.0}
    assert success_keys(metrics) == ["val-env/frozen_lake/success", "val-env/sokoban/success"]


@pytest.mark.parametrize("test_freq, total_steps, expected", [
    (10, 25, [0, 10, 20, 25]),
    (10, 20, [0, 10, 20]),
    (1, 3, [0, 1, 2, 3]),
    (4, 3, [0, 3]),
    (0, 5, []),
    (-1, 5, []),
])
def test_should_validate_schedule(test_freq, total_steps, expected):
    assert [s for s in range(total_steps + 1) if should_validate(s, test_freq, total_steps)] == expected

"""configs/{bandit,frozen_lake,sokoban,countdown}.py: the accelerator setting is RAGEN-2's main-table protocol on
that env (docs/filtering.md, docs/environments.md), the tiny setting builds a runnable CPU step (every length fits one
turn), and a bad setting name is a clear error. Loaded through the command line as users do
(`--config=configs/x.py:tiny`)."""
from __future__ import annotations

import os

import pytest

from ragen_jax import config as config_lib
from ragen_jax.train.build import build
from ragen_jax.train.step import TrainStep

TASKS = ("bandit", "frozen_lake", "sokoban", "countdown")
PATHS = ["--config.tokenizer.path=/models/q/tokenizer.json", "--config.model.pretrained_path=/models/q"]
SINGLE_TURN = {"bandit", "countdown"}
CONFIGS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "configs")


@pytest.mark.parametrize("task", TASKS)
def test_accelerator_setting_is_the_main_table_protocol(task):
    c = config_lib.load(["train", f"--config=configs/{task}.py", *PATHS])
    assert c.env.name == task and (c.algo.name, c.algo.adv_estimator) == ("ppo", "gae")
    assert (c.rollout.num_groups, c.rollout.group_size, c.train.total_steps) == (8, 16, 400)
    assert (c.filter.strategy, c.filter.top_p_mode, c.filter.value, c.filter.include_zero) == (
        "top_p", "softmax", 0.9, True)
    assert (c.tokenizer.kind, c.tokenizer.chat_format, c.train.sft_steps) == ("json", "chatml", 0)
    assert c.rollout.max_turn == (1 if task in SINGLE_TURN else 5)
    with pytest.raises(config_lib.ConfigError, match="tokenizer.path"):  # the model folder must be named
        config_lib.load(["train", f"--config=configs/{task}.py"])


@pytest.mark.parametrize("task", TASKS)
def test_tiny_setting_builds_a_cpu_step(task):
    c = config_lib.load(["train", f"--config=configs/{task}.py:tiny"])
    shipped = os.path.join(CONFIGS, "warm_starts", f"{task}_tiny")
    # a warm start of its own, or the shipped one (remade by the config's docstring commands) and no more SFT
    assert (c.model.pretrained_path, c.train.sft_steps > 0) in (("", True), (shipped, False))
    assert c.tokenizer.kind == "builtin" and c.train.sft_oracle_prob < 1.0
    assert c.rollout.val_num_groups * c.rollout.val_group_size >= 64
    assert c.rollout.num_groups >= 8  # enough groups for the top-p filter to drop some
    parts = build(c)
    TrainStep(c, parts.env, parts.tokenizer, parts.model_config, parts.chat_format)  # every length fits


@pytest.mark.parametrize("task", ("bandit", "frozen_lake"))
def test_smol_setting_builds_a_step_of_the_shipped_smollm2(task):
    from ragen_jax.train import build as build_lib

    c = config_lib.load(["train", f"--config=configs/{task}.py:smol"])
    assert (c.model.preset, c.tokenizer.kind, c.tokenizer.chat_format) == ("smollm2-135m-instruct", "gguf", "auto")
    assert c.rollout.max_turn == 1 and c.rollout.val_num_groups >= 64
    tokenizer = build_lib.build_tokenizer(c)
    chat_format = build_lib.build_chat_format(c, tokenizer)
    env, _ = build_lib.build_env(c, tokenizer)
    model_config = build_lib.build_model_config(c, tokenizer)
    assert (model_config.num_layers, model_config.max_seq_len) == (30, c.model.max_seq_len)
    TrainStep(c, env, tokenizer, model_config, chat_format)  # every length fits (prompts in SmolLM2's tokens)


def test_unknown_setting_is_named():
    with pytest.raises(Exception, match="unknown setting .huge."):  # absl wraps it in a flags error
        config_lib.load(["train", "--config=configs/bandit.py:huge"])


def test_demo_starts_from_the_shipped_warm_start_which_still_knows_the_format():
    """The shipped Bandit warm start (configs/warm_starts/bandit_tiny) has the tiny model's shapes and, greedy on 32
    validation prompts (experiments/evaluate.py), answers in the format (measured when it was made: 0.84 on 64
    prompts). A change to the Bandit's prompt or the built-in tokenizer that leaves it stale fails here: remake it
    (configs/demo.py)."""
    from experiments import evaluate

    demo = config_lib.load(["train", "--config=configs/demo.py", "--config.rollout.val_num_groups=32"])
    tiny = config_lib.load(["train", "--config=configs/bandit.py:tiny"])
    assert demo.train.sft_steps == 0 and demo.model.pretrained_path.endswith("warm_starts/bandit_tiny")
    assert build(demo).model_config == build(tiny).model_config
    lines = []
    metrics = evaluate.evaluate(demo, temperatures=(0.0,), log=lines.append, diagnostics=False)[0.0].metrics
    assert metrics["val-env/bandit/format_ok_rate"] >= 0.75
    assert lines == [f"temperature 0 | success {metrics['val-env/bandit/success']:.3f} | format_ok_rate "
                     f"{metrics['val-env/bandit/format_ok_rate']:.3f} | episode_reward "
                     f"{metrics['val-env/bandit/episode_reward']:.3f}"]


@pytest.mark.parametrize("algorithm, estimator, norm_by_std", [("ppo", "gae", True), ("drgrpo", "grpo", False)])
def test_mixed_frozen_lake_setting_builds_from_its_shipped_warm_start(algorithm, estimator, norm_by_std):
    c = config_lib.load(["train", f"--config=configs/frozen_lake.py:mixed,{algorithm}"])
    assert (c.algo.adv_estimator, c.algo.norm_adv_by_std) == (estimator, norm_by_std)
    assert (c.filter.top_p_mode, c.env.kwargs.goal_distance, c.env.success_rate) == ("linear", 3, 0.8)
    assert c.model.pretrained_path == os.path.join(CONFIGS, "warm_starts", "frozen_lake_mixed")
    assert c.rollout.val_num_groups * c.rollout.val_group_size >= 256  # the studies' validation size
    parts = build(c)  # loads the shipped warm start: its shapes are the config's
    TrainStep(c, parts.env, parts.tokenizer, parts.model_config, parts.chat_format)
    with pytest.raises(Exception, match="use mixed,ppo or mixed,drgrpo"):
        config_lib.load(["train", "--config=configs/frozen_lake.py:mixed,grpo"])


def test_collapse_frozen_lake_setting_is_tiny_without_its_kl_anchor():
    tiny = config_lib.load(["train", "--config=configs/frozen_lake.py:tiny"])
    c = config_lib.load(["train", "--config=configs/frozen_lake.py:collapse"])
    assert tiny.algo.use_kl_loss and not c.algo.use_kl_loss
    assert (c.train.total_steps, c.rollout.val_num_groups * c.rollout.val_group_size) == (60, 256)
    assert c.diagnostics.faithfulness_prompts == 256 and c.model.pretrained_path == tiny.model.pretrained_path
    differing = {k for k in ("algo", "train", "rollout", "diagnostics", "filter", "optim", "env", "model")
                 if c[k].to_dict() != tiny[k].to_dict()}
    assert differing == {"algo", "train", "rollout", "diagnostics"}


def test_population_frozen_lake_setting_is_tiny_without_kl_with_16_groups_and_every_row_scored():
    tiny = config_lib.load(["train", "--config=configs/frozen_lake.py:tiny"])
    c = config_lib.load(["train", "--config=configs/frozen_lake.py:population"])
    assert tiny.algo.use_kl_loss and not c.algo.use_kl_loss
    r = c.rollout
    assert r.num_groups * r.group_size == tiny.rollout.num_groups * tiny.rollout.group_size == 64
    assert r.num_groups == 2 * tiny.rollout.num_groups and c.diagnostics.num_samples == 64  # every row, 16 columns
    assert (c.train.total_steps, r.val_num_groups * r.val_group_size) == (100, 256)
    assert c.diagnostics.faithfulness_prompts == 256
    assert c.algo.entropy_coeff == tiny.algo.entropy_coeff and c.model.to_dict() == tiny.model.to_dict()
    assert c.filter.value == 1.0 and c.filter.empty_stop_steps == 0  # the study sweeps filter.value; every run ends


@pytest.mark.parametrize("algorithm, estimator, norm_by_std", [("ppo", "gae", True), ("drgrpo", "grpo", False)])
def test_sokoban_bucket_setting_keeps_the_tiny_rung_and_its_kl_loss(algorithm, estimator, norm_by_std):
    tiny = config_lib.load(["train", "--config=configs/sokoban.py:tiny"])
    c = config_lib.load(["train", f"--config=configs/sokoban.py:buckets,{algorithm}"])
    assert (c.algo.adv_estimator, c.algo.norm_adv_by_std) == (estimator, norm_by_std)
    assert (c.algo.use_kl_loss, c.algo.kl_loss_type, c.algo.kl_loss_coef) == (True, "low_var_kl", 0.5)
    assert c.env.to_dict() == tiny.env.to_dict() and c.model.to_dict() == tiny.model.to_dict()
    d = c.diagnostics
    assert (d.grad_analysis_every, d.grad_analysis_num_groups, d.grad_analysis_num_buckets) == (5, 48, 6)
    assert c.rollout.val_num_groups * c.rollout.val_group_size >= 256 and c.filter.value == 1.0
    with pytest.raises(Exception, match="use buckets,ppo or buckets,drgrpo"):
        config_lib.load(["train", "--config=configs/sokoban.py:buckets,grpo"])

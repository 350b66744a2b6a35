"""configs/paper.py against the experiment table of docs/filtering.md#settings-used-in-the-paper: each protocol's
settings, its sweep grid (sweepable keys only, every point valid), command-line loading with a protocol argument, clear
errors."""
from __future__ import annotations

import os
import re

import pytest

from configs import paper
from ragen_jax import config as config_lib
from ragen_jax.config import apply_overrides
from ragen_jax.train.hyper import SWEEPABLE
from ragen_jax.train.sweep import grid

PATHS = {"tokenizer.path": "/models/q/tokenizer.json", "model.pretrained_path": "/models/q"}


def load(arg: str):
    return config_lib.validate(apply_overrides(paper.get_config(arg), PATHS), num_devices=1)


def test_scripts_setting_is_shared():
    for arg in ("main_table,ppo,filter", "topp_sweep", "kl_sweep", "entropy_sweep", "frozenlake_slip,filter",
                "grad_analysis"):
        c = load(arg)
        assert (c.rollout.num_groups, c.rollout.group_size, c.train.total_steps) == (8, 16, 400), arg
        assert (c.algo.ppo_mini_batch_size, c.algo.ppo_micro_batch_size) == (32, 4), arg
        assert c.diagnostics.collapse_every == 5 and c.tokenizer.chat_format == "chatml", arg


@pytest.mark.parametrize("algorithm, estimator, agg", [("ppo", "gae", "token-mean"), ("dapo", "gae", "token-mean"),
                                                       ("grpo", "grpo", "seq-mean-token-mean"),
                                                       ("drgrpo", "grpo", "seq-mean-token-sum")])
def test_main_table(algorithm, estimator, agg):
    filtered, unfiltered = load(f"main_table,{algorithm},filter"), load(f"main_table,{algorithm},nofilter,frozen_lake")
    for c in (filtered, unfiltered):
        assert (c.algo.adv_estimator, c.algo.loss_agg_mode, c.algo.entropy_coeff) == (estimator, agg, 0.001)
        assert not c.algo.use_kl_loss and not c.algo.use_kl_in_reward
        assert (c.filter.strategy, c.filter.top_p_mode, c.filter.include_zero) == ("top_p", "softmax", True)
    assert (filtered.filter.value, unfiltered.filter.value) == (0.9, 1.0)
    assert (filtered.env.name, unfiltered.env.name, unfiltered.env.success_rate) == ("sokoban", "frozen_lake", 1.0)


def test_sweep_protocols():
    topp = load("topp_sweep")
    assert topp.algo.use_kl_loss and (topp.algo.kl_loss_coef, topp.algo.kl_loss_type) == (0.001, "kl")
    assert (topp.filter.top_p_mode, topp.filter.include_zero, topp.algo.entropy_coeff) == ("softmax", False, 0.001)
    kl, entropy = load("kl_sweep"), load("entropy_sweep")
    assert kl.algo.use_kl_loss and not entropy.algo.use_kl_loss
    assert (kl.filter.value, kl.filter.include_zero, entropy.filter.value) == (1.0, True, 1.0)
    slip, noslip = load("frozenlake_slip,filter"), load("frozenlake_slip,nofilter")
    assert (slip.env.name, slip.algo.entropy_coeff, slip.algo.use_kl_loss) == ("frozen_lake", 0.0, False)
    assert (slip.filter.value, slip.filter.include_zero) == (0.9, False)
    assert (noslip.filter.value, noslip.filter.include_zero) == (1.0, True)
    analysis = load("grad_analysis")
    assert (analysis.filter.top_p_mode, analysis.filter.include_zero, analysis.filter.eps) == ("linear", False, 0.01)
    d = analysis.diagnostics
    assert (d.grad_analysis_every, d.grad_analysis_num_groups, d.grad_analysis_group_size) == (50, 128, 16)


def test_grids_are_sweepable_and_valid():
    protocol_of = {"topp_sweep": "topp_sweep", "kl_sweep": "kl_sweep", "entropy_sweep": "entropy_sweep",
                   "frozenlake_slip": "frozenlake_slip,filter"}
    assert set(paper.GRIDS) == set(protocol_of)
    for name, axes in paper.GRIDS.items():
        assert set(axes) <= set(SWEEPABLE), name
        for point in grid(axes):
            config_lib.validate(apply_overrides(load(protocol_of[name]), point), num_devices=1)
    assert [p["env.success_rate"] for p in grid(paper.GRIDS["frozenlake_slip"])] == pytest.approx([
        1 - slip for slip in (0.0, 0.02, 0.05, 0.2, 0.5, 0.8, 1.0)])  # the slip probabilities of docs/differences.md


def test_command_line_protocol_argument():
    path = os.path.join(os.path.dirname(paper.__file__), "paper.py")
    c = config_lib.load(["train", f"--config={path}:main_table,drgrpo,filter",
                         *(f"--config.{k}={v}" for k, v in PATHS.items()), "--config.filter.value=0.8"])
    assert (c.algo.name, c.filter.value, c.model.pretrained_path) == ("drgrpo", 0.8, "/models/q")
    with pytest.raises(ValueError, match="unknown protocol 'nope'"):
        paper.get_config("nope")
    with pytest.raises(ValueError, match=re.escape("main_table,<ppo|dapo|grpo|drgrpo>,<filter|nofilter>")):
        paper.get_config("main_table,ppo")
    with pytest.raises(ValueError, match="takes no options"):
        paper.get_config("kl_sweep,extra")

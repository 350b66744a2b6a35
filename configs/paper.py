"""RAGEN-2's experiment protocols (docs/filtering.md#settings-used-in-the-paper) as configs; their grids run as
vectorised sweeps.

Pick a protocol after a colon; the model is Qwen2.5-3B (base) from a local folder, nothing downloads:

    Q=/models/Qwen2.5-3B    # config.json, model*.safetensors, tokenizer.json
    M="--config.model.pretrained_path=$Q --config.tokenizer.path=$Q/tokenizer.json"
    # main table (docs/differences.md#main-table): algorithm x filter (0.9 softmax top-p) vs nofilter, on Sokoban (or
    # frozen_lake, ...)
    experiments/train.py --config=configs/paper.py:main_table,grpo,filter $M
    experiments/train.py --config=configs/paper.py:main_table,ppo,nofilter,frozen_lake $M
    # top-p sweep (docs/differences.md#top-p-sweep); its "nofilter" column is main_table,ppo,nofilter (include_zero
    # differs: structural)
    experiments/sweep.py --config=configs/paper.py:topp_sweep $M --sweep=filter.value=1.0,0.98,0.95,0.9,0.8,0.6,0.4
    # KL / entropy sweeps (filter off)
    experiments/sweep.py --config=configs/paper.py:kl_sweep $M --sweep=algo.kl_loss_coef=0,0.001,0.003,0.01,0.03,0.1
    experiments/sweep.py --config=configs/paper.py:entropy_sweep $M --sweep=algo.entropy_coeff=0,0.001,0.003,0.01,0.03,0.1
    # FrozenLake stochasticity (docs/differences.md): success_rate = 1 - slip, with and without the filter
    experiments/sweep.py --config=configs/paper.py:frozenlake_slip,filter $M --sweep=env.success_rate=1,0.98,0.95,0.8,0.5,0.2,0
    # gradient analysis (docs/diagnostics.md): a separate 128 x 16 analysis batch every 50 steps, linear top-p 0.9
    experiments/train.py --config=configs/paper.py:grad_analysis $M

`GRIDS` holds those sweep axes. Everything else is the paper scripts' setting: 8 groups x 16 rollouts, 400 steps,
mini-batch 32 with micro-batch 4, collapse metrics every 5 steps (RAGEN's cadence), the ChatML template.
"""
from __future__ import annotations

from configs import base
from ragen_jax import config as config_lib
from ragen_jax.algos import presets

PROTOCOLS = ("main_table", "topp_sweep", "kl_sweep", "entropy_sweep", "frozenlake_slip", "grad_analysis")
GRIDS = {
    "topp_sweep": {"filter.value": [1.0, 0.98, 0.95, 0.9, 0.8, 0.6, 0.4]},
    "kl_sweep": {"algo.kl_loss_coef": [0.0, 0.001, 0.003, 0.01, 0.03, 0.1]},
    "entropy_sweep": {"algo.entropy_coeff": [0.0, 0.001, 0.003, 0.01, 0.03, 0.1]},
    "frozenlake_slip": {"env.success_rate": [1.0, 0.98, 0.95, 0.8, 0.5, 0.2, 0.0]},
}
_SCRIPTS = {"rollout.num_groups": 8, "rollout.group_size": 16, "train.total_steps": 400,
            "algo.ppo_mini_batch_size": 32, "algo.ppo_micro_batch_size": 4, "diagnostics.collapse_every": 5,
            "tokenizer.kind": "json", "tokenizer.chat_format": "chatml", "env.success_rate": 1.0}


def _parse(arg: str) -> tuple[str, list[str]]:
    name, *options = [part.strip() for part in arg.split(",")]
    if name not in PROTOCOLS:
        raise ValueError(f"configs/paper.py:{arg}: unknown protocol {name!r}; protocols: {', '.join(PROTOCOLS)}")
    return name, options


def get_config(arg: str = "main_table"):
    """The config of protocol `arg` = `name[,options]` (see the module doc). Returns a locked ConfigDict."""
    name, options = _parse(arg)
    if name == "main_table":  # main_table,<algorithm>,<filter|nofilter>[,<env>]
        if len(options) not in (2, 3) or options[1] not in ("filter", "nofilter"):
            raise ValueError(f"configs/paper.py:{arg}: use main_table,<{'|'.join(presets.ALGORITHM_PRESETS)}>,"
                             "<filter|nofilter>[,<env>]")
        algorithm, filtered = options[0], options[1] == "filter"
        config = presets.preset_config(base.get_config(), algorithm, filter="paper" if filtered else "none")
        env = options[2] if len(options) == 3 else "sokoban"
        return config_lib.apply_overrides(config, {**_SCRIPTS, "env.name": env})
    if name == "frozenlake_slip":  # frozenlake_slip,<filter|nofilter>: PPO, KL 0, entropy 0
        if options not in (["filter"], ["nofilter"]):
            raise ValueError(f"configs/paper.py:{arg}: use frozenlake_slip,<filter|nofilter>")
        filtered = options == ["filter"]
        config = presets.preset_config(base.get_config(), "ppo", filter="paper" if filtered else "none")
        return config_lib.apply_overrides(config, {
            **_SCRIPTS, "env.name": "frozen_lake", "algo.entropy_coeff": 0.0, "filter.include_zero": not filtered})
    if options:
        raise ValueError(f"configs/paper.py:{arg}: protocol {name!r} takes no options")
    if name == "topp_sweep":  # PPO with a k1 KL loss of 0.001 and entropy 0.001; zero-variance groups dropped
        config = presets.preset_config(base.get_config(), "ppo", filter="paper", kl="loss", kl_coef=0.001)
        return config_lib.apply_overrides(config, {**_SCRIPTS, "env.name": "sokoban", "filter.include_zero": False})
    if name in ("kl_sweep", "entropy_sweep"):  # PPO, filter off; the KL sweep puts the KL in the loss
        kl = "loss" if name == "kl_sweep" else None
        config = presets.preset_config(base.get_config(), "ppo", filter="none", kl=kl)
        return config_lib.apply_overrides(config, {**_SCRIPTS, "env.name": "sokoban"})
    # grad_analysis: PPO, linear top-p 0.9 without zero-variance groups, a separate 128 x 16 analysis batch
    config = presets.preset_config(base.get_config(), "ppo", filter="linear")
    return config_lib.apply_overrides(config, {
        **_SCRIPTS, "env.name": "sokoban", "diagnostics.grad_analysis_every": 50,
        "diagnostics.grad_analysis_num_groups": 128, "diagnostics.grad_analysis_group_size": 16})

"""The memory estimate (`ragen_jax.train.memory`, `experiments/memory.py`) against sizes computed by hand.

Everything is shapes: the 0.5B preset at FrozenLake's accelerator geometry is estimated, never built.
"""
from __future__ import annotations

import pytest

from configs import frozen_lake
from experiments import memory as memory_cli
from ragen_jax import config as cfg
from ragen_jax import config as config_lib
from ragen_jax.algos import presets as algo_presets
from ragen_jax.models import presets
from ragen_jax.train import memory

PARAMS = 494_032_768  # Qwen2.5-0.5B (tests/models/test_model_presets.py derives it from the shapes)
VOCAB, LAYERS, KV_HEADS, HEAD_DIM, HIDDEN = 151936, 24, 2, 64, 896


def accelerator_config(**overrides):
    config = frozen_lake.get_config()  # PPO (critic), KL off, 8 x 16 rollouts of 3600 tokens, micro-batch 4
    config.tokenizer.kind = "qwen2.5"
    for key, value in overrides.items():
        section, name = key.split(".")
        config[section][name] = value
    return config


def rows(est) -> dict[str, memory.Row]:
    return {r.name: r for r in est.rows}


def test_rows_equal_the_sizes_computed_by_hand():
    config = cfg.validate(accelerator_config(), num_devices=1)
    r = config.rollout
    batch, length, micro = r.num_groups * r.group_size, r.max_model_len, config.algo.ppo_micro_batch_size
    assert (batch, length, micro) == (128, 3600, 4)
    est = memory.estimate(config, presets.preset("qwen2.5-0.5b"), num_devices=1)
    got = rows(est)
    assert est.num_params == PARAMS and est.critic and not est.reference and est.mesh == (1, 1, 1)
    assert got["actor parameters"].size == 4 * PARAMS
    assert got["actor AdamW"].size == 2 * 4 * PARAMS + 4  # mu, nu float32 + the int32 step count
    assert got["critic parameters"].size == 4 * (PARAMS + HIDDEN + 1)  # the same backbone (tied: no head) + value head
    assert "reference parameters" not in got
    assert got["KV cache"].size == 2 * LAYERS * batch * KV_HEADS * length * HEAD_DIM * 4  # k and v, float32 compute
    # scoring holds every position's hidden state but unembeds a block of 2^24 logits: 1 position of 128 rows at
    # this vocabulary (2^24 < 128 x 151,936), 27 positions of a micro-batch's 4 rows (2^24 // (4 x 151,936))
    assert got["hidden states, scoring pass"].size == batch * (length - 1) * HIDDEN * 4
    assert got["logits block, scoring pass"].size == batch * 1 * VOCAB * 4
    assert got["hidden + cotangent, micro-batch"].size == 2 * micro * (length - 1) * HIDDEN * 4
    assert got["logits block + cotangent"].size == 2 * micro * 27 * VOCAB * 4
    assert got["actor gradients"].size == 2 * 4 * PARAMS
    assert all(row.per_device == row.size for row in est.rows)  # one device holds everything
    resident = sum(got[k].size for k in ("actor parameters", "actor AdamW", "critic parameters", "critic AdamW"))
    assert est.phase_bytes(memory.RESIDENT) == resident
    assert est.peak_phase == memory.ROLLOUT  # with block scoring the KV cache is the largest phase
    assert est.peak_per_device == resident + got["KV cache"].size


def test_critic_and_reference_follow_the_algorithm():
    grpo = config_lib.apply_overrides(accelerator_config(), algo_presets.ALGORITHM_PRESETS["grpo"])
    kl = config_lib.apply_overrides(grpo, algo_presets.kl_overrides("loss", 0.001))
    for config, critic, reference in ((grpo, False, False), (kl, False, True)):
        est = memory.estimate(cfg.validate(config, num_devices=1), presets.preset("qwen2.5-0.5b"), 1)
        names = set(rows(est))
        assert (est.critic, "critic parameters" in names, "critic gradients" in names) == (critic,) * 3
        assert (est.reference, "reference parameters" in names) == (reference,) * 2
    assert rows(est)["reference parameters"].size == 4 * PARAMS


def test_per_device_bytes_follow_the_mesh():
    config = cfg.validate(accelerator_config(**{"mesh.fsdp": 2}), num_devices=8)
    est = memory.estimate(config, presets.preset("qwen2.5-0.5b"), num_devices=8)
    got = rows(est)
    assert est.mesh == (1, 4, 2)
    # every 0.5B leaf has an even dimension, so fsdp = 2 halves the parameters and their optimizer moments
    assert got["actor parameters"].per_device == got["actor parameters"].size // 2
    assert got["KV cache"].per_device == got["KV cache"].size // 8  # 128 rows over data x fsdp = 8
    assert got["hidden states, scoring pass"].per_device == got["hidden states, scoring pass"].size // 8
    micro = got["logits block + cotangent"]  # 4 rows do not split 8 ways: counted whole
    assert micro.per_device == micro.size


def test_entry_point_prints_the_table(capsys):
    table = memory_cli.main(["memory", "--config=configs/frozen_lake.py", "--config.model.preset=qwen2.5-0.5b",
                             "--config.tokenizer.kind=builtin", "--devices=8", "--config.mesh.fsdp=2"])
    assert capsys.readouterr().out.strip() == table
    assert "memory estimate: qwen2.5-0.5b, algo ppo, env frozen_lake, 8 device(s)" in table
    assert "494,032,768 parameters" in table and "mesh: sweep 1 x data 4 x fsdp 2" in table
    assert "f32[128, 3599, 896]" in table and "estimated peak per device" in table
    with pytest.raises(SystemExit, match="--devices=x: expected a whole number"):
        memory_cli.main(["memory", "--config=configs/frozen_lake.py", "--devices=x"])

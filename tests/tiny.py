"""The overrides behind the tests' tiny training runs, written once: a 1-layer d32 decoder, 2 groups of 2 rollouts,
and the FrozenLake setting the step, loop, sweep and validation tests train on (each file adds what it checks)."""
TINY_MODEL = {"model.d_model": 32, "model.num_layers": 1, "model.num_heads": 2, "model.num_kv_heads": 1,
              "model.mlp_dim": 64}
TINY_BATCH = {"rollout.num_groups": 2, "rollout.group_size": 2, "rollout.response_length": 16,
              "algo.ppo_mini_batch_size": 2}
TINY_FROZEN_LAKE = {"env.name": "frozen_lake", **TINY_BATCH, "rollout.max_turn": 2, "rollout.max_model_len": 1024,
                    **TINY_MODEL, "model.max_seq_len": 1040}

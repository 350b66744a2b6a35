"""SFT warm start: oracle batches continue exactly the rollout's turn-1 context, and training lowers the loss."""
from __future__ import annotations

import jax
import numpy as np

from ragen_jax.models import transformer
from ragen_jax.train import sft
from tests.rollout.helpers import RESPONSE, run, tiny_setup


def test_oracle_batches_extend_the_rollout_context_and_training_lowers_the_loss():
    setup = tiny_setup(vocab_size=511)
    tokenizer, env, env_params, config = setup
    params = transformer.init_params(config, jax.random.key(0))
    rollout, traj = run(setup, params, max_len=1536, temperature=1.0, key=4)
    first_prompts = jax.jit(rollout.first_prompts)
    prompts, lengths, states = jax.device_get(first_prompts(jax.random.key(4), env_params))
    for b in range(rollout.batch_size):  # the same key renders the same turn-1 context as the rollout
        start = traj.response_start[b, 0]
        assert lengths[b] == start and (prompts[b, :start] == traj.tokens[b, :start]).all()

    rng = np.random.default_rng(0)
    tokens, attention, loss_mask, num_cut = sft.oracle_batch(rollout, tokenizer, first_prompts, jax.random.key(4), env_params,
                                                    np.random.default_rng(0), RESPONSE * 4)
    answers = env.oracles(states, rng)
    assert num_cut == 0
    for b, (reasoning, answer) in enumerate(answers):
        targets = tokens[b, 1:][loss_mask[b] > 0]
        assert tokenizer.decode(targets[:-1]) == sft.response_text(reasoning, answer, True)
        assert targets[-1] == tokenizer.eos_id and (tokens[b, :lengths[b]] == prompts[b, :lengths[b]]).all()
        assert attention[b].sum() == lengths[b] + len(targets)
        assert "<answer>" in tokenizer.decode(tokens[b, :lengths[b] + len(targets)])

    _, losses = sft.warm_start(rollout, tokenizer, params, env_params, jax.random.key(5), steps=12, lr=1e-2,
                               response_capacity=RESPONSE * 4, log=None)
    assert np.mean(losses[-3:]) < 0.8 * np.mean(losses[:3])

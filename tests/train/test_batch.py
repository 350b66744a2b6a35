"""Trajectory -> model inputs and reasoning spans: the training forward re-scores exactly what was sampled
(docs/architecture.md, design rule 6), and a template policy shows zero mutual information in the collapse
diagnostics (docs/diagnostics.md)."""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from ragen_jax.diagnostics import cross_logprobs, families
from ragen_jax.models import transformer
from ragen_jax.train import batch as batch_lib
from ragen_jax.algos.scoring import token_logprobs
from tests.rollout.helpers import GROUPS, REASONING, run, scripted_params, tiny_setup


def test_training_forward_rescores_the_sampled_tokens():
    """Model vocabulary == tokenizer vocabulary (511), temperature 1, top-p 1: the log-probs of the update's
    forward on the buffer equal the sampler's, which came from the KV-cached decode across turns."""
    setup = tiny_setup(vocab_size=511)
    config = setup[3]
    params = transformer.init_params(config, jax.random.key(5))
    _, traj = run(setup, params, max_len=1536, temperature=1.0, key=2)
    tokens, positions, attention, loss_mask = batch_lib.model_inputs(traj)
    logits_fn = functools.partial(transformer.apply, config)
    logp, _ = jax.jit(functools.partial(token_logprobs, logits_fn))(params, tokens, positions, attention,
                                                                    jnp.float32(1.0))
    mask = np.asarray(loss_mask) > 0
    assert mask.sum() == traj.response_len.sum() and not mask[~np.asarray(attention)[:, 1:]].any()
    np.testing.assert_allclose(np.asarray(logp)[mask], traj.sample_logp[:, 1:][mask], atol=2e-4)


def test_template_policy_has_zero_mutual_information():
    """Template collapse (docs/diagnostics.md): the scripted policy (high-entropy next-token distributions, the script
    as their argmax) greedily answers the same reasoning after every prompt, and its log-probs do not depend on the
    prompt: both collapse families report H(Z|X) > 0 and MI 0, with valid reasoning on every turn."""
    setup = tiny_setup()
    tokenizer, config = setup[0], setup[3]
    params = scripted_params(config, tokenizer, scale=1.0)
    _, traj = run(setup, params, max_len=1536, temperature=0.0)
    spans = batch_lib.reasoning_spans(jax.tree.map(jnp.asarray, traj))
    assert tokenizer.decode(traj.tokens[0, traj.think_start[0, 0]:][:traj.think_len[0, 0]]) == REASONING
    options = families.CollapseOptions(num_groups=GROUPS, num_samples=8, max_reasoning_len=16)
    score = functools.partial(cross_logprobs.cross_log_probs, transformer.DecoderLM(config), params, temperature=1.0)
    metrics, _ = jax.jit(lambda s, k: families.collapse_diagnostics(score, s, k, families.init_state(), options))(
        spans, jax.random.key(0))
    metrics = {k: float(v) for k, v in metrics.items()}
    assert metrics["collapse/valid_thinking_rate"] == 1.0 and metrics["collapse/first_turn_valid_rate"] == 1.0
    for family in (families.FIRST_TURN, families.TRAJECTORY):
        assert abs(metrics[f"{family}/mi_estimate"]) < 1e-5
        assert abs(metrics[f"{family}/mi_seq_estimate"]) < 1e-4
        assert metrics[f"{family}/conditional_entropy_est"] > 0

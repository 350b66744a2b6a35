"""The scripted bigram policy: its greedy continuation is the script after any prompt, its log-probs ignore the
prompt, and bad scripts are rejected."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ragen_jax import models
from ragen_jax.models import scripted, transformer

CONFIG = models.ModelConfig(vocab_size=40, d_model=16, num_layers=2, num_heads=2, num_kv_heads=1, head_dim=8,
                            mlp_dim=32, max_seq_len=32, tie_embeddings=False)
SCRIPT = [5, 9, 2, 30, 17, 1]


def test_script_is_the_argmax_after_any_prompt_and_ignores_it():
    params = scripted.scripted_params(CONFIG, SCRIPT, scale=1.0)
    rng = np.random.default_rng(0)
    logps = []
    for _ in range(3):
        prompt = rng.integers(0, CONFIG.vocab_size, 7)
        tokens = jnp.asarray(np.concatenate([prompt, SCRIPT])[None], jnp.int32)
        logits = transformer.apply(CONFIG, params, tokens)[0, len(prompt):-1]
        np.testing.assert_array_equal(np.argmax(logits, -1), SCRIPT[1:])
        logps.append(np.asarray(jax.nn.log_softmax(logits))[np.arange(len(SCRIPT) - 1), SCRIPT[1:]])
    np.testing.assert_allclose(logps[0], logps[1], atol=1e-6)
    np.testing.assert_allclose(logps[0], logps[2], atol=1e-6)
    assert (logps[0] < -0.5).all()  # scale 1: high entropy around the scripted argmax


def test_bad_scripts_are_rejected():
    with pytest.raises(ValueError, match="distinct"):
        scripted.scripted_params(CONFIG, [1, 2, 1])
    with pytest.raises(ValueError, match="tie_embeddings"):
        scripted.scripted_params(CONFIG.__class__(**{**CONFIG.__dict__, "tie_embeddings": True}), SCRIPT)

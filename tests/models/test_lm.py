"""The model seam (`ragen_jax.models.lm`): the `model.arch` registry builds the transformer's `DecoderLM`, and a new
architecture, one `CausalLM` subclass and one registry entry, is validated, sampled from and scored by the same code
as the transformer, against a numpy reference."""
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from configs import base
from ragen_jax import config as config_lib
from ragen_jax import models
from ragen_jax.algos import scoring
from ragen_jax.models import kv_cache, lm
from ragen_jax.rollout import sampler

CONFIG = models.ModelConfig(vocab_size=12, d_model=8, num_layers=1, num_heads=2, num_kv_heads=1, head_dim=4,
                            mlp_dim=16, max_seq_len=16)


@dataclasses.dataclass(frozen=True)
class Bigram(lm.CausalLM):
    """A toy architecture: the hidden state of a token is its embedding row (no context), logits are hidden @ head."""

    def init_params(self, key):
        embed_key, head_key = jax.random.split(key)
        c = self.config
        return {"embed": jax.random.normal(embed_key, (c.vocab_size, c.d_model)),
                "head": 3.0 * jax.random.normal(head_key, (c.d_model, c.vocab_size))}

    def init_value_params(self, key, backbone=None):
        return {"embed": (backbone or self.init_params(key))["embed"], "value": jnp.ones((self.config.d_model,))}

    def hidden_states(self, params, tokens, positions=None, attention_mask=None):
        return params["embed"][tokens]

    def logits_from_hidden(self, params, hidden):
        return hidden @ params["head"]

    def values(self, value_params, tokens, positions=None, attention_mask=None):
        return value_params["embed"][tokens] @ value_params["value"]

    def init_cache(self, batch_size, max_len=None):
        return kv_cache.init_cache(self.config, batch_size, max_len)

    def hidden_states_with_cache(self, params, tokens, cache, num_new=None, positions=None):
        num_new = jnp.full(tokens.shape[:1], tokens.shape[1], jnp.int32) if num_new is None else num_new
        lengths = jnp.minimum(cache.lengths + num_new, cache.max_len)
        return self.hidden_states(params, tokens), cache.replace(lengths=lengths)


@pytest.fixture
def bigram():
    config_lib.MODEL_ARCHS.register("bigram")(Bigram)
    yield
    config_lib.MODEL_ARCHS.unregister("bigram")


def test_the_registry_builds_the_transformer():
    model = lm.make("transformer", CONFIG)
    assert model == models.DecoderLM(CONFIG) and hash(model) == hash(models.DecoderLM(CONFIG))
    assert tuple(config_lib.MODEL_ARCHS) == ("transformer",) and base.get_config().model.arch == "transformer"
    with pytest.raises(config_lib.ConfigError, match="config.model.arch = 'bigram' is invalid: allowed values are "
                                                     "'transformer'"):
        lm.make("bigram", CONFIG)


def test_a_new_architecture_is_one_class_and_one_registry_entry(bigram):
    config = base.get_config()
    config.model.arch = "bigram"
    config_lib.validate(config, num_devices=8)
    model = lm.make(config.model.arch, CONFIG)
    params = model.init_params(jax.random.key(0))
    embed, head = np.asarray(params["embed"]), np.asarray(params["head"])

    prompt = jnp.asarray([[3, 5, 0], [7, 0, 0]], jnp.int32)
    lengths = jnp.asarray([2, 1], jnp.int32)
    out, cache = sampler.generate(model, params, model.init_cache(2, 12), prompt, lengths, jax.random.key(1),
                                  jnp.float32(0.0), jnp.float32(1.0), max_new_tokens=4)
    last = [5, 7]  # greedy: each token is the argmax of its predecessor's row of embed @ head
    for t in range(4):
        last = [int(np.argmax(embed[token] @ head)) for token in last]
        np.testing.assert_array_equal(out.tokens[:, t], last)
    np.testing.assert_array_equal(cache.lengths, [6, 5])

    tokens = jnp.asarray([[1, 4, 9, 2]], jnp.int32)
    positions, attention = jnp.arange(4)[None], jnp.ones((1, 4), bool)
    logp, _ = scoring.token_logprobs(model, params, tokens, positions, attention, jnp.float32(1.0))
    logits = embed[[1, 4, 9]] @ head
    want = logits[np.arange(3), [4, 9, 2]] - np.log(np.exp(logits).sum(-1))
    np.testing.assert_allclose(logp[0], want, rtol=1e-5, atol=1e-5)

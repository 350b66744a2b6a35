"""RL learns: GRPO raises the success of a weakly warm-started policy, and the regularisers alone do not.

The task is the first rung of the learning ladder: one turn whose correct answer is fixed by the prompt (a
traffic light: "Stop" at red, "Go" at green; reward 1 when right). The warm start demonstrates the format with
uniformly random answers (`sft_oracle_prob = 0`), so the policy starts near 50% success and only RL can tell it
which answer each light wants. With `algo.zero_task_advantage` (the same run, task gradient removed) success
must stay near the start. A wrong advantage sign, a loss mask off the sampled tokens or stale old log-probs make
the first assertion fail.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from configs import tasks
from environments.base import TextEnv
from environments.pieces import PieceTable
from ragen_jax.algos import presets
from ragen_jax.models import chat, transformer
from ragen_jax.models.config import ModelConfig
from ragen_jax.models.tokenizer import builtin
from ragen_jax.train import sft
from ragen_jax.train.step import Hyper, TrainStep

COLOURS, WORDS = ("red", "green"), ("Stop", "Go")


@struct.dataclass
class LightParams:
    reward: jnp.ndarray = 1.0


@struct.dataclass
class LightState:
    """colour i32[] index into COLOURS; answered i32[] -1 before the answer, else the word index."""

    colour: jnp.ndarray
    answered: jnp.ndarray


class TrafficLight(TextEnv):
    Params = LightParams
    default_params = LightParams(reward=jnp.float32(1.0))

    def __init__(self, tokenizer, **base_kwargs):
        self.pieces = PieceTable(tokenizer, ["Light: ", *COLOURS])
        self._label, self._colours = self.pieces.index("Light: "), self.pieces.indices(list(COLOURS))
        capacity = self.pieces.token_len("Light: ") + self.pieces.max_len(list(COLOURS))
        super().__init__(tokenizer, pieces=self.pieces, action_words=WORDS, obs_capacity=capacity,
                         instruction="Answer Stop at a red light and Go at a green one.", **base_kwargs)

    def init_state(self, key, params):
        return LightState(colour=jax.random.bernoulli(key).astype(jnp.int32), answered=jnp.int32(-1))

    def observation_pieces(self, s):
        return jnp.stack([jnp.int32(self._label), jnp.asarray(self._colours)[s.colour]]).astype(jnp.int32)

    def apply_action(self, key, s, action, params):
        reward = jnp.where(action == s.colour, params.reward, 0.0)
        return s.replace(answered=action), reward, jnp.bool_(True), jnp.bool_(True)

    def success(self, s):
        return s.answered == s.colour

    def oracle_answer(self, s, rng, max_actions):
        return "", WORDS[int(s.colour)]

    def describe(self, s, rng):
        return f"The light is {COLOURS[int(s.colour)]}."


def test_grpo_learns_the_prompt_dependent_answer_and_regularisers_alone_do_not():
    tokenizer = builtin()
    env = TrafficLight(tokenizer, max_actions_per_turn=1, max_actions_per_traj=1)
    base = tasks.tiny("traffic_light", {
        "model.d_model": 32, "model.num_layers": 2, "model.num_heads": 2, "model.num_kv_heads": 1,
        "model.mlp_dim": 64, "model.max_seq_len": 512, "rollout.max_turn": 1, "rollout.max_actions_per_turn": 1,
        "rollout.response_length": 24, "rollout.max_model_len": 384, "rollout.num_groups": 8,
        "rollout.group_size": 4, "algo.ppo_mini_batch_size": 8, "optim.actor_lr": 1e-3,
        "diagnostics.collapse_every": 0, "algo.entropy_coeff": 0.01})
    model_config = ModelConfig.from_config(base.model, tokenizer.vocab_size)
    params = transformer.init_params(model_config, jax.random.key(0))
    results = {}
    for zero_task in (False, True):
        config = presets.apply_overrides(base, {"algo.zero_task_advantage": zero_task})
        step = TrainStep(config, env, tokenizer, model_config, chat.plain())
        if zero_task is False:  # the same warm start for both runs
            params, _ = sft.warm_start(step.rollout, tokenizer, params, env.default_params, jax.random.key(1),
                                       steps=120, lr=3e-3, batch_size=16, oracle_prob=0.0, log=None)
        state = step.init(jax.random.key(2), params)
        hyper = Hyper.from_config(config, env.default_params)
        run = jax.jit(step, donate_argnums=0)
        successes = []
        for _ in range(12):
            state, metrics = run(state, jax.random.key(3), hyper)
            successes.append(float(metrics["traffic_light/success"]))
        results[zero_task] = successes
    learned, regularised = np.array(results[False]), np.array(results[True])
    start = np.mean([learned[0], regularised[0]])
    assert 0.2 < start < 0.8, results  # the warm start answers in format, right about half the time
    assert learned[-3:].mean() > start + 0.3, results
    assert abs(regularised[-3:].mean() - start) < 0.2, results

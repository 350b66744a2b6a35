"""RL learns: GRPO raises the success of a weakly warm-started policy, and the regularisers alone do not.

The task is the first rung of the learning ladder, a miniature of the Bandit: one turn, the prompt shows two of
four words ("Options: Go or Stop"), the valid answers are those two and the right one pays 1. The warm start
demonstrates the format with uniformly random valid answers (`sft_oracle_prob = 0`), so the policy starts near
50% success and only RL can tell it which word pays. With `algo.zero_task_advantage` (the same run, task gradient
removed) success must stay near the start. A wrong advantage sign, a loss mask off the sampled tokens or stale old log-probs make
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
from ragen_jax.models import chat, transformer
from ragen_jax.models.config import ModelConfig
from ragen_jax.models.tokenizer import builtin
from ragen_jax.train import sft
from ragen_jax.train.hyper import Hyper
from ragen_jax.train.step import TrainStep

STEPS, MARGIN = 15, 0.15  # GRPO steps, and the rise of the mean success of the last 5 over step 1
PAIRS = (("Stop", "Go"), ("Wait", "Run"))  # (wrong, right); a prompt shows one pair in random order
WORDS = tuple(word for pair in PAIRS for word in pair)  # action id = 2 * pair + (1 if right)


@struct.dataclass
class ChoiceParams:
    reward: jnp.ndarray = 1.0


@struct.dataclass
class ChoiceState:
    """pair i32[]; right_first bool[] the right word is shown first; answered i32[] -1, else the action id."""

    pair: jnp.ndarray
    right_first: jnp.ndarray
    answered: jnp.ndarray


class Choice(TextEnv):
    """A miniature of the Bandit (deterministic payout, short texts): "Options: Go or Stop"; the valid answers
    are the two words shown, the right one pays 1."""

    Params = ChoiceParams
    default_params = ChoiceParams(reward=jnp.float32(1.0))

    def __init__(self, tokenizer, **base_kwargs):
        self.pieces = PieceTable(tokenizer, ["Options: ", " or ", *WORDS])
        self._label, self._or, self._words = self.pieces.index("Options: "), self.pieces.index(" or "), \
            self.pieces.indices(list(WORDS))
        capacity = self.pieces.token_len("Options: ") + self.pieces.token_len(" or ") + 2 * self.pieces.max_len(
            list(WORDS))
        super().__init__(tokenizer, pieces=self.pieces, action_words=WORDS, obs_capacity=capacity,
                         instruction="Pick one of the two options.", **base_kwargs)

    def init_state(self, key, params):
        pair, first = jax.random.bernoulli(key, shape=(2,))
        return ChoiceState(pair=pair.astype(jnp.int32), right_first=first, answered=jnp.int32(-1))

    def observation_pieces(self, s):
        words = jnp.asarray(self._words)
        wrong, right = words[2 * s.pair], words[2 * s.pair + 1]
        first, second = jnp.where(s.right_first, right, wrong), jnp.where(s.right_first, wrong, right)
        return jnp.stack([jnp.int32(self._label), first, jnp.int32(self._or), second]).astype(jnp.int32)

    def action_valid(self, s, action):
        return action // 2 == s.pair

    def apply_action(self, key, s, action, params):
        reward = jnp.where(action % 2 == 1, params.reward, 0.0)
        return s.replace(answered=action), reward, jnp.bool_(True), jnp.bool_(True)

    def success(self, s):
        return s.answered == 2 * s.pair + 1

    def oracle_answer(self, s, rng, max_actions):
        return "", PAIRS[int(s.pair)][1]

    def describe(self, s, rng):
        return "I can say " + " or ".join(PAIRS[int(s.pair)][::-1] if bool(s.right_first) else PAIRS[int(s.pair)]) + "."


def test_grpo_learns_the_prompt_dependent_answer_and_regularisers_alone_do_not():
    tokenizer = builtin()
    env = Choice(tokenizer, max_actions_per_turn=1, max_actions_per_traj=1)
    base = tasks.tiny("choice", {
        "model.d_model": 32, "model.num_layers": 2, "model.num_heads": 2, "model.num_kv_heads": 1,
        "model.mlp_dim": 64, "model.max_seq_len": 512, "rollout.max_turn": 1, "rollout.max_actions_per_turn": 1,
        "rollout.response_length": 24, "rollout.max_model_len": 384, "rollout.num_groups": 8,
        "rollout.group_size": 4, "algo.ppo_mini_batch_size": 8, "optim.actor_lr": 1e-3,
        "diagnostics.collapse_every": 0})
    model_config = ModelConfig.from_config(base.model, tokenizer.vocab_size)
    params = transformer.init_params(model_config, jax.random.key(0))
    step = TrainStep(base, env, tokenizer, model_config, chat.plain())
    params, losses = sft.warm_start(step.rollout, tokenizer, params, env.default_params, jax.random.key(1),
                                    steps=250, lr=3e-3, batch_size=16, oracle_prob=0.0, log=None)
    assert np.mean(losses[-10:]) < 0.2 * np.mean(losses[:10]), "the warm start lowers the loss"
    hyper = Hyper.from_config(base, env.default_params)
    run = jax.jit(step, donate_argnums=0)  # the ablation is a traced value: both runs share one compiled step
    results = {}
    for zero_task in (False, True):  # the same warm start for both runs
        state = step.init(jax.random.key(2), params)
        successes = []
        for _ in range(STEPS if not zero_task else 6):  # the regularised run collapses at once
            state, metrics = run(state, jax.random.key(3), hyper.replace(zero_task_advantage=jnp.bool_(zero_task)))
            successes.append(float(metrics["choice/success"]))
        results[zero_task] = successes
    learned, regularised = np.array(results[False]), np.array(results[True])
    start = np.mean([learned[0], regularised[0]])  # step 1 rolls out the warm start (its update comes after)
    assert 0.2 < start < 0.8, results  # the warm start answers in format, right about half the time
    assert learned[-5:].mean() > start + MARGIN, results
    assert regularised[-5:].mean() < start + 0.05, results

"""The validation batch's faithfulness: how much of its observation the first-turn reasoning restates correctly.

    scorer = Faithfulness(validator, tokenizer, env_params, count)   # once: the first `count` prompts' facts
    metrics = scorer(sample)          # host, per validation: a transcripts.Sample of at least `count` rows

Template collapse is reasoning that stays fluent and diverse while it stops saying what the input is. Entropy cannot
see it and the MI estimate sees it only through the policy's own likelihoods; this score reads the text. The
validation prompts are the same at every evaluation (train/validation.py), so their facts (`TextEnv.facts`:
what the env's `describe` restates, environments/faithfulness.py) are computed once from the states the validation
rollout resets to with its fixed key. Per evaluation, the reasoning of each of the first `count` trajectories' first
turn (the span inside <think>..</think>; "" when the turn has none) is scored, and the metrics are

    val-faithfulness/<env>            the mean over the prompts of the share of their facts restated correctly
    val-faithfulness/<env>/<fact>     the share of the prompts whose reasoning restates that fact correctly

Host-side: the scoring is text matching on decoded tokens (`diagnostics.faithfulness_prompts` = count; 0 = off).
"""
from __future__ import annotations

import jax
import numpy as np

from environments.base import TextEnv
from environments.faithfulness import restated

PREFIX = "val-faithfulness"


def supported(env: TextEnv) -> bool:
    """Whether `env` lists the facts of its observations (`TextEnv.facts`)."""
    return type(env).facts is not TextEnv.facts


class Faithfulness:
    """Scores the first `count` trajectories of the batches of a `train.validation.Validator` (see the module doc).

    Args:
      validator: the Validator (its rollout, env, fixed key and env tag); tokenizer: the env's tokenizer;
      env_params: the env params the validation runs with; count: prompts scored, at most the validation batch.
    """

    def __init__(self, validator, tokenizer, env_params, count: int):
        rollout = validator.rollout
        env = rollout.env
        if not 0 < count <= rollout.batch_size:
            raise ValueError(f"faithfulness count must be in [1, {rollout.batch_size}], got {count}")
        state = jax.jit(rollout.first_prompts)(validator.key(), env_params)[2]
        self.facts = [env.facts(s) for s in env._host_rows(jax.tree.map(lambda x: x[:count], state))]
        self.names = tuple(f.name for f in self.facts[0])
        if any(tuple(f.name for f in facts) != self.names for facts in self.facts):
            raise ValueError(f"{type(env).__name__}.facts must name the same facts for every state")
        self.tokenizer, self.count, self.tag = tokenizer, count, validator.tag

    def reasonings(self, sample) -> list[str]:
        """The first-turn reasoning of the sample's first `count` rows ("" where the turn was not taken)."""
        s = jax.tree.map(np.asarray, sample)
        if s.tokens.shape[0] < self.count:
            raise ValueError(f"the sample holds {s.tokens.shape[0]} rows, fewer than the {self.count} scored")
        return [self.tokenizer.decode(s.tokens[b, s.think_start[b, 0]:s.think_start[b, 0] + s.think_len[b, 0]])
                if s.turn_taken[b, 0] else "" for b in range(self.count)]

    def __call__(self, sample) -> dict[str, float]:
        """The metrics of one validation batch's `sample` (host numpy or device arrays)."""
        table = np.stack([restated(facts, text) for facts, text in zip(self.facts, self.reasonings(sample))])
        out = {f"{PREFIX}/{self.tag}": float(table.mean())}
        out.update({f"{PREFIX}/{self.tag}/{name}": float(table[:, i].mean()) for i, name in enumerate(self.names)})
        return out

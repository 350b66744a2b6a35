"""Two-armed Bandit with named arms (RAGEN's Bandit / BanditTest, docs/environments.md#bandit), single turn.

Each reset draws a profession pair from the train or test pool (static `pool`): the first name is the
low-risk arm (pays `lo_reward` 0.1), the second the high-risk arm (pays `hi_reward` 1 with probability
`hi_prob` 0.25, else 0), shown in random order. The agent answers with an arm's name (case-insensitive);
any other name is an invalid action. Pulling ends the episode; the observation becomes
"{name}: {reward} points". success = the high-risk arm was chosen.

Deliberate difference from RAGEN (docs/differences.md#bandit-group-prompts): RAGEN seeds each env with `seed +
per-instance counter`, so the members of a group see different pairs and orders. Here the prompt depends only on the
reset key, so a group (which shares its reset key) sees one prompt; only the payout draws use the step keys.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct

from environments import registry
from environments.base import TextEnv
from environments.faithfulness import Fact
from environments.pieces import PieceTable

ARM_PAIRS = {  # (low-risk, high-risk)
    "train": (
        ("Teacher", "Trader"), ("Nurse", "StartupFounder"), ("Librarian", "Investor"),
        ("Accountant", "StockBroker"), ("Engineer", "RealEstateAgent"), ("Pharmacist", "Musician"),
        ("Clerk", "Freelancer"), ("Technician", "Youtuber"), ("Planner", "Artist"), ("Postman", "Pilot"),
        ("Banker", "VentureCapitalist"), ("Gardener", "Cryptominer"),
    ),
    "test": (
        ("Receptionist", "Explorer"), ("Archivist", "Filmmaker"), ("Bookkeeper", "Consultant"),
        ("SocialWorker", "Photographer"), ("Mechanic", "GameDesigner"), ("Secretary", "Entrepreneur"),
        ("Cashier", "DataScientist"), ("CivilServant", "StartupAccelerator"),
    ),
}
# The prompt with the two names (first shown = A, second = B) substituted between these segments.
PROMPT = (
    "You are playing a bandit game. Goal: maximize your total reward by choosing which arm to pull.\n"
    "Game rules:\n1. There are 2 arms, named ", "A", " and ", "B",
    ".\n2. Each arm has its own reward distribution, related to its name.\n"
    "3. Think about the symbolic meaning of each arm's name to guess how its rewards behave.\n"
    "4. Based on the names, which arm is more likely to give higher rewards on average? Choose between ",
    "A", " and ", "B", ", and answer like <answer> ", "A", " </answer> or <answer> ", "B", " </answer>.\n",
)
PAYOUTS = ("0.1", "1.0", "0.0")  # low arm, high arm hit, high arm miss (RAGEN prints the float)
INSTRUCTION = "You are playing a two-armed bandit game. Answer with the name of the arm you pull."


@struct.dataclass
class BanditParams:
    """lo_reward f32[], hi_reward f32[], hi_prob f32[]: the two arms' payouts."""

    lo_reward: jnp.ndarray = 0.1
    hi_reward: jnp.ndarray = 1.0
    hi_prob: jnp.ndarray = 0.25


@struct.dataclass
class BanditState:
    """pair i32[] index into the pool; hi_first bool[] the high-risk arm is shown first;
    pulled i32[] -1 before the pull, else 0 (low) / 1 (high); payout i32[] index into PAYOUTS."""

    pair: jnp.ndarray
    hi_first: jnp.ndarray
    pulled: jnp.ndarray
    payout: jnp.ndarray


class Bandit(TextEnv):
    """See the module docstring. Static arg `pool`: "train" or "test"."""

    Params = BanditParams
    default_params = BanditParams(lo_reward=jnp.float32(0.1), hi_reward=jnp.float32(1.0), hi_prob=jnp.float32(0.25))

    def __init__(self, tokenizer, *, pool: str = "train", **base_kwargs):
        if pool not in ARM_PAIRS:
            raise ValueError(f"Bandit pool must be one of {sorted(ARM_PAIRS)}, got {pool!r}")
        self.pool = pool
        self.pairs = ARM_PAIRS[pool]
        names = [name for pair in self.pairs for name in pair]  # action id = 2 * pair + (0 low, 1 high)
        fixed = [seg for seg in PROMPT if seg not in ("A", "B")]
        pieces = PieceTable(tokenizer, fixed + names + [": ", " points", *PAYOUTS])
        self._names = pieces.indices(names)
        self._prompt = [(seg if seg in ("A", "B") else pieces.index(seg)) for seg in PROMPT]
        self._result = pieces.indices([": ", " points"])
        self._payouts = pieces.indices(list(PAYOUTS))
        longest = pieces.max_len(names)
        prompt_len = sum(pieces.token_len(s) for s in fixed) + 6 * longest
        result_len = longest + pieces.token_len(": ") + pieces.max_len(list(PAYOUTS)) + pieces.token_len(" points")
        super().__init__(tokenizer, pieces=pieces, action_words=names, obs_capacity=max(prompt_len, result_len),
                         instruction=INSTRUCTION, **base_kwargs)

    def init_state(self, key, params):
        u = jax.random.uniform(key, (2,))
        pair = jnp.minimum((u[0] * len(self.pairs)).astype(jnp.int32), len(self.pairs) - 1)
        return BanditState(pair=pair, hi_first=u[1] < 0.5, pulled=jnp.int32(-1), payout=jnp.int32(0))

    def action_valid(self, s, action):
        return action // 2 == s.pair

    def apply_action(self, key, s, action, params):
        high = action % 2 == 1
        hit = jax.random.uniform(key) < params.hi_prob
        reward = jnp.where(high, jnp.where(hit, params.hi_reward, 0.0), params.lo_reward)
        payout = jnp.where(high, jnp.where(hit, 1, 2), 0)
        return s.replace(pulled=high.astype(jnp.int32), payout=payout), reward, jnp.bool_(True), jnp.bool_(True)

    def success(self, s):
        return s.pulled == 1

    def observation_pieces(self, s):
        names = jnp.asarray(self._names)
        lo, hi = names[2 * s.pair], names[2 * s.pair + 1]
        first, second = jnp.where(s.hi_first, hi, lo), jnp.where(s.hi_first, lo, hi)
        prompt = jnp.stack([first if p == "A" else second if p == "B" else jnp.int32(p) for p in self._prompt])
        chosen = jnp.where(s.pulled == 1, hi, lo)
        result = jnp.stack([chosen, jnp.int32(self._result[0]), jnp.asarray(self._payouts)[s.payout],
                            jnp.int32(self._result[1])])
        result = jnp.concatenate([result, jnp.zeros((prompt.shape[0] - result.shape[0],), jnp.int32)])
        return jnp.where(s.pulled >= 0, result, prompt).astype(jnp.int32)

    def oracle_answer(self, s, rng, max_actions):
        lo, hi = self.pairs[int(s.pair)]
        templates = (
            f"{lo} sounds like a steady, low-risk job while {hi} suggests high risk and high reward. "
            f"The risky arm should pay more on average, so I pull {hi}.",
            f"Comparing {lo} and {hi}: {lo} gives small but sure rewards, {hi} rare big ones. "
            f"Big rare payouts can beat a small certain one, so {hi}.",
            f"{hi} is the riskier name of the two; {lo} is the safe one. I expect {hi} to have the higher mean.",
        )
        return templates[int(rng.integers(len(templates)))], hi

    def describe(self, s, rng):
        lo, hi = self.pairs[int(s.pair)]
        first, second = (hi, lo) if bool(s.hi_first) else (lo, hi)
        templates = (f"The two arms are {first} and {second}.", f"I can pull {first} or {second}.")
        return templates[int(rng.integers(len(templates)))]

    def facts(self, s):
        lo, hi = self.pairs[int(s.pair)]
        first, second = (hi, lo) if bool(s.hi_first) else (lo, hi)
        return (Fact("arms", r"(?:arms are|pull) (.+?) (?:and|or) (.+?)\.", (first, second)),)


registry.register("bandit", Bandit)
registry.register("bandit_test", Bandit, pool="test")

"""Warm start: multi-turn demonstrations are laid out exactly as the rollout would lay them out (host replay) and
`oracle_prob` sets how often a demonstrated answer is the oracle's (that training on them lowers the loss is
checked by tests/train/test_learning.py, which warm-starts its policy)."""
from __future__ import annotations

import re

import jax
import numpy as np
import pytest

from ragen_jax import models
from ragen_jax.models import chat
from ragen_jax.rollout.rollout import Rollout
from ragen_jax.train import sft
from ragen_jax.train.demonstrations import Demonstrator, closing_text
from ragen_jax.train.own_reasoning import OwnReasoning, cut_reasoning
from tests.rollout.helpers import REASONING, scripted_params, tiny_setup
from tests.rollout.test_rollout import check_against_replay


MAX_LEN_TWO_TURNS = 800  # at key 1: room for every row's second turn, for no row's third


@pytest.fixture(scope="module")
def setup():
    return tiny_setup(vocab_size=511)


def make_rollout(setup, num_groups: int, group_size: int, max_turn: int = 3, max_len: int = 1536) -> Rollout:
    tokenizer, env, _, config = setup
    return Rollout(env, tokenizer, chat.plain(), models.DecoderLM(config), num_groups=num_groups,
                   group_size=group_size, max_turn=max_turn, response_length=64, max_len=max_len)


@pytest.mark.parametrize("oracle_prob", [1.0, 0.0])
def test_demonstrations_follow_the_rollout_layout_on_every_turn(setup, oracle_prob):
    tokenizer, _, env_params, _ = setup
    rollout = make_rollout(setup, 2, 2)
    traj = Demonstrator(rollout, tokenizer)(jax.random.key(1), env_params, np.random.default_rng(0), oracle_prob)
    check_against_replay(setup, rollout, traj)  # tokens, rewards, spans, done, success as the host replays them
    assert traj.format_ok[traj.turn_taken].all(), "every demonstration is a well-formed valid answer"
    assert (traj.turn_taken.sum(axis=1) > 1).any(), "later turns are demonstrated too"
    assert (traj.response_len[traj.turn_taken] < 64).all() and not traj.cut.any()
    if oracle_prob == 1.0:  # the oracle's shortest safe path never ends in a hole
        assert traj.success[traj.done].all()


def test_rows_cut_at_the_buffer_limit_are_demonstrated_up_to_it(setup):
    """A buffer that holds the first turns but not all three: the rows that do not fit stop and are marked cut, as
    in the rollout (a cut row's next start lies past the buffer: indexing it failed before)."""
    tokenizer, _, env_params, _ = setup
    rollout = make_rollout(setup, 4, 2, max_len=MAX_LEN_TWO_TURNS)
    traj = Demonstrator(rollout, tokenizer)(jax.random.key(1), env_params, np.random.default_rng(0), 0.0)
    assert traj.cut.any() and traj.turn_taken[:, 0].all() and not traj.turn_taken[:, 2].any()
    check_against_replay(setup, rollout, traj)


def test_oracle_prob_sets_the_share_of_oracle_answers_and_batches_are_trimmed(setup):
    tokenizer, env, env_params, _ = setup
    rollout = make_rollout(setup, 32, 1, max_turn=1)  # the first answers are compared
    demonstrator = Demonstrator(rollout, tokenizer)
    key = jax.random.key(7)
    _, first_states, _ = rollout._reset(jax.random.split(key, 3)[0], env_params)
    oracle = env.oracle_answers(first_states, np.random.default_rng(0))
    shares = {}
    for q in (0.0, 0.5, 1.0):
        traj = demonstrator(key, env_params, np.random.default_rng(1), q)
        answers = []
        for b in range(rollout.batch_size):
            start, n = traj.response_start[b, 0], traj.response_len[b, 0]
            answers.append(re.search("<answer>(.*)</answer>", tokenizer.decode(traj.tokens[b, start:start + n])).group(1))
        shares[q] = np.mean([a == o for a, o in zip(answers, oracle)])
    assert shares[1.0] == 1.0 and shares[0.0] < 0.3 and 0.3 < shares[0.5] < 0.85, shares
    tokens, _, attention, loss_mask = sft.training_arrays(traj)  # cut to the longest row, rounded up
    assert tokens.shape[1] % sft.WIDTH_MULTIPLE == 0 and tokens.shape[1] - sft.WIDTH_MULTIPLE < traj.length.max()
    assert attention.sum() == traj.length.sum() and loss_mask.sum() == traj.sampled.sum()


def test_own_reasoning_keeps_the_models_words_then_the_closing(setup):
    """With the scripted policy (greedy: REASONING, then its own closing) as the reasoner, every demonstrated turn is a
    prefix of at least 2 of REASONING's words, as the model wrote them, then the env's answer in the format, all of it
    SFT targets, and the layout is the rollout's on every turn. With more words asked than the model writes, no row is
    a target."""
    tokenizer, _, env_params, config = setup
    rollout = make_rollout(setup, 2, 2)
    params = scripted_params(config, tokenizer)
    own = OwnReasoning(rollout, params, tokenizer, temperature=0.0, top_p=1.0, min_words=2)
    traj = Demonstrator(rollout, tokenizer, own)(jax.random.key(1), env_params, np.random.default_rng(0), 0.0)
    kept = set()
    for b, t in zip(*np.nonzero(traj.turn_taken)):
        start, n = traj.response_start[b, t], traj.response_len[b, t]
        ids = traj.tokens[b, start:start + n].tolist()
        answer = re.search("<answer>(.*)</answer>", tokenizer.decode(ids)).group(1)
        closing = tokenizer.encode(closing_text(answer, True)) + [tokenizer.eos_id]
        assert ids[len(ids) - len(closing):] == closing
        reasoning = tokenizer.decode(ids[:len(ids) - len(closing)])
        assert REASONING.startswith(reasoning) and REASONING[len(reasoning):][:1] in ("", " "), reasoning
        assert len(reasoning.split()) >= 2
        kept.add(reasoning)
    assert len(kept) > 1, kept  # cut at different lengths
    check_against_replay(setup, rollout, traj)  # the targets are exactly the responses
    assert traj.format_ok[traj.turn_taken].all() and (traj.turn_taken.sum(axis=1) > 1).any()
    too_few = OwnReasoning(rollout, params, tokenizer, temperature=0.0, top_p=1.0, min_words=5)
    traj = Demonstrator(rollout, tokenizer, too_few)(jax.random.key(1), env_params, np.random.default_rng(0), 0.0)
    assert traj.turn_taken[:, 0].all() and not traj.sampled.any()


@pytest.mark.parametrize("text, complete, kept", [
    ("The teacher is safe. The trader</think><answer>x", False,
     {"The teacher", "The teacher is", "The teacher is safe.", "The teacher is safe. The",
      "The teacher is safe. The trader"}),
    ("I pick the trad", False, {"I pick", "I pick the"}),  # the last word may be cut: left out
    ("I pick the trader", True, {"I pick", "I pick the", "I pick the trader"}),  # ended at the end of turn: whole
    ("Hmm\n\n so <|im_end|>", True, {"Hmm\n\n so"}),
    ("one", True, {None}),
    ("  < / answer> later words here", False, {None}),
])
def test_cut_reasoning_keeps_whole_words_before_a_tag(text, complete, kept):
    rng = np.random.default_rng(0)
    assert {cut_reasoning(text, complete, rng, min_words=2) for _ in range(200)} == kept


def test_the_gradient_summed_over_micro_batches_is_the_whole_batchs():
    """`sft_gradient` in chunks of 2 and of 4 rows against the mean negative log-likelihood of all rows, computed
    here from the model's logits (the reference), and its gradient."""
    import jax.numpy as jnp

    model = models.DecoderLM(models.ModelConfig(vocab_size=32, d_model=16, num_layers=1, num_heads=2,
                                                num_kv_heads=1, head_dim=8, mlp_dim=32, max_seq_len=16))
    params = model.init_params(jax.random.key(0))
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, 32, (4, 9)).astype(np.int32)
    positions = np.broadcast_to(np.arange(9, dtype=np.int32), (4, 9)).copy()
    attention = np.ones((4, 9), bool)
    loss_mask = (rng.random((4, 8)) < 0.6).astype(np.float32)
    loss_mask[1] = 0.0  # a row without targets

    def reference(params):
        logp = jax.nn.log_softmax(model(params, tokens, positions, attention)[:, :-1], axis=-1)
        picked = jnp.take_along_axis(logp, tokens[:, 1:, None], axis=-1)[..., 0]
        return -(picked * loss_mask).sum() / loss_mask.sum()

    want_loss, want_grads = jax.value_and_grad(reference)(params)
    for micro in (2, 4):
        loss, grads = jax.jit(sft.sft_gradient, static_argnums=(0, 6))(model, params, tokens, positions, attention,
                                                                       loss_mask, micro)
        np.testing.assert_allclose(loss, want_loss, rtol=1e-5)
        for g, w in zip(jax.tree.leaves(grads), jax.tree.leaves(want_grads)):
            np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-6)

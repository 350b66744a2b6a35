"""Multi-turn rollout: the trajectory buffer is exactly the chat text of its messages, replayed on the host.

Two policies on the tiny geometry (FrozenLake, 2 groups x 2, 3 turns): a scripted bigram model (greedy, always
answers `<think>...</think><answer>Down</answer>`) and a random model (garbage responses, format penalties,
cut trajectories). Each trajectory is replayed one env at a time on the host (reset, `render_text`, `step`
with the recorded response) and its chat text is rebuilt with `ChatFormat.render` from the replayed messages.
"""
from __future__ import annotations

import jax
import numpy as np
import pytest

from ragen_jax.models import chat, transformer
from ragen_jax.rollout import prompts as prompts_lib
from ragen_jax.rollout.rollout import Rollout
from tests.rollout.helpers import (
    GROUP_SIZE,
    GROUPS,
    REASONING,
    SCRIPT,
    run,
    scripted_params,
    tiny_setup,
)


@pytest.fixture(scope="module")
def setup():
    return tiny_setup()


def replay(setup, rollout, traj, key=1):
    """Per trajectory: (chat bytes rebuilt from host-replayed messages, per-turn replay records); the geometry
    (groups, turns, response length) is the rollout's."""
    tokenizer, env, env_params, _ = setup
    group_size, response_length = rollout.group_size, rollout.response_length
    reset, step = jax.jit(env.reset), jax.jit(env.step)
    reset_key, _, step_key = jax.random.split(jax.random.key(key), 3)
    prefill = rollout.prompts.prefill_ids
    fmt = chat.plain()
    out = []
    for b in range(rollout.batch_size):
        _, state = reset(jax.random.split(reset_key, rollout.num_groups)[b // group_size], env_params)
        msgs = [("system", prompts_lib.system_content(env.instruction))]
        contents, records, reward, warn = [], [], None, False
        for t in range(rollout.max_turn):
            if not traj.turn_taken[b, t]:
                break
            msgs.append(("user", prompts_lib.user_content(t + 1, env.render_text(state), int(state.actions_left),
                                                          response_length, True, warn, reward)))
            start, n = traj.response_start[b, t], traj.response_len[b, t]
            generated = traj.tokens[b, start:start + n]
            stopped = n > 0 and generated[-1] == tokenizer.eos_id
            content = list(prefill) + list(generated[:-1] if stopped else generated)
            contents.append(b"".join(tokenizer.token_bytes(int(i)) for i in content))
            msgs.append(("assistant", f"\x00{len(contents) - 1}\x00"))
            response = np.zeros(len(prefill) + response_length, np.int32)
            response[:len(prefill) + n] = np.concatenate([prefill, generated])
            keys = jax.random.split(jax.random.fold_in(step_key, t), rollout.batch_size)
            _, state, r, done, info = step(keys[b], state, response, len(prefill) + n, env_params)
            records.append(dict(reward=float(r), format_ok=bool(info["format_ok"]), done=bool(done),
                                success=bool(info["success"]), num_actions=int(info["num_actions"])))
            reward, warn = float(r), not bool(info["action_is_valid"])
        text = fmt.render(msgs).encode()
        for k, c in enumerate(contents):
            text = text.replace(f"\x00{k}\x00".encode(), c)
        out.append((text, records))
    return out


def buffer_bytes(tokenizer, traj, b):
    return b"".join(tokenizer.token_bytes(int(i)) for i in traj.tokens[b, :traj.length[b]])


def check_against_replay(setup, rollout, traj):
    tokenizer = setup[0]
    for b, (text, records) in enumerate(replay(setup, rollout, traj)):
        assert buffer_bytes(tokenizer, traj, b) == text, f"trajectory {b}"
        taken = int(traj.turn_taken[b].sum())
        assert taken == len(records) and traj.turn_taken[b, :taken].all()
        np.testing.assert_allclose(traj.turn_reward[b, :taken], [r["reward"] for r in records], rtol=1e-6)
        np.testing.assert_array_equal(traj.format_ok[b, :taken], [r["format_ok"] for r in records])
        penalty = -0.1 * sum(not r["format_ok"] for r in records)
        np.testing.assert_allclose(traj.episode_reward[b], sum(r["reward"] for r in records) + penalty, rtol=1e-5)
        assert traj.num_actions[b] == sum(r["num_actions"] for r in records)
        assert traj.done[b] == records[-1]["done"] and traj.success[b] == records[-1]["success"]
        # the sampled mask is exactly the union of the response spans
        mask = np.zeros_like(traj.sampled[b])
        for t in range(taken):
            mask[traj.response_start[b, t]:traj.response_start[b, t] + traj.response_len[b, t]] = True
        np.testing.assert_array_equal(traj.sampled[b], mask)
        assert (traj.sample_logp[b][~mask] == 0).all()


def test_scripted_policy_matches_host_replay(setup):
    tokenizer, _, _, config = setup
    rollout, traj = run(setup, scripted_params(config, tokenizer), max_len=1536, temperature=0.0)
    check_against_replay(setup, rollout, traj)
    assert traj.turn_taken[:, 0].all() and not traj.cut.any()
    assert traj.format_ok[traj.turn_taken].all() and (traj.episode_reward >= 0).all()
    for b, t in zip(*np.nonzero(traj.turn_taken)):
        assert traj.response_len[b, t] == len(tokenizer.encode(SCRIPT)) - 1 + 1  # minus the prefill, plus the stop
        span = traj.tokens[b, traj.think_start[b, t]:traj.think_start[b, t] + traj.think_len[b, t]]
        assert tokenizer.decode(span) == REASONING
        # the reasoning's prompt is everything before it, "<think>" last (docs/diagnostics.md)
        assert tokenizer.decode(traj.tokens[b, :traj.think_start[b, t]]).endswith("<|assistant|><think>")
    # greedy + same reset key per group: group members have identical trajectories
    for g in range(GROUPS):
        rows = traj.tokens[g * GROUP_SIZE:(g + 1) * GROUP_SIZE]
        assert (rows == rows[0]).all()


def test_random_policy_with_penalties_and_cut_trajectories(setup):
    _, _, _, config = setup
    params = transformer.init_params(config, jax.random.key(3))
    rollout, traj = run(setup, params, max_len=1024, temperature=1.0)
    check_against_replay(setup, rollout, traj)
    assert (traj.length <= 1024).all()
    assert (~traj.format_ok[traj.turn_taken]).any(), "garbage responses should be penalised"
    assert traj.cut.any(), "1024 tokens hold two FrozenLake turns, not three"
    assert not (traj.cut & traj.done).any()
    # members of a group share the turn-1 prompt; their sampled responses differ
    first = traj.response_start[:, 0]
    for g in range(GROUPS):
        a, b = g * GROUP_SIZE, g * GROUP_SIZE + 1
        assert first[a] == first[b] and (traj.tokens[a, :first[a]] == traj.tokens[b, :first[b]]).all()
        assert not (traj.tokens[a, first[a]:first[a] + 8] == traj.tokens[b, first[b]:first[b] + 8]).all()


def test_reward_text_format():
    assert [prompts_lib.format_reward(r) for r in (0.0, 1.0, -0.1, 0.9, -0.2, 10.9, 0.25, -0.001, 12345.5)] == [
        "0", "1", "-0.1", "0.9", "-0.2", "10.9", "0.25", "0", "12345.5"]


def test_too_small_buffer_is_rejected(setup):
    tokenizer, env, _, config = setup
    with pytest.raises(ValueError, match="rollout.max_model_len = 300 is invalid: cannot hold"):
        Rollout(env, tokenizer, chat.plain(), transformer.DecoderLM(config), num_groups=1, group_size=1, max_turn=1,
                response_length=8, max_len=300)

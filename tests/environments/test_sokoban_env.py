"""Sokoban TextEnv (docs/environments.md#sokoban): RAGEN's grid_coord text, step through parsed responses, solver-driven
oracle."""
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_sokoban_core import GymSokoban, np_codes, python_bfs

import environments
from environments.base import TurnState
from environments.sokoban import Sokoban, SokobanState, dynamics
from environments.sokoban.generator import fallback_room

B, R = 32, 192
WORDS = ("Up", "down", "LEFT", "Right", "jump", "", " up ", "Left Right")


def reference_text(codes):
    """RAGEN's `grid_coord` render (collect_entity_coordinates + format_coordinate_render + grid), walls omitted."""
    height, width = codes.shape
    lines = [f"Board size: {height} rows x {width} cols (zero-indexed)."]
    for label, mask in (
        ("Targets", np.isin(codes, (2, 3, 6))), ("Boxes", codes == 4), ("Boxes on target", codes == 3),
        ("Player", codes == 5), ("Player on target", codes == 6),
    ):
        if mask.any():
            lines.append(f"{label}: " + ", ".join(f"({r}, {c})" for r, c in np.argwhere(mask)))
    grid = "\n".join("".join("#_O√XPS"[v] for v in row) for row in codes)
    return "Coordinates: \n" + "\n".join(lines) + "\nGrid Map: \n" + grid


def encode(tokenizer, texts):
    tokens, lengths = np.zeros((len(texts), R), np.int32), np.zeros(len(texts), np.int32)
    for i, text in enumerate(texts):
        ids = tokenizer.encode(text)[:R]
        tokens[i, : len(ids)], lengths[i] = ids, len(ids)
    return jnp.asarray(tokens), jnp.asarray(lengths)


def take(tree, i):
    return jax.tree.map(lambda x: x[i], tree)


def host_codes(states):
    return [np_codes(take(jax.device_get(states.env.room), i)) for i in range(states.done.shape[0])]


def decoded(tokenizer, obs):
    tokens, lengths = np.asarray(obs.tokens), np.asarray(obs.length)
    return [tokenizer.decode(list(tokens[i, : lengths[i]])) for i in range(tokens.shape[0])]


@pytest.fixture(scope="module")
def sokoban(builtin_tokenizer):
    env = Sokoban(builtin_tokenizer, max_actions_per_traj=100)
    reset = jax.jit(jax.vmap(env.reset, in_axes=(0, None)))
    step = jax.jit(jax.vmap(env.step, in_axes=(0, 0, 0, 0, None)))
    obs, state = reset(jax.random.split(jax.random.key(3), B), env.default_params)
    return env, reset, step, obs, state


@pytest.fixture(scope="module")
def oracle_episodes(sokoban):
    """Play every level with the oracle's answers; keep (obs, state) of every turn."""
    env, _, step, obs, state = sokoban
    optimal, _ = env.solve_batch(state)
    rng = np.random.default_rng(0)
    trace, total, turns = [(obs, state)], np.zeros(B), np.zeros(B, int)
    keys = jax.random.split(jax.random.key(0), B)
    for _ in range(60):
        if bool(np.all(state.done)):
            break
        answers = env.oracles(state, rng)
        texts = ["<answer></answer>" if a is None else f"<think>{a[0]}</think><answer>{a[1]}</answer>" for a in answers]
        live = ~np.asarray(state.done)
        players = np.asarray(state.env.room.player)
        for i in np.flatnonzero(live):  # the reasoning cites the player's coordinates
            assert f"({players[i] // 6}, {players[i] % 6})" in answers[i][0]
        obs, state, reward, done, info = step(keys, state, *encode(env.tokenizer, texts), env.default_params)
        assert np.asarray(info["format_ok"])[live].all() and np.asarray(info["action_is_effective"])[live].all()
        total += np.asarray(reward)
        turns += live
        trace.append((obs, state))
    return np.asarray(optimal), trace, total, turns, np.asarray(info["success"])


def test_oracle_solves_every_level_optimally(sokoban, oracle_episodes):
    env, *_, state = sokoban
    optimal, trace, total, turns, success = oracle_episodes
    assert success.all()
    assert list(optimal) == [python_bfs(c) for c in host_codes(state)]  # env.solve is the optimum
    assert (optimal >= 1).all()
    assert (turns == np.ceil(optimal / env.max_actions_per_turn)).all()
    np.testing.assert_allclose(total, 11.0 - 0.1 * optimal, atol=1e-4)  # one box: +1 +10 and -0.1 per move


def test_render_is_ragen_text_and_decodes_exactly(sokoban, oracle_episodes, bpe_tokenizer):
    env = sokoban[0]
    bpe_env = Sokoban(bpe_tokenizer)
    bpe_render = jax.jit(jax.vmap(bpe_env.render))
    for obs, state in oracle_episodes[1]:
        texts = env.render_texts(state)
        codes = host_codes(state)
        assert texts == [reference_text(c) for c in codes]
        assert decoded(env.tokenizer, obs) == texts
        assert decoded(bpe_tokenizer, bpe_render(state.env)) == texts
        assert (np.asarray(obs.length) <= env.obs_capacity).all()
    assert "Boxes on target: " in texts[0]  # the last turn shows solved rooms


def test_min_solution_length_param(sokoban):
    env, reset, *_ = sokoban
    params = env.default_params.replace(min_solution_length=jnp.int32(5))
    _, state = reset(jax.random.split(jax.random.key(11), B), params)
    num_moves, _ = env.solve_batch(state)
    fallback, _ = fallback_room(6, 6, 1)
    is_fallback = (np.asarray(state.env.room.fixed) == np.asarray(fallback.fixed)).all((1, 2))
    assert ((np.asarray(num_moves) >= 5) | is_fallback).all() and (~is_fallback).mean() > 0.25


def apply_reference(codes, text, max_actions):
    """RAGEN's parse (docs/prompts_and_parsing.md) + execution of valid actions until solved, on the gym-sokoban
    reference."""
    answer = text.split("<answer>")[1].split("</answer>")[0]
    parts = [p.strip() for p in answer.split("||") if p.strip()][:max_actions]
    lookup = {w.lower(): i for i, w in enumerate(dynamics.ACTION_WORDS)}
    valid = [lookup[p.lower()] for p in parts if p.lower() in lookup]
    gym, reward, solved, moved = GymSokoban(codes), 0.0, False, False
    for direction in valid:
        r, solved, moved = gym.step(direction)
        reward += r
        if solved:
            break
    state = np.where((gym.room_state == 5) & (gym.room_fixed == 2), 6, gym.room_state)
    return state, reward, len(valid) > 0 and len(valid) == len(parts), moved


@settings(max_examples=6, deadline=None)
@given(seed=st.integers(0, 2**31 - 1))
def test_random_answers_follow_gym_rules_and_keep_invariants(sokoban, seed):
    env, _, step, _, state = sokoban
    rng = np.random.default_rng(seed)
    keys = jax.random.split(jax.random.key(seed % 1000), B)
    codes = host_codes(state)
    for _ in range(4):
        texts = []
        for _ in range(B):
            words = [WORDS[i] for i in rng.integers(0, len(WORDS), rng.integers(0, 4))]
            texts.append(f"<think>t</think><answer>{' || '.join(words)}</answer>")
        live = ~np.asarray(state.done)
        before = jax.device_get(state.env)
        _, state, reward, done, info = step(keys, state, *encode(env.tokenizer, texts), env.default_params)
        after_codes = host_codes(state)
        for i in np.flatnonzero(live):
            expected, expected_reward, format_ok, moved = apply_reference(codes[i], texts[i], env.max_actions_per_turn)
            assert np.array_equal(after_codes[i], expected), texts[i]
            assert np.isclose(float(reward[i]), expected_reward, atol=1e-5) and bool(info["format_ok"][i]) == format_ok
            if int(info["num_actions"][i]) == 0:  # nothing valid: the state is untouched
                pairs = zip(jax.tree.leaves(before), jax.tree.leaves(state.env))
                assert all(np.array_equal(a[i], b[i]) for a, b in pairs)
        for c, ok in zip(after_codes, np.asarray(info["success"])):
            assert np.isin(c, (3, 4)).sum() == env.num_boxes  # box count constant
            assert np.isin(c, (5, 6)).sum() == 1  # one player, never on a wall (its cell shows P or S)
            assert ok == (np.isin(c, (4,)).sum() == 0)  # solved exactly when every box is on a target
        codes = after_codes


@settings(max_examples=6, deadline=None)
@given(seed=st.integers(0, 2**31 - 1))
def test_random_tokens_never_crash_nor_change_state(sokoban, seed):
    env, _, step, _, state = sokoban
    rng = np.random.default_rng(seed)
    tokens = jnp.asarray(rng.integers(0, env.tokenizer.vocab_size, (B, R)), jnp.int32)
    lengths = jnp.asarray(rng.integers(0, R + 1, B), jnp.int32)
    obs, new_state, reward, done, info = step(jax.random.split(jax.random.key(1), B), state, tokens, lengths,
                                              env.default_params)
    untouched = np.asarray(info["num_actions"]) == 0
    assert untouched.mean() > 0.9
    for a, b in zip(jax.tree.leaves(state.env), jax.tree.leaves(new_state.env)):
        assert np.array_equal(np.asarray(a)[untouched], np.asarray(b)[untouched])
    assert (np.asarray(reward)[untouched] == 0).all() and not np.asarray(info["format_ok"])[untouched].any()
    assert (np.asarray(obs.length) > 0).all()


def test_effective_flag_and_max_steps(sokoban):
    env, _, step, _, state = sokoban
    room = dynamics.room_from_text("######\n#P___#\n#_X__#\n#__O_#\n#____#\n######")
    answers = ["Up", "Right", "Left || Up", "Down || Down", "Right || Down"] + ["jump"] * (B - 5)
    single = TurnState(env=SokobanState(room=room, num_env_steps=jnp.int32(0)), actions_left=jnp.int32(100),
                       done=jnp.bool_(False))
    batch = jax.tree.map(lambda x: jnp.broadcast_to(x, (B, *jnp.shape(x))), single)
    tokens = encode(env.tokenizer, [f"<think>x</think><answer>{a}</answer>" for a in answers])
    keys = jax.random.split(jax.random.key(2), B)
    _, new, reward, done, info = step(keys, batch, *tokens, env.default_params)
    effective = np.asarray(info["action_is_effective"])
    assert list(effective[:5]) == [False, True, False, True, True]  # the LAST executed action counts
    assert list(np.asarray(info["num_actions"])[:5]) == [1, 1, 2, 2, 2]
    np.testing.assert_allclose(np.asarray(reward)[:5], [-0.1, -0.1, -0.2, -0.2, -0.2], atol=1e-6)
    # gym-sokoban's step limit is a traced param: with max_steps=1 the first action ends the episode
    _, new, _, done, info = step(keys, batch, *tokens, env.default_params.replace(max_steps=jnp.int32(1)))
    assert list(np.asarray(done)[:5]) == [True] * 5 and not np.asarray(done)[5:].any()
    assert list(np.asarray(info["num_actions"])[:5]) == [1] * 5 and not np.asarray(info["success"]).any()


def test_larger_sokoban_two_boxes(builtin_tokenizer, bpe_tokenizer):
    env, params = environments.make("larger_sokoban", builtin_tokenizer)
    assert (env.height, env.width, env.num_boxes) == (8, 8, 2) and "(7, 7)" in env.instruction
    texts = [
        "########\n#P_____#\n#_X__O_#\n#______#\n#__√___#\n#______#\n#______#\n########",
        "########\n#______#\n#_SX_O_#\n#_X____#\n#______#\n#______#\n#______#\n########",
    ]
    rooms = [dynamics.room_from_text(t) for t in texts]
    states = TurnState(
        env=SokobanState(room=jax.tree.map(lambda *x: jnp.stack(x), *rooms), num_env_steps=jnp.zeros(2, jnp.int32)),
        actions_left=jnp.full((2,), 10, jnp.int32), done=jnp.zeros(2, bool),
    )
    codes = host_codes(states)
    assert env.render_texts(states) == [reference_text(c) for c in codes]
    bpe_env = environments.make("larger_sokoban", bpe_tokenizer)[0]
    assert decoded(bpe_tokenizer, jax.jit(jax.vmap(bpe_env.render))(states.env)) == [reference_text(c) for c in codes]
    num_moves, moves = env.solve_batch(states)
    assert list(np.asarray(num_moves)) == [python_bfs(c) for c in codes]
    # the solution executed through step (two actions per turn) solves both rooms
    step = jax.jit(jax.vmap(env.step, in_axes=(0, 0, 0, 0, None)))
    moves = np.asarray(moves)
    state, keys = states.replace(actions_left=jnp.full((2,), 100, jnp.int32)), jax.random.split(jax.random.key(0), 2)
    for turn in range(math.ceil(int(num_moves.max()) / 2)):
        words = [[dynamics.ACTION_WORDS[m] for m in row[2 * turn : 2 * turn + 2] if m >= 0] for row in moves]
        answers = [" || ".join(w) for w in words]
        texts = [f"<think>push</think><answer>{a}</answer>" for a in answers]
        obs, state, reward, done, info = step(keys, state, *encode(env.tokenizer, texts), params)
    assert np.asarray(info["success"]).all() and np.asarray(done).all()
    assert all("Boxes on target: " in t and "Boxes: " not in t for t in env.render_texts(state))

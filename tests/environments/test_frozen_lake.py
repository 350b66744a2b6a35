"""FrozenLake (docs/environments.md#frozenlake) against a numpy BFS, a Python render of RAGEN's text, gymnax and
gymnasium."""
from collections import deque

import gymnasium
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from gymnax.environments.misc.frozen_lake import FrozenLake as GymnaxFrozenLake
from hypothesis import given, settings
from hypothesis import strategies as st

from environments.frozen_lake import FrozenLakeState
from tests.environments.helpers import (
    assert_no_action_no_change, batched, encode, jit, make_env, obs_text, random_responses, take,
)

B, R, SIZE = 256, 64, 4
GYM_MAP = ("SFFF", "FHFH", "FFFH", "HFFG")
ACTIONS = ("Left", "Down", "Right", "Up")


def bfs_path_exists(holes, start, goal, size=SIZE):
    seen, queue = {start}, deque([start])
    while queue:
        r, c = divmod(queue.popleft(), size)
        for nr, nc in ((r + 1, c), (r - 1, c), (r, c + 1), (r, c - 1)):
            i = nr * size + nc
            if 0 <= nr < size and 0 <= nc < size and i not in seen and not holes[i]:
                seen.add(i)
                queue.append(i)
    return goal in seen


def reference_text(holes, start, goal, pos, size=SIZE):
    """RAGEN's grid_coord render, written out independently."""
    xy = lambda i: f"({i // size}, {i % size})"
    lines = [f"Board size: {size} rows x {size} cols (zero-indexed).", f"Start: {xy(start)}", f"Goal: {xy(goal)}"]
    label = "Player on goal" if pos == goal else "Player in hole" if holes[pos] else "Player"
    lines.append(f"{label}: {xy(pos)}")
    if holes.any():
        lines.append("Holes: " + ", ".join(xy(i) for i in np.flatnonzero(holes)))
    rows = []
    for r in range(size):
        row = ""
        for c in range(size):
            i = r * size + c
            if i == pos:
                row += "√" if i == goal else "X" if holes[i] else "P"
            else:
                row += "O" if holes[i] else "G" if i == goal else "_"
        rows.append(row)
    return "Coordinates: \n" + "\n".join(lines) + "\nGrid Map: \n" + "\n".join(rows)


@pytest.fixture(scope="module")
def fl(builtin_tokenizer):
    env, _ = make_env("frozen_lake", builtin_tokenizer)
    reset, step = batched(env)
    return env, step, reset


def responses(tokenizer, answers):
    return encode(tokenizer, [f"<think>go</think><answer>{a}</answer>" for a in answers], R)


def batch_state(fl, holes, start, goal, pos):
    """TurnState batch of B envs from numpy values (broadcast), with a budget that never runs out."""
    env, _, reset = fl
    _, state = reset(jax.random.split(jax.random.key(0), B), env.default_params)
    b = lambda x: np.broadcast_to(np.asarray(x, np.int32), (B,))
    inner = FrozenLakeState(holes=np.broadcast_to(np.asarray(holes, bool), (B, SIZE * SIZE)),
                            start=b(start), goal=b(goal), pos=b(pos))
    return state.replace(env=inner, actions_left=np.full((B,), 1000, np.int32), done=np.zeros((B,), bool))


@settings(max_examples=12, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), p_frozen=st.floats(0.3, 1.0))
def test_maps_always_have_a_path(fl, seed, p_frozen):
    env, _, reset = fl
    params = env.default_params.replace(p_frozen=jnp.float32(p_frozen))
    _, state = reset(jax.random.split(jax.random.key(seed), B), params)
    s = jax.tree.map(np.asarray, state.env)
    assert (s.start != s.goal).all() and (s.pos == s.start).all()
    assert not s.holes[np.arange(B), s.start].any() and not s.holes[np.arange(B), s.goal].any()
    for i in range(B):
        assert bfs_path_exists(s.holes[i], int(s.start[i]), int(s.goal[i])), (seed, p_frozen, i)


def test_map_statistics(fl):
    env, _, reset = fl
    _, state = reset(jax.random.split(jax.random.key(7), B), env.default_params)
    s = jax.tree.map(np.asarray, state.env)
    free = np.ones_like(s.holes)
    free[np.arange(B), s.start] = free[np.arange(B), s.goal] = False
    rate = s.holes[free].mean()  # 0.1 before rejecting disconnected maps, a little less after
    assert 0.07 < rate < 0.11
    counts = np.bincount(s.start, minlength=SIZE * SIZE)
    assert counts.min() > 0.4 * B / SIZE**2 and counts.max() < 1.8 * B / SIZE**2


@pytest.mark.parametrize("distance", [1, 2])
def test_goal_distance_draws_the_goal_uniformly_near_the_start(builtin_tokenizer, distance):
    env, _ = make_env("frozen_lake", builtin_tokenizer, goal_distance=distance)
    n = 4096
    _, state = batched(env).reset(jax.random.split(jax.random.key(distance), n), env.default_params)
    s = jax.tree.map(np.asarray, state.env)
    (sr, sc), (gr, gc) = np.divmod(s.start, SIZE), np.divmod(s.goal, SIZE)
    d = np.abs(sr - gr) + np.abs(sc - gc)
    assert d.min() >= 1 and d.max() <= distance
    for i in range(n):
        assert bfs_path_exists(s.holes[i], int(s.start[i]), int(s.goal[i]))
    # from a corner tile, the goal is uniform over the `distance`-ball's tiles on the board
    corner = s.start == 0
    eligible = [t for t in range(1, SIZE * SIZE) if sum(divmod(t, SIZE)) <= distance]
    counts = np.bincount(s.goal[corner], minlength=SIZE * SIZE)[eligible]
    expected = corner.sum() / len(eligible)
    assert counts.sum() == corner.sum() and np.abs(counts - expected).max() < 4 * np.sqrt(expected)


def test_render_matches_ragen_text(fl, tokenizer):
    """Maps from the module's (built-in tokenizer) reset, rendered by an env of each tokenizer."""
    _, _, reset = fl
    env, params = make_env("frozen_lake", tokenizer)
    _, state = reset(jax.random.split(jax.random.key(3), B), params)
    s = jax.tree.map(np.asarray, state.env)
    # half the players moved somewhere (a hole, the goal or ice) to cover every label and symbol
    moved = np.where(np.arange(B) % 2, np.random.default_rng(0).integers(0, SIZE * SIZE, B), s.pos)
    state = state.replace(env=state.env.replace(pos=moved.astype(np.int32)))
    obs = jit(jax.vmap(env.render))(state.env)
    for i in range(B):
        text = env.render_text(take(state, i))
        assert text == reference_text(s.holes[i], int(s.start[i]), int(s.goal[i]), int(moved[i]))
        assert obs_text(tokenizer, obs, i) == text


def test_slip_frequencies_match_the_stated_probabilities(fl, builtin_tokenizer):
    env, step, _ = fl
    holes = np.zeros(SIZE * SIZE, bool)
    state = batch_state(fl, holes, 5, 15, 5)  # player on (1, 1), interior: every move changes the tile
    tokens, lengths = responses(builtin_tokenizer, ["Down"] * B)
    moved = {-SIZE: "Up", SIZE: "Down", -1: "Left", 1: "Right"}
    for success_rate in (0.7, 1.0 / 3.0, 1.0):
        params = env.default_params.replace(success_rate=jnp.float32(success_rate))
        counts = {a: 0 for a in ACTIONS}
        for rep in range(8):
            out = step(jax.random.split(jax.random.key(rep), B), state, tokens, lengths, params)
            for d in np.asarray(out[1].env.pos) - 5:
                counts[moved[int(d)]] += 1
        n = 8 * B
        want = {"Down": success_rate, "Left": (1 - success_rate) / 2, "Right": (1 - success_rate) / 2, "Up": 0.0}
        for a, p in want.items():
            sd = np.sqrt(n * p * (1 - p))
            assert abs(counts[a] - n * p) <= 4.5 * sd + 1e-9, (success_rate, a, counts)


def test_slip_distribution_matches_gymnax():
    """gymnax FrozenLake-misc with the same success_rate draws the same three outcomes (two-sample test)."""
    env = GymnaxFrozenLake(desc=("FFFF", "FSFF", "FFFF", "FFFG"), success_rate=0.6)

    def next_position(key):
        state = env.reset(jax.random.key(0), env.default_params)[1]
        return env.step(key, state, 1, env.default_params)[1].position

    pos = np.asarray(jit(jax.vmap(next_position))(jax.random.split(jax.random.key(1), 8 * B)))
    n = 8 * B
    freq = {d: np.mean(pos == 5 + d) for d in (SIZE, -1, 1, -SIZE)}
    for d, p in ((SIZE, 0.6), (-1, 0.2), (1, 0.2), (-SIZE, 0.0)):
        assert abs(freq[d] - p) <= 4.5 * np.sqrt(p * (1 - p) / n) + 1e-9, freq


def run_ours(fl, tokenizer, holes, start, goal, actions):
    """Step B envs through action sequences actions[B, T] (success_rate 1): positions, rewards, dones."""
    env, step, _ = fl
    state = batch_state(fl, holes, start, goal, start)
    trace = []
    for t in range(actions.shape[1]):
        tokens, lengths = responses(tokenizer, [ACTIONS[a] for a in actions[:, t]])
        _, state, reward, done, _ = step(jax.random.split(jax.random.key(t), B), state, tokens, lengths,
                                         env.default_params)
        trace.append((np.asarray(state.env.pos), np.asarray(reward), np.asarray(done)))
    return trace


def test_deterministic_moves_match_gymnax_on_its_map(fl, builtin_tokenizer):
    holes = np.array([ch == "H" for row in GYM_MAP for ch in row])
    actions = np.random.default_rng(0).integers(0, 4, (B, 8))
    ours = run_ours(fl, builtin_tokenizer, holes, 0, 15, actions)
    gx = GymnaxFrozenLake(desc=GYM_MAP, is_slippery=False)
    gx_step = jit(jax.vmap(gx.step_env, in_axes=(None, 0, 0, None)))
    state = jit(jax.vmap(lambda k: gx.reset(k, gx.default_params)[1]))(jax.random.split(jax.random.key(0), B))
    done = np.zeros(B, bool)
    for t, (pos, reward, our_done) in enumerate(ours):
        _, new, r, term, _ = gx_step(jax.random.key(t), state, actions[:, t], gx.default_params)
        live = ~done  # once terminated, ours stays put (no auto-reset)
        np.testing.assert_array_equal(pos[live], np.asarray(new.position)[live])
        np.testing.assert_array_equal(reward[live], np.asarray(r)[live])
        np.testing.assert_array_equal(our_done[live], np.asarray(term)[live])
        done |= np.asarray(term)
        state = new


def test_deterministic_moves_match_gymnasium_on_our_maps(fl, builtin_tokenizer):
    env, _, reset = fl
    _, state = reset(jax.random.split(jax.random.key(11), B), env.default_params)
    s = jax.tree.map(np.asarray, state.env)
    actions = np.random.default_rng(1).integers(0, 4, (B, 6))
    for i in range(0, B, 64):  # a handful of maps, each through gymnasium
        ours = run_ours(fl, builtin_tokenizer, s.holes[i], s.start[i], s.goal[i], actions[:1].repeat(B, 0))
        desc = np.where(s.holes[i], "H", "F").astype("<U1")
        desc[s.start[i]], desc[s.goal[i]] = "S", "G"
        gym = gymnasium.make("FrozenLake-v1", desc=["".join(r) for r in desc.reshape(SIZE, SIZE)], is_slippery=False)
        gym.reset(seed=0)
        for t, (pos, reward, done) in enumerate(ours):
            g_pos, g_reward, g_term, _, _ = gym.step(int(actions[0, t]))
            assert (pos[0], reward[0], done[0]) == (g_pos, g_reward, g_term), (i, t)
            if g_term:
                break


def test_oracle_solves_deterministic_maps(fl, builtin_tokenizer):
    env, step, reset = fl
    _, state = reset(jax.random.split(jax.random.key(5), B), env.default_params)
    state = state.replace(actions_left=np.full((B,), 1000, np.int32))
    rng = np.random.default_rng(0)
    lengths = [len(env.shortest_path(take(state.env, i))) for i in range(B)]
    for turn in range(max(lengths) // 2 + 1):
        answers = []
        for i in range(B):
            one = take(state, i)
            if bool(one.done):
                answers.append("Left")
                continue
            reasoning, answer = env.oracle(one, rng)
            assert f"{_c(int(one.env.goal))}" in reasoning
            answers.append(answer)
        tokens, lens = responses(builtin_tokenizer, answers)
        state = step(jax.random.split(jax.random.key(turn), B), state, tokens, lens, env.default_params)[1]
        finished = np.asarray(state.done)
        assert finished[np.array(lengths) <= 2 * (turn + 1)].all()
    assert np.asarray(state.env.pos == state.env.goal).all()


def _c(i):
    return f"({i // SIZE}, {i % SIZE})"


@settings(max_examples=20, deadline=None)
@given(data=st.data())
def test_random_tokens_never_crash_or_corrupt(fl, builtin_tokenizer, data):
    env, step, reset = fl
    seed = data.draw(st.integers(0, 2**31 - 1))
    rng = np.random.default_rng(seed)
    _, state = reset(jax.random.split(jax.random.key(seed), B), env.default_params)
    tokens, lengths = random_responses(rng, builtin_tokenizer, B, R)
    tokens[: B // 2, :4] = builtin_tokenizer.encode("<think>")[0]  # some start like a real response
    _, new, reward, done, info = step(jax.random.split(jax.random.key(1), B), state, tokens, lengths,
                                      env.default_params)
    unchanged = assert_no_action_no_change(state, new, reward, info)
    assert not np.asarray(info["format_ok"])[unchanged].any()
    pos = np.asarray(new.env.pos)
    assert ((pos >= 0) & (pos < SIZE * SIZE)).all()

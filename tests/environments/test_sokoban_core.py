"""Sokoban core (dynamics, generator, solver) against a plain-Python gym-sokoban reference and Python BFS.

1000 levels of each geometry (6x6 with 1 box, 8x8 with 2 boxes) are generated, solved in-graph, checked
and replayed through the dynamics; 30 of each are re-solved by the Python BFS.
"""
from collections import deque

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from environments.sokoban import dynamics
from environments.sokoban.generator import Generator, fallback_push_room, fallback_room
from environments.sokoban.solver import Solver

GEOMETRIES = {"6x6x1": (6, 6, 1, 1000), "8x8x2": (8, 8, 2, 1000)}
MAX_MOVES = 100
DELTAS = ((-1, 0), (1, 0), (0, -1), (0, 1))  # Up, Down, Left, Right


# ----------------------------------------------------------------------------- Python references
class GymSokoban:
    """gym-sokoban's `_push`/`_move`/`_calc_reward` rules on RAGEN's room_state/room_fixed arrays.

    The boxes-on-target counter starts from the room (gym-sokoban resets it to 0, the same for generated
    levels, which never start with a box on a target)."""

    def __init__(self, codes):
        codes = np.asarray(codes)
        self.room_fixed = np.where(codes == 0, 0, np.where(np.isin(codes, (2, 3, 6)), 2, 1))
        self.room_state = np.where(codes == 6, 5, codes)
        self.num_boxes = int(np.isin(codes, (3, 4)).sum())
        assert (self.room_fixed == 2).sum() == self.num_boxes, "gym-sokoban rooms have one target per box"
        self.boxes_on_target = int((codes == 3).sum())
        self.player = np.argwhere(self.room_state == 5)[0]

    def step(self, direction):
        change = np.array(DELTAS[direction])
        new, box_new = self.player + change, self.player + 2 * change
        moved = False
        inside = 0 <= box_new[0] < self.room_state.shape[0] and 0 <= box_new[1] < self.room_state.shape[1]
        if inside and self.room_state[tuple(new)] in (3, 4) and self.room_state[tuple(box_new)] in (1, 2):
            self.room_state[tuple(box_new)] = 3 if self.room_fixed[tuple(box_new)] == 2 else 4
            moved = True
        elif self.room_state[tuple(new)] in (1, 2):
            moved = True
        if moved:
            self.room_state[tuple(self.player)] = self.room_fixed[tuple(self.player)]
            self.room_state[tuple(new)] = 5
            self.player = new
        reward = -0.1
        empty_targets = (self.room_state == 2) | ((self.room_fixed == 2) & (self.room_state == 5))
        on_target = self.num_boxes - int(empty_targets.sum())
        if on_target > self.boxes_on_target:
            reward += 1.0
        elif on_target < self.boxes_on_target:
            reward -= 1.0
        solved = on_target == self.num_boxes
        if solved:
            reward += 10.0
        self.boxes_on_target = on_target
        return reward, solved, moved


def python_bfs(codes):
    """Optimal number of moves by plain BFS over (player, frozenset of boxes); -1 if unsolvable."""
    codes = np.asarray(codes)
    walls = codes == 0
    targets = frozenset(map(tuple, np.argwhere(np.isin(codes, (2, 3, 6)))))
    boxes = frozenset(map(tuple, np.argwhere(np.isin(codes, (3, 4)))))
    start = (tuple(np.argwhere(np.isin(codes, (5, 6)))[0]), boxes)
    seen, queue = {start: 0}, deque([start])
    while queue:
        state = queue.popleft()
        (r, c), boxes = state
        if boxes <= targets:
            return seen[state]
        for dr, dc in DELTAS:
            ahead, beyond = (r + dr, c + dc), (r + 2 * dr, c + 2 * dc)
            if walls[ahead]:
                continue
            new_boxes = boxes
            if ahead in boxes:
                if walls[beyond] or beyond in boxes:
                    continue
                new_boxes = (boxes - {ahead}) | {beyond}
            nxt = (ahead, new_boxes)
            if nxt not in seen:
                seen[nxt] = seen[state] + 1
                queue.append(nxt)
    return -1


# ----------------------------------------------------------------------------- compiled once per module
def replay(rooms, actions):
    """Run directions [B, T] (-1 = skip) through `dynamics.step_room`; per-step rewards, solved, moved, rooms."""

    def one(room, acts):
        def step(r, a):
            r2, reward, solved, moved = dynamics.step_room(r, jnp.maximum(a, 0))
            keep = a >= 0
            r2 = jax.tree.map(lambda new, old: jnp.where(keep, new, old), r2, r)
            return r2, (jnp.where(keep, reward, 0.0), solved & keep, moved & keep, r2)

        return jax.lax.scan(step, room, acts)[1]

    return jax.vmap(one)(rooms, actions)


@pytest.fixture(scope="module", params=list(GEOMETRIES))
def generated(request):
    height, width, num_boxes, count = GEOMETRIES[request.param]
    generator = Generator(height, width, num_boxes, max_moves=MAX_MOVES)
    generate = jax.jit(jax.vmap(generator.level, in_axes=(0, None)))  # one compile: min_solution_length is traced
    levels = generate(jax.random.split(jax.random.key(7), count), 1)
    return request.param, generate, jax.device_get(levels)


@pytest.fixture(scope="module")
def replay_jit():
    return jax.jit(replay)


def codes_of(rooms):
    return np.asarray(jax.jit(jax.vmap(dynamics.room_codes))(rooms))


def take(tree, index):
    return jax.tree.map(lambda x: x[index], tree)


# ----------------------------------------------------------------------------- generator
def test_levels_are_valid_solvable_and_unsolved(generated):
    name, _, levels = generated
    height, width, num_boxes, count = GEOMETRIES[name]
    room = levels.room
    codes = codes_of(room)
    fixed = np.asarray(room.fixed)
    # a wall border, boxes and player on distinct floor cells, as many targets as boxes, none covered
    assert (fixed[:, 0, :] == 0).all() and (fixed[:, -1, :] == 0).all()
    assert (fixed[:, :, 0] == 0).all() and (fixed[:, :, -1] == 0).all()
    flat = fixed.reshape(count, -1)
    cells = np.concatenate([np.asarray(room.boxes), np.asarray(room.player)[:, None]], axis=1)
    assert all(len(set(row)) == num_boxes + 1 for row in cells)
    assert (np.take_along_axis(flat, cells, 1) != 0).all()
    assert ((flat == 2).sum(1) == num_boxes).all()
    assert (np.isin(codes, (3,)).sum((1, 2)) == 0).all()  # no box starts on a target
    assert (np.isin(codes, (4,)).sum((1, 2)) == num_boxes).all()
    num_moves = np.asarray(levels.num_moves)
    assert (num_moves >= 1).all()  # solvable and not already solved
    assert np.asarray(levels.accepted).mean() > 0.99, "too many fallback rooms"
    assert np.median(num_moves) >= (4 if num_boxes == 1 else 8), "levels are too easy"


def test_solutions_replay_to_solved_exactly_at_the_end(generated, replay_jit):
    _, _, levels = generated
    rewards, solved, moved, rooms = jax.device_get(replay_jit(levels.room, jnp.asarray(levels.moves)))
    num_moves = np.asarray(levels.num_moves)
    steps = np.arange(MAX_MOVES)[None, :]
    in_solution = steps < num_moves[:, None]
    assert (np.asarray(levels.moves)[in_solution] >= 0).all() and (np.asarray(levels.moves)[~in_solution] == -1).all()
    # every move of an optimal solution moves the player; the level is solved at the last move, not before
    assert moved[in_solution].all()
    first_solved = np.argmax(solved, axis=1)
    assert solved.any(axis=1).all() and (first_solved == num_moves - 1).all()
    final_reward = rewards[np.arange(len(num_moves)), num_moves - 1]
    assert (final_reward >= 10.9 - 1e-5).all()


HAND_MADE_SOLVER = {  # (room, optimal number of moves, optimal moves if unique)
    "6x6x1": [
        ("######\n#X___#\n#__O_#\n#_P__#\n#____#\n######", -1, None),  # box stuck in a corner
        ("######\n#√___#\n#____#\n#_P__#\n#____#\n######", 0, []),  # already solved
        ("######\n#_O__#\n#_X__#\n#__P_#\n#____#\n######", 2, [2, 0]),  # Left, Up
    ],
    "8x8x2": [
        ("########\n#X_____#\n#___O__#\n#__P___#\n#___X_O#\n#______#\n#______#\n########", -1, None),
        ("########\n#______#\n#_√____#\n#__P___#\n#___√__#\n#______#\n#______#\n########", 0, []),
        ("########\n#PX_O__#\n#______#\n#______#\n#__X___#\n#__O___#\n#______#\n########", 5, [3, 3, 1, 1, 1]),
    ],
}


def test_solver_is_optimal_against_python_bfs(generated):
    name, _, levels = generated
    height, width, num_boxes, _ = GEOMETRIES[name]
    sample = take(levels.room, np.arange(30))
    codes = codes_of(sample)
    expected = [python_bfs(c) for c in codes]
    assert list(np.asarray(levels.num_moves)[:30]) == expected  # Generator.level's solution
    hand_made = [dynamics.room_from_text(text) for text, _, _ in HAND_MADE_SOLVER[name]]
    assert [python_bfs(np_codes(room)) for room in hand_made] == [n for _, n, _ in HAND_MADE_SOLVER[name]]
    rooms = jax.tree.map(lambda x, *h: jnp.concatenate([x, jnp.stack(h)]), sample, *hand_made)
    exact = Solver(height, width, num_boxes, max_moves=MAX_MOVES)
    num_moves, moves = jax.device_get(jax.jit(jax.vmap(exact))(rooms))
    assert list(num_moves) == expected + [n for _, n, _ in HAND_MADE_SOLVER[name]]
    steps = np.arange(MAX_MOVES)[None]
    assert np.array_equal(moves >= 0, steps < num_moves[:, None])
    for (_, _, solution), row in zip(HAND_MADE_SOLVER[name], moves[30:]):
        if solution is not None:
            assert list(row[: len(solution)]) == solution


def test_min_solution_length_and_determinism(generated):
    name, generate, levels = generated
    height, width, num_boxes, count = GEOMETRIES[name]
    minimum = 5 if num_boxes == 1 else 12
    hard = generate(jax.random.split(jax.random.key(1), count), minimum)
    num_moves, accepted = np.asarray(hard.num_moves), np.asarray(hard.accepted)
    assert (num_moves[accepted] >= minimum).all() and accepted.mean() > 0.25
    fallback, fallback_moves = fallback_room(height, width, num_boxes)
    assert (np.asarray(hard.room.fixed)[~accepted] == np.asarray(fallback.fixed)).all()
    assert (num_moves[~accepted] == len(fallback_moves)).all()
    again = generate(jax.random.split(jax.random.key(7), count), 1)  # same keys => same levels
    assert all(np.array_equal(a, b) for a, b in zip(jax.tree.leaves(again), jax.tree.leaves(levels)))


@pytest.mark.parametrize("height,width,num_boxes", [(6, 6, 1), (8, 8, 2), (5, 7, 2)])
def test_fallback_room_and_its_solution(height, width, num_boxes):
    room, moves = fallback_room(height, width, num_boxes)
    codes = np_codes(room)
    assert python_bfs(codes) == len(moves) == 4 * num_boxes - 2
    gym = GymSokoban(codes)
    results = [gym.step(m) for m in moves]
    assert results[-1][1] and not any(r[1] for r in results[:-1])


@pytest.mark.parametrize("push_distance", [1, 2])
def test_push_distance_levels_are_that_many_pushes_in_a_line(push_distance):
    """push_distance k: the player stands right behind the box, k cells from its target along a line; the Python
    BFS finds k moves optimal, and the reference rules solve the room by k pushes that way and not before; every
    direction occurs."""
    generator = Generator(6, 6, 1, push_distance=push_distance)
    levels = jax.device_get(jax.jit(jax.vmap(generator))(jax.random.split(jax.random.key(3), 200)))
    rooms, accepted = levels
    codes, directions = [np_codes(take(rooms, i)) for i in range(len(accepted))], []
    for i in range(len(accepted)):
        (player,), (box,) = np.argwhere(codes[i] == 5), np.argwhere(codes[i] == 4)
        (target,) = np.argwhere(np.isin(codes[i], (2, 3)))
        step = box - player
        assert np.abs(step).sum() == 1 and (target == box + push_distance * step).all()
        direction = DELTAS.index(tuple(step))
        assert python_bfs(codes[i]) == push_distance
        gym = GymSokoban(codes[i])
        solved = [gym.step(direction)[1] for _ in range(push_distance)]
        assert solved == [False] * (push_distance - 1) + [True]
        directions.append(direction)
    assert sorted(set(directions)) == [0, 1, 2, 3] and accepted.mean() > 0.9
    fallback, moves = fallback_push_room(6, 6, push_distance)
    assert python_bfs(np_codes(fallback)) == len(moves) == push_distance
    with pytest.raises(ValueError, match="push_distance"):
        Generator(6, 6, 2, push_distance=1)


# ----------------------------------------------------------------------------- dynamics vs gym-sokoban rules
def test_random_play_matches_gym_sokoban(generated, replay_jit):
    _, _, levels = generated
    count = 64
    rooms = take(levels.room, np.arange(count))
    rng = np.random.default_rng(0)
    actions = rng.integers(0, 4, (count, MAX_MOVES)).astype(np.int32)
    actions[:, 40:] = -1
    rewards, solved, moved, trail = jax.device_get(replay_jit(rooms, jnp.asarray(actions)))
    trail_codes = np.asarray(jax.jit(jax.vmap(jax.vmap(dynamics.room_codes)))(trail))
    for i, codes in enumerate(codes_of(rooms)):
        gym = GymSokoban(codes)
        for t in range(40):
            reward, done, did_move = gym.step(actions[i, t])
            assert np.isclose(rewards[i, t], reward) and solved[i, t] == done and moved[i, t] == did_move
            expected = np.where((gym.room_state == 5) & (gym.room_fixed == 2), 6, gym.room_state)
            assert np.array_equal(trail_codes[i, t], expected)


def test_random_play_matches_the_gym_sokoban_package(generated, replay_jit):
    """The same random play against the gym-sokoban package itself (bench extra; skipped without it)."""
    sokoban_env = pytest.importorskip("gym_sokoban.envs.sokoban_env")
    _, _, levels = generated
    count, steps = 32, 40
    rooms = take(levels.room, np.arange(count))
    actions = np.random.default_rng(1).integers(0, 4, (count, MAX_MOVES)).astype(np.int32)
    rewards, solved, moved, trail = jax.device_get(replay_jit(rooms, jnp.asarray(actions)))
    trail_codes = np.asarray(jax.jit(jax.vmap(jax.vmap(dynamics.room_codes)))(trail))
    for i, codes in enumerate(codes_of(rooms)):
        gym = sokoban_env.SokobanEnv(dim_room=codes.shape, num_boxes=int(np.isin(codes, (3, 4)).sum()), reset=False)
        gym.room_fixed = np.where(codes == 0, 0, np.where(np.isin(codes, (2, 3, 6)), 2, 1))
        gym.room_state = np.where(codes == 6, 5, codes)
        gym.player_position = np.argwhere(gym.room_state == 5)[0]
        gym.boxes_on_target, gym.num_env_steps = 0, 0
        for t in range(steps):
            moved_player, _ = gym._push(int(actions[i, t]) + 1)  # gym-sokoban's push actions are 1..4
            gym._calc_reward()
            assert np.isclose(rewards[i, t], gym.reward_last) and moved[i, t] == moved_player
            assert solved[i, t] == gym._check_if_all_boxes_on_target()
            expected = np.where((gym.room_state == 5) & (gym.room_fixed == 2), 6, gym.room_state)
            assert np.array_equal(trail_codes[i, t], expected)


HAND_MADE = [  # (room, direction, reward, solved, moved); rows are padded with walls to one shape
    ("######\n#PXO_#\n######", 3, 10.9, True, True),  # last box onto its target
    ("######\n#_P√_#\n######", 3, -1.1, False, True),  # box pushed off a target
    ("####\n#O_#\n#X_#\n#P_#\n####", 0, 10.9, True, True),  # push up onto the target
    ("#######\n#P√XO_#\n#######", 3, -0.1, False, False),  # two boxes in a row cannot be pushed
    ("#######\n#PX_O√#\n#######", 3, -0.1, False, True),  # push between floor cells
    ("#######\n#_PXO√#\n#######", 3, 10.9, True, True),  # second box lands: solved
    ("#######\n#_P√OX#\n#######", 3, -0.1, False, True),  # target to target: no +-1
    ("#######\n#√_PX_#\n#O#####\n#######", 1, -0.1, False, False),  # walk into a wall
    ("#######\n#S_X√_#\n#######", 3, -0.1, False, True),  # stepping off a target is no penalty
    ("######\n#PX_√#\n#O___#\n######", 3, -0.1, False, True),
    ("#######\n#X_√P_#\n#O#####\n#######", 2, -1.1, False, True),  # push left off a target
]


def padded_codes(text, shape=(5, 7)):
    lookup = {symbol: code for code, symbol in enumerate(dynamics.GRID_SYMBOLS)}
    codes = np.zeros(shape, np.int32)
    for r, row in enumerate(text.split("\n")):
        codes[r, : len(row)] = [lookup[ch] for ch in row]
    return codes


def np_codes(room):
    """RAGEN codes of one host Room, written out with numpy."""
    codes = np.where(np.asarray(room.fixed) == 2, 2, np.where(np.asarray(room.fixed) == 0, 0, 1)).reshape(-1)
    for box in np.asarray(room.boxes):
        codes[box] = 3 if codes[box] == 2 else 4
    player = int(room.player)
    codes[player] = 6 if codes[player] == 2 else 5
    return codes.reshape(np.shape(room.fixed))


@pytest.mark.parametrize("num_boxes", [1, 2])
def test_hand_made_rewards(num_boxes):
    cases = [c for c in HAND_MADE if (np.isin(padded_codes(c[0]), (3, 4))).sum() == num_boxes]
    rooms = [dynamics.room_from_codes(padded_codes(c[0])) for c in cases]
    batch = jax.tree.map(lambda *xs: jnp.stack(xs), *rooms)
    directions = jnp.asarray([c[1] for c in cases])
    new_rooms, rewards, solved, moved = jax.device_get(jax.jit(jax.vmap(dynamics.step_room))(batch, directions))
    for i, (text, direction, reward, done, did_move) in enumerate(cases):
        gym = GymSokoban(padded_codes(text))
        gym_reward, gym_solved, gym_moved = gym.step(direction)
        assert np.isclose(rewards[i], reward) and np.isclose(gym_reward, reward), text
        assert solved[i] == done == gym_solved and moved[i] == did_move == gym_moved, text
        expected = np.where((gym.room_state == 5) & (gym.room_fixed == 2), 6, gym.room_state)
        assert np.array_equal(np_codes(take(new_rooms, i)), expected), text


def test_state_index_round_trip():
    solver = Solver(8, 8, 2)
    index = jnp.arange(0, solver.num_states, 3)
    player, boxes = jax.jit(jax.vmap(solver.state_from_index))(index)
    assert (np.diff(np.asarray(boxes), axis=1) > 0).all()
    assert np.array_equal(np.asarray(jax.jit(jax.vmap(solver.state_index))(player, boxes)), np.asarray(index))

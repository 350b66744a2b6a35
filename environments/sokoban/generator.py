"""Sokoban level generation in pure JAX from a PRNG key (jittable, vmappable, fixed shapes).

Follows gym-sokoban's recipe (docs/environments.md#sokoban) with the search replaced by fixed-shape loops:
  1. room topology: a random walk of int(1.7 * (H + W)) steps (direction change probability 0.35) that
     stamps one of five 3x3 floor masks per step, then a wall border;
  2. player and boxes on distinct uniform floor cells; the box cells become the targets;
  3. reverse play from this solved state: `reverse_steps` random moves that pull a box when the player
     walks away from it, keeping the visited state with the best gym score
     `box swaps * sum of box-to-own-target Manhattan distances` (0 while a target is covered);
  4. 0-3 random extra player steps (gym-sokoban/RAGEN `add_random_player_movement`).
Reverse play only makes legal moves backwards, so every level is solvable.

`push_distance` k > 0 (static, one box only; our addition for small-scale curricula, as FrozenLake's
`goal_distance`) replaces steps 3-4: the box starts k cells from its target along a uniformly chosen direction
whose k + 1 cells behind the target are floor, with the player right behind the box, so k pushes in that
direction are the optimal solution. `attempts` candidates are
built in parallel; among those with score > 0 (no box on a target, hence not solved) and, when
`min_solution_length` > 1, an optimal solution (BFS solver) at least that long, the best-scoring one is
returned (gym-sokoban also keeps the best score of its search). If none qualifies, a fixed fallback room
is returned (solvable and unsolved, but possibly shorter than asked).

Defaults, measured on a few thousand levels (optimal moves by a plain-Python BFS): 6x6 with 1 box mean
3.8, median 4, fallback 0.2%; 8x8 with 2 boxes mean 10.4, median 10, fallback 0.2%. A re-run of RAGEN's
gym-sokoban generator gives mean 3.9, median 4 for 6x6/1 (search_depth 300) and median 6 for
LargerSokoban 8x8/2 (search_depth 10; 13 with search_depth 100).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from environments.sokoban import dynamics
from environments.sokoban.solver import Solver

# gym-sokoban's five floor stamps, centred on the walker.
FLOOR_MASKS = np.array(
    [
        [[0, 0, 0], [1, 1, 1], [0, 0, 0]],
        [[0, 1, 0], [0, 1, 0], [0, 1, 0]],
        [[0, 0, 0], [1, 1, 0], [0, 1, 0]],
        [[0, 0, 0], [1, 1, 0], [1, 1, 0]],
        [[0, 0, 0], [0, 1, 1], [0, 1, 0]],
    ],
    dtype=bool,
)
P_CHANGE_DIRECTION = 0.35
EXTRA_MOVES = 3
EXTRA_MOVE_CONTINUE = 0.5


def _below(bits16: jax.Array, probability) -> jax.Array:
    """bool: a 16-bit random value falls below `probability` (resolution 2**-16)."""
    return bits16 < jnp.round(jnp.asarray(probability) * 65536).astype(jnp.uint32)


def _scaled(bits16: jax.Array, n: int) -> jax.Array:
    """int32 uniform in [0, n) from a 16-bit random value (bias below n / 2**16)."""
    return ((bits16 * jnp.uint32(n)) >> 16).astype(jnp.int32)


def room_topology(words: jax.Array, height: int, width: int) -> jax.Array:
    """bool[H, W] floor map from gym-sokoban's random walk (border cells are always walls).

    words: uint32[num_steps + 2] random bits: word 0 the start cell, word 1 the first direction, then one
    word per step (bits 0-15 direction change, 16-17 new direction, 18-31 floor mask).
    """
    start = jnp.stack([_scaled(words[0] & 0xFFFF, height - 1), _scaled(words[0] >> 16, width - 1)]) + 1
    direction0 = (words[1] & 3).astype(jnp.int32)
    steps = words[2:]
    change = _below(steps & 0xFFFF, P_CHANGE_DIRECTION)
    new_direction = ((steps >> 16) & 3).astype(jnp.int32)
    mask_index = (((steps >> 18) * jnp.uint32(len(FLOOR_MASKS))) >> 14).astype(jnp.int32)
    rows, cols = jnp.arange(height)[:, None], jnp.arange(width)[None, :]

    def walk(carry, step):
        position, direction, floor = carry
        change_now, direction_now, mask_now = step
        direction = jnp.where(change_now, direction_now, direction)
        position = position + jnp.asarray(dynamics.DIRECTIONS)[direction]
        position = jnp.clip(position, 1, jnp.array([height - 2, width - 2]))
        mask = jnp.asarray(FLOOR_MASKS)[mask_now]
        dr, dc = rows - position[0] + 1, cols - position[1] + 1
        inside = (dr >= 0) & (dr < 3) & (dc >= 0) & (dc < 3)
        floor = floor | (inside & mask[jnp.clip(dr, 0, 2), jnp.clip(dc, 0, 2)])
        return (position, direction, floor), None

    floor0 = jnp.zeros((height, width), bool)
    (_, _, floor), _ = jax.lax.scan(walk, (start, direction0, floor0), (change, new_direction, mask_index))
    border = (rows == 0) | (rows == height - 1) | (cols == 0) | (cols == width - 1)
    return floor & ~border


def place_player_and_boxes(words: jax.Array, floor: jax.Array,
                           num_boxes: int) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Distinct uniform floor cells for the player and the boxes, from words: uint32[H * W] random bits.

    Returns (player int32[], boxes int32[num_boxes] flat cells, enough_floor bool[]): gym-sokoban needs
    more than num_boxes + 1 floor cells.
    """
    scores = jnp.where(floor.reshape(-1), (words >> 2).astype(jnp.int32) + 1, 0)  # floor cells score >= 1
    cells = []
    for _ in range(num_boxes + 1):  # repeated argmax: much cheaper than lax.top_k on CPU for a few picks
        cells.append(jnp.argmax(scores).astype(jnp.int32))
        scores = scores.at[cells[-1]].set(-1)
    enough_floor = jnp.sum(floor) > num_boxes + 1
    return cells[0], jnp.stack(cells[1:]), enough_floor


def manhattan(fixed: jax.Array, a: jax.Array, b: jax.Array) -> jax.Array:
    """Elementwise Manhattan distance int32 between flat cells `a` and `b` of a room shaped like `fixed`."""
    width = fixed.shape[1]
    (row_a, col_a), (row_b, col_b) = dynamics.row_col(a, width), dynamics.row_col(b, width)
    return jnp.abs(row_a - row_b) + jnp.abs(col_a - col_b)


def reverse_play(words: jax.Array, room: dynamics.Room, num_steps: int) -> tuple[dynamics.Room, jax.Array, jax.Array]:
    """Random backwards play from a solved room, `num_steps` directions taken two bits at a time from
    words: uint32[ceil(num_steps / 16)]; the player pulls the box behind it when stepping away.

    Returns (best room, its gym score int32[], its box displacement int32[]). Box i's own target is its
    starting cell.
    """
    flat_fixed = room.fixed.reshape(-1)
    targets = room.boxes

    def score_of(player, boxes, swaps):
        displacement = jnp.sum(manhattan(room.fixed, boxes, targets))
        covered = jnp.any(flat_fixed[boxes] == dynamics.TARGET) | (flat_fixed[player] == dynamics.TARGET)
        return jnp.where(covered, 0, swaps * displacement), displacement

    def pull(carry, direction):
        player, boxes, swaps, last, best = carry
        ahead, ahead_inside = dynamics.neighbour(room.fixed.shape, player, direction)
        behind, _ = dynamics.neighbour(room.fixed.shape, player, direction ^ 1)  # opposite: Up<->Down, Left<->Right
        free = ahead_inside & (flat_fixed[ahead] != dynamics.WALL) & ~jnp.any(boxes == ahead)
        pulled = free & (boxes == behind)
        boxes = jnp.where(pulled, player, boxes)
        pulled_index = jnp.argmax(pulled)
        any_pulled = jnp.any(pulled)
        swaps = swaps + (any_pulled & (pulled_index != last)).astype(jnp.int32)
        last = jnp.where(any_pulled, pulled_index, last)
        player = jnp.where(free, ahead, player)
        score, displacement = score_of(player, boxes, swaps)
        better = score > best[2]
        best = jax.tree.map(lambda new, old: jnp.where(better, new, old), (player, boxes, score, displacement), best)
        return (player, boxes, swaps, last, best), None

    score0, displacement0 = score_of(room.player, room.boxes, jnp.int32(0))
    best0 = (room.player, room.boxes, score0, displacement0)
    carry0 = (room.player, room.boxes, jnp.int32(0), jnp.int32(-1), best0)
    step = jnp.arange(num_steps)
    directions = ((words[step // 16] >> (2 * (step % 16)).astype(jnp.uint32)) & 3).astype(jnp.int32)
    (_, _, _, _, best), _ = jax.lax.scan(pull, carry0, directions)
    player, boxes, score, displacement = best
    return room.replace(player=player, boxes=boxes), score, displacement


def random_player_steps(words: jax.Array, room: dynamics.Room, displacement: jax.Array) -> dynamics.Room:
    """gym-sokoban/RAGEN's extra player walk: with probability 0.8 (displacement 1) or 0.5, up to 3 steps
    to free, not yet visited cells, continuing after each step with probability 0.5.

    words: uint32[1 + 3 * EXTRA_MOVES] random bits: the start test, then per step two words of four 16-bit
    choice values and a continue test.
    """
    flat_fixed = room.fixed.reshape(-1)
    per_step = words[1:].reshape(EXTRA_MOVES, 3)
    choice_bits = jnp.concatenate([per_step[:, :2] & 0xFFFF, per_step[:, :2] >> 16], axis=1)  # [steps, 4]
    draws = (choice_bits.astype(jnp.int32), per_step[:, 2] & 0xFFFF)
    active0 = _below(words[0] & 0xFFFF, jnp.where(displacement == 1, 0.8, 0.5))
    visited0 = jnp.full((EXTRA_MOVES + 1,), room.player).astype(jnp.int32)

    def walk(carry, step):
        player, visited, active = carry
        choice_noise, continue_draw = step
        ahead, inside = jax.vmap(lambda d: dynamics.neighbour(room.fixed.shape, player, d))(jnp.arange(4))
        valid = (
            inside
            & (flat_fixed[ahead] != dynamics.WALL)
            & ~jnp.any(ahead[:, None] == room.boxes[None, :], axis=1)
            & ~jnp.any(ahead[:, None] == visited[None, :], axis=1)
        )
        step = active & jnp.any(valid)
        choice = jnp.argmax(jnp.where(valid, choice_noise, -1))  # uniform among the valid moves
        player = jnp.where(step, ahead[choice], player)
        visited = jnp.concatenate([visited[1:], player[None]])
        active = step & _below(continue_draw, EXTRA_MOVE_CONTINUE)
        return (player, visited, active), None

    (player, _, _), _ = jax.lax.scan(walk, (room.player, visited0, active0), draws)
    return room.replace(player=player)


def push_line(words: jax.Array, room: dynamics.Room, push_distance: int) -> tuple[dynamics.Room, jax.Array]:
    """The solved one-box `room` unpushed by `push_distance` k: a direction drawn from words: uint32[1] (an 8-bit
    draw per direction, the largest wins: uniform up to ties, which go to the lower index) among those whose k + 1
    cells behind the target are floor; the box moves k cells back along it
    and the player stands right behind the box. Returns (room, valid bool[]: some direction had the room)."""
    flat_fixed = room.fixed.reshape(-1)
    target = room.boxes[0]
    height, width = room.fixed.shape
    row, col = dynamics.row_col(target, width)
    back = -jnp.asarray(dynamics.DIRECTIONS)  # [4, 2]: from the target away from the push
    steps = jnp.arange(1, push_distance + 2)  # the box's k cells back, then the player's
    rows, cols = row + back[:, :1] * steps, col + back[:, 1:] * steps  # [4, k + 1]
    inside = (rows >= 0) & (rows < height) & (cols >= 0) & (cols < width)
    cells = jnp.clip(rows, 0, height - 1) * width + jnp.clip(cols, 0, width - 1)
    open_line = jnp.all(inside & (flat_fixed[cells] != dynamics.WALL), axis=1)  # [4]
    noise = (words[0] >> (8 * jnp.arange(4, dtype=jnp.uint32))) & 0xFF
    direction = jnp.argmax(jnp.where(open_line, noise.astype(jnp.int32), -1))  # uniform among the open lines
    room = room.replace(boxes=cells[direction, push_distance - 1][None], player=cells[direction, push_distance])
    return room, jnp.any(open_line)


def fallback_push_room(height: int, width: int, push_distance: int) -> tuple[dynamics.Room, list[int]]:
    """A fixed one-box room solved by `push_distance` pushes Right along row 1: player (1, 1), box (1, 2), target
    (1, 2 + push_distance); and that solution."""
    right = 3
    fixed = np.full((height, width), dynamics.WALL, np.int32)
    fixed[1, 1 : width - 1] = dynamics.FLOOR
    fixed[1, 2 + push_distance] = dynamics.TARGET
    room = dynamics.Room(fixed=jnp.asarray(fixed), boxes=jnp.asarray([width + 2], jnp.int32),
                         player=jnp.asarray(width + 1, jnp.int32))
    return room, [right] * push_distance


def fallback_room(height: int, width: int, num_boxes: int) -> tuple[dynamics.Room, list[int]]:
    """A fixed solvable, unsolved room and an optimal solution (directions 0..3).

    A corridor along row 1 with the player at (1, 1) and, for box i, a dead-end shaft at column
    c_i = 2 + 2i holding the box at (2, c_i) above its target at (3, c_i). Each box takes one push from
    (1, c_i) and the player must step back up between shafts, so the optimum is
    (c_last - 1) walks + num_boxes pushes + (num_boxes - 1) steps back = 4 * num_boxes - 2 moves.
    """
    up, down, right = 0, 1, 3
    fixed = np.full((height, width), dynamics.WALL, np.int32)
    fixed[1, 1 : width - 1] = dynamics.FLOOR
    columns = 2 + 2 * np.arange(num_boxes)
    fixed[2, columns] = dynamics.FLOOR
    fixed[3, columns] = dynamics.TARGET
    room = dynamics.Room(
        fixed=jnp.asarray(fixed),
        boxes=jnp.asarray(2 * width + columns, jnp.int32),
        player=jnp.asarray(width + 1, jnp.int32),
    )
    moves = [right, down]
    for _ in range(num_boxes - 1):
        moves += [up, right, right, down]
    return room, moves


@struct.dataclass
class Level:
    """A generated level.

    room: the `Room`; num_moves: int32[] its optimal number of moves; moves: int32[max_moves] an optimal
    solution (directions 0..3 = Up, Down, Left, Right; -1 padded); accepted: bool[] False when no
    candidate qualified and the fallback room was returned.
    """

    room: dynamics.Room
    num_moves: jax.Array
    moves: jax.Array
    accepted: jax.Array


class Generator:
    """Builds levels of a fixed size and box count from a key.

    Args:
      height, width, num_boxes: room geometry (static).
      attempts: candidate levels built per call (static); default 6 * num_boxes.
      reverse_steps: random reverse moves per candidate (static); default 4 * (H + W) * num_boxes.
      search_capacity: queue capacity of the solver that checks candidates against min_solution_length
        (static); a candidate whose search overflows it is rejected. Bounds that check's memory
        (int32[3 * capacity + states] per attempt) and its worst-case time.
      max_moves: length of `Level.moves` (static).
      push_distance: when > 0 (static; num_boxes 1), every level is that many pushes in a line (module doc).

    `generator(key, min_solution_length) -> (room, accepted)` is what env resets use;
    `generator.level(key, min_solution_length) -> Level` adds the optimal solution.
    """

    def __init__(self, height: int, width: int, num_boxes: int, attempts: int | None = None,
                 reverse_steps: int | None = None, search_capacity: int = 4096, max_moves: int = 100,
                 push_distance: int = 0):
        if push_distance < 0 or (push_distance and (num_boxes != 1 or width < push_distance + 4)):
            raise ValueError(f"Generator: push_distance must be >= 0, and when > 0 needs one box and width >= "
                             f"push_distance + 4 (the fallback row); got push_distance={push_distance}, {num_boxes} "
                             f"boxes, width {width}")
        if height < 5 or width < 2 * num_boxes + 2 or num_boxes < 1:
            raise ValueError(
                f"Generator: need height >= 5, width >= 2 * num_boxes + 2, num_boxes >= 1 (the fallback room); got "
                f"{height}x{width} with {num_boxes} boxes"
            )
        attempts = 6 * num_boxes if attempts is None else attempts
        reverse_steps = 4 * (height + width) * num_boxes if reverse_steps is None else reverse_steps
        if attempts < 1 or reverse_steps < 1:
            raise ValueError(f"Generator: attempts and reverse_steps must be >= 1, got {attempts}, {reverse_steps}")
        self.height, self.width, self.num_boxes = height, width, num_boxes
        self.attempts, self.reverse_steps = attempts, reverse_steps
        self.walk_steps = int(1.7 * (height + width))
        self.solver = Solver(height, width, num_boxes, max_moves=max_moves, queue_capacity=search_capacity)
        self.exact_solver = Solver(height, width, num_boxes, max_moves=max_moves)
        self.push_distance = push_distance
        if push_distance:
            self.fallback, _ = fallback_push_room(height, width, push_distance)
        else:
            self.fallback, _ = fallback_room(height, width, num_boxes)
        self.noise_words = self.walk_steps + 2 + height * width + -(-self.reverse_steps // 16) + 1 + 3 * EXTRA_MOVES

    def candidate(self, words: jax.Array) -> tuple[dynamics.Room, jax.Array]:
        """One candidate level and its gym score int32[] (0 when gym-sokoban would reject it).

        words: uint32[self.noise_words] random bits (one draw per level; random-number kernels dominate
        both the compile and the run time of generation otherwise).
        """
        height, width = self.height, self.width
        sizes = np.cumsum([self.walk_steps + 2, height * width, -(-self.reverse_steps // 16)])
        topology, place, reverse, extra = jnp.split(words, sizes)
        floor = room_topology(topology, height, width)
        player, boxes, enough_floor = place_player_and_boxes(place, floor, self.num_boxes)
        fixed = jnp.where(floor, dynamics.FLOOR, dynamics.WALL).reshape(-1).at[boxes].set(dynamics.TARGET)
        solved_room = dynamics.Room(fixed=fixed.reshape(height, width).astype(jnp.int32), boxes=boxes, player=player)
        if self.push_distance:
            room, valid = push_line(extra, solved_room, self.push_distance)
            return room, (enough_floor & valid).astype(jnp.int32)
        room, score, displacement = reverse_play(reverse, solved_room, self.reverse_steps)
        room = random_player_steps(extra, room, displacement)
        return room, jnp.where(enough_floor, score, 0)

    def __call__(self, key: jax.Array, min_solution_length: jax.Array | int = 1) -> tuple[dynamics.Room, jax.Array]:
        """Generate one room; the same key gives the same room.

        min_solution_length: int32[] (traced), the least optimal number of moves accepted. Candidates are
        only solved when it exceeds 1 (a `lax.cond`: with an unbatched value, e.g. shared env params under
        vmap, the other branch costs nothing); otherwise score > 0 already guarantees >= 1 move.
        Returns (room, accepted bool[]); accepted is False when the fallback room was returned.
        """
        words = jax.random.bits(key, (self.attempts, self.noise_words), jnp.uint32)
        rooms, scores = jax.vmap(self.candidate)(words)
        min_solution_length = jnp.asarray(min_solution_length, jnp.int32)
        long_enough = jax.lax.cond(
            min_solution_length > 1,
            lambda: jax.vmap(self.solver)(rooms)[0] >= min_solution_length,
            lambda: jnp.ones((self.attempts,), bool),
        )
        accepted = (scores > 0) & long_enough
        choice = jnp.argmax(jnp.where(accepted, scores, -1))  # gym-sokoban keeps the best-scoring level
        any_accepted = jnp.any(accepted)
        room = jax.tree.map(lambda batch, fallback: jnp.where(any_accepted, batch[choice], fallback), rooms,
                            self.fallback)
        return room, any_accepted

    def level(self, key: jax.Array, min_solution_length: jax.Array | int = 1) -> Level:
        """`__call__` plus the room's optimal solution (exact solver)."""
        room, accepted = self(key, min_solution_length)
        num_moves, moves = self.exact_solver(room)
        return Level(room=room, num_moves=num_moves, moves=moves, accepted=accepted)

"""Sokoban rules in pure JAX: moves, pushes and gym-sokoban rewards (docs/environments.md#sokoban).

A room is a `Room` pytree with fixed shapes; cells are addressed by their flat index `row * W + col`.
Directions are indexed 0..3 in the order Up, Down, Left, Right (RAGEN's action ids are these plus one).
Every function works on one room; `jax.vmap` batches them.
"""
from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

# Fixed layer (gym-sokoban `room_fixed`).
WALL, FLOOR, TARGET = 0, 1, 2
# RAGEN's cell codes of the rendered grid (docs/environments.md#sokoban).
CODE_WALL, CODE_EMPTY, CODE_TARGET, CODE_BOX_ON_TARGET, CODE_BOX, CODE_PLAYER, CODE_PLAYER_ON_TARGET = range(7)
GRID_SYMBOLS = ("#", "_", "O", "√", "X", "P", "S")
ACTION_WORDS = ("Up", "Down", "Left", "Right")
# (d_row, d_col) of Up, Down, Left, Right.
DIRECTIONS = np.array([[-1, 0], [1, 0], [0, -1], [0, 1]], dtype=np.int32)

STEP_PENALTY = -0.1
BOX_ON_TARGET_REWARD = 1.0
BOX_OFF_TARGET_PENALTY = -1.0
SOLVED_REWARD = 10.0


@struct.dataclass
class Room:
    """One Sokoban room.

    fixed:  int32[H, W], the immovable layer: 0 wall, 1 floor, 2 target.
    boxes:  int32[num_boxes], flat cell index of each box (order carries no meaning).
    player: int32[], flat cell index of the player.
    """

    fixed: jax.Array
    boxes: jax.Array
    player: jax.Array


def row_col(cell: jax.Array, width: int) -> tuple[jax.Array, jax.Array]:
    """(row, col) of non-negative flat cell indices; truncating division is exact for them and compiles to
    far fewer ops than `//` and `%`."""
    cell = jnp.asarray(cell, jnp.int32)
    return jax.lax.div(cell, jnp.int32(width)), jax.lax.rem(cell, jnp.int32(width))


def neighbour(shape: tuple[int, int], cell: jax.Array, direction: jax.Array) -> tuple[jax.Array, jax.Array]:
    """The cell one step from `cell` in `direction` (0..3) on a grid of `shape` (H, W), and whether it
    lies inside the grid.

    Returns (flat index int32 clipped into the grid, inside bool).
    """
    height, width = shape
    delta = jnp.asarray(DIRECTIONS)[direction]
    row, col = row_col(cell, width)
    row, col = row + delta[0], col + delta[1]
    inside = (row >= 0) & (row < height) & (col >= 0) & (col < width)
    return jnp.clip(row, 0, height - 1) * width + jnp.clip(col, 0, width - 1), inside


def push(is_wall: Callable[[jax.Array], jax.Array], shape: tuple[int, int], player: jax.Array, boxes: jax.Array,
         direction: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
    """gym-sokoban's push action: walk one cell, pushing a box ahead if the cell behind it is free.

    `is_wall(cell)` says whether a flat cell of the (H, W) grid `shape` is a wall (the solver looks cells
    up in a whole batch of rooms). Returns (player, boxes, moved bool[]); a move into a wall, or a push
    against a wall or a second box, changes nothing and `moved` is False.
    """
    ahead, ahead_inside = neighbour(shape, player, direction)
    beyond, beyond_inside = neighbour(shape, ahead, direction)
    box_ahead = boxes == ahead  # bool[num_boxes]
    ahead_open = ahead_inside & ~is_wall(ahead)
    beyond_free = beyond_inside & ~is_wall(beyond) & ~jnp.any(boxes == beyond)
    moved = ahead_open & (~jnp.any(box_ahead) | beyond_free)
    boxes = jnp.where(moved & box_ahead, beyond, boxes).astype(jnp.int32)
    return jnp.where(moved, ahead, player).astype(jnp.int32), boxes, moved


def move(room: Room, direction: jax.Array) -> tuple[Room, jax.Array]:
    """`push` on a `Room`: returns (new room, moved bool[])."""
    flat_fixed = room.fixed.reshape(-1)
    player, boxes, moved = push(lambda cell: flat_fixed[cell] == WALL, room.fixed.shape, room.player, room.boxes,
                                direction)
    return room.replace(player=player, boxes=boxes), moved


def boxes_on_target(room: Room) -> jax.Array:
    """int32[]: how many boxes sit on a target."""
    return jnp.sum(room.fixed.reshape(-1)[room.boxes] == TARGET).astype(jnp.int32)


def is_solved(room: Room) -> jax.Array:
    """bool[]: every box sits on a target."""
    return boxes_on_target(room) == room.boxes.shape[0]


def step_room(room: Room, direction: jax.Array) -> tuple[Room, jax.Array, jax.Array, jax.Array]:
    """One gym-sokoban step: move, then reward -0.1, +1 / -1 when a box lands on / leaves a target,
    +10 when all boxes sit on targets.

    Returns (new room, reward float32[], solved bool[], moved bool[]).
    """
    before = boxes_on_target(room)
    new_room, moved = move(room, direction)
    after = boxes_on_target(new_room)
    solved = after == room.boxes.shape[0]
    reward = (
        STEP_PENALTY
        + jnp.where(after > before, BOX_ON_TARGET_REWARD, 0.0)
        + jnp.where(after < before, BOX_OFF_TARGET_PENALTY, 0.0)
        + jnp.where(solved, SOLVED_REWARD, 0.0)
    )
    return new_room, reward.astype(jnp.float32), solved, moved


def room_codes(room: Room) -> jax.Array:
    """int32[H, W] of RAGEN's cell codes: 0 wall, 1 empty, 2 target, 3 box on target, 4 box, 5 player,
    6 player on target."""
    height, width = room.fixed.shape
    flat_fixed = room.fixed.reshape(-1)
    codes = jnp.where(flat_fixed == TARGET, CODE_TARGET, jnp.where(flat_fixed == WALL, CODE_WALL, CODE_EMPTY))
    box_codes = jnp.where(flat_fixed[room.boxes] == TARGET, CODE_BOX_ON_TARGET, CODE_BOX)
    codes = codes.at[room.boxes].set(box_codes)
    player_code = jnp.where(flat_fixed[room.player] == TARGET, CODE_PLAYER_ON_TARGET, CODE_PLAYER)
    codes = codes.at[room.player].set(player_code)
    return codes.reshape(height, width).astype(jnp.int32)


def room_from_codes(codes: np.ndarray) -> Room:
    """Host helper: a `Room` from a RAGEN code grid (int[H, W], values 0..6), e.g. for hand-made rooms."""
    codes = np.asarray(codes)
    fixed = np.where(codes == CODE_WALL, WALL, FLOOR)
    fixed = np.where(np.isin(codes, (CODE_TARGET, CODE_BOX_ON_TARGET, CODE_PLAYER_ON_TARGET)), TARGET, fixed)
    flat = codes.reshape(-1)
    boxes = np.flatnonzero(np.isin(flat, (CODE_BOX, CODE_BOX_ON_TARGET)))
    players = np.flatnonzero(np.isin(flat, (CODE_PLAYER, CODE_PLAYER_ON_TARGET)))
    if players.size != 1:
        raise ValueError(f"room_from_codes: expected exactly one player cell, found {players.size}")
    if (fixed == TARGET).sum() != boxes.size or boxes.size == 0:
        raise ValueError(f"room_from_codes: need one target per box, found {(fixed == TARGET).sum()} targets "
                         f"and {boxes.size} boxes")
    return Room(
        fixed=jnp.asarray(fixed, jnp.int32),
        boxes=jnp.asarray(boxes, jnp.int32),
        player=jnp.asarray(players[0], jnp.int32),
    )


def room_from_text(text: str) -> Room:
    """Host helper: a `Room` from RAGEN's symbol grid, one row per line (`#_O√XPS`)."""
    rows = [line.strip() for line in text.strip().splitlines()]
    lookup = {symbol: code for code, symbol in enumerate(GRID_SYMBOLS)}
    try:
        codes = np.array([[lookup[ch] for ch in row] for row in rows], dtype=np.int32)
    except KeyError as err:
        raise ValueError(f"room_from_text: unknown symbol {err.args[0]!r}; allowed {GRID_SYMBOLS}") from None
    return room_from_codes(codes)

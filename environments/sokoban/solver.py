"""Exact breadth-first Sokoban solver in pure JAX (jittable, vmappable, fixed shapes).

A search state is (player cell, sorted box cells). Rooms have a wall border (the generator guarantees
it), so only the (H-2)*(W-2) interior cells matter; a state is ranked to a dense index
`player * C(I, k) + sum_i C(box_i, i + 1)` (combinatorial number system over the sorted interior box
cells) in [0, I * C(I, k)): 6x6 with 1 box has 256 states, 8x8 with 2 boxes 22,680.

Each search is a FIFO queue of state indices, expanded in chunks inside one `lax.while_loop`: the
successors are deduplicated with a scatter-min of their parent code (`queue position * 4 + direction`)
into a per-state `claim` array, so each new state is enqueued once, by its earliest parent.
The queue therefore stays sorted by depth and the first solved state dequeued is an optimal solution.
Parent codes double as the back pointers of the move sequence.

Batching: a vmapped `lax.while_loop` re-selects its whole carry (here O(states) per room) on every
iteration and runs every room as long as the slowest. The solver therefore defines its own vmap rule
(`jax.custom_batching.custom_vmap`): nested vmaps flatten into one batch, and each loop iteration hands a
pool of `chunk * batch` expansion slots to the searches still running, so the cost follows the total
number of expanded states rather than batch size times the largest search.
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
from jax.custom_batching import custom_vmap

from environments.sokoban import dynamics

_UNVISITED = np.iinfo(np.int32).max


class Solver:
    """Optimal solver for rooms of a fixed size and box count.

    Args:
      height, width: room size (static).
      num_boxes: boxes per room (static).
      max_moves: length of the returned move array (static); longer solutions are still found and
        counted, their move array holds the first `max_moves` moves.
      queue_capacity: most states the search may enqueue (static); None = every state, which makes the
        solver exact for any room. With a smaller capacity a search that overflows reports -1.
      chunk: expansion slots per room and loop iteration (static; speed only, never the result).
    """

    def __init__(self, height: int, width: int, num_boxes: int, max_moves: int = 100,
                 queue_capacity: int | None = None, chunk: int = 8):
        if min(height, width) < 3 or num_boxes < 1:
            raise ValueError(f"Solver: need height, width >= 3 and num_boxes >= 1, got {height}x{width}, {num_boxes}")
        self.height, self.width, self.num_boxes = height, width, num_boxes
        self.max_moves, self.chunk = max_moves, chunk
        self.interior_width = width - 2
        self.num_interior = (height - 2) * (width - 2)
        self.num_box_sets = math.comb(self.num_interior, num_boxes)
        self.num_states = self.num_interior * self.num_box_sets
        if self.num_states >= _UNVISITED // 8:
            raise ValueError(f"Solver: {self.num_states} states ({height}x{width}, {num_boxes} boxes) are too many")
        self.queue_capacity = self.num_states if queue_capacity is None else min(queue_capacity, self.num_states)
        if self.queue_capacity < 1:
            raise ValueError(f"Solver: queue_capacity must be >= 1, got {queue_capacity}")
        # Parent codes stay below 4 * queue_capacity: int16 claims halve the largest array when they fit.
        self.claim_dtype = np.int16 if 4 * self.queue_capacity < np.iinfo(np.int16).max else np.int32
        # binom[n, j] = C(n, j) for the combinatorial ranking of sorted box cells.
        self._binom = np.array(
            [[math.comb(n, j) for j in range(num_boxes + 1)] for n in range(self.num_interior + 1)], dtype=np.int32
        )
        self._solve_batch = custom_vmap(self._solve_batch_impl)
        self._solve_batch.def_vmap(self._vmap_rule)

    def _to_interior(self, cell: jax.Array) -> jax.Array:
        row, col = dynamics.row_col(cell, self.width)
        return (row - 1) * self.interior_width + col - 1

    def _to_flat(self, interior: jax.Array) -> jax.Array:
        row, col = dynamics.row_col(interior, self.interior_width)
        return (row + 1) * self.width + col + 1

    def state_index(self, player: jax.Array, boxes: jax.Array) -> jax.Array:
        """Dense index int32[] of (player flat cell, box flat cells int32[k] sorted ascending)."""
        box_rank = jnp.sum(jnp.asarray(self._binom)[self._to_interior(boxes), jnp.arange(1, self.num_boxes + 1)])
        return self._to_interior(player) * self.num_box_sets + box_rank

    def state_from_index(self, index: jax.Array) -> tuple[jax.Array, jax.Array]:
        """Inverse of `state_index`: (player flat cell int32[], sorted box flat cells int32[k])."""
        player, rank = dynamics.row_col(index, self.num_box_sets)
        binom = jnp.asarray(self._binom)
        boxes = []
        for j in range(self.num_boxes, 0, -1):  # largest box first: the largest c with C(c, j) <= rank
            cell = jnp.sum(binom[1:, j] <= rank).astype(jnp.int32)
            rank = rank - binom[cell, j]
            boxes.append(cell)
        return self._to_flat(player), self._to_flat(jnp.stack(boxes[::-1]))

    def __call__(self, room: dynamics.Room) -> tuple[jax.Array, jax.Array]:
        """Solve one room (vmappable; batches run as one search loop).

        Returns:
          num_moves: int32[], the optimal number of moves; 0 if already solved; -1 if unsolvable (or, with
            a reduced queue_capacity, if the search overflowed).
          moves: int32[max_moves], an optimal move sequence as directions 0..3 (Up, Down, Left, Right;
            RAGEN's action id is direction + 1), padded with -1.
        """
        num_moves, moves = self._solve_batch(jax.tree.map(lambda x: jnp.asarray(x)[None], room))
        return num_moves[0], moves[0]

    def _vmap_rule(self, axis_size, in_batched, rooms):
        (batched,) = in_batched
        rooms = jax.tree.map(
            lambda x, b: x if b else jnp.broadcast_to(x, (axis_size,) + x.shape), rooms, batched
        )
        flat = jax.tree.map(lambda x: x.reshape((-1,) + x.shape[2:]), rooms)
        num_moves, moves = self._solve_batch(flat)
        return (num_moves.reshape(axis_size, -1), moves.reshape(axis_size, -1, self.max_moves)), (True, True)

    def _solve_batch_impl(self, rooms: dynamics.Room) -> tuple[jax.Array, jax.Array]:
        """Solve a batch of rooms (leading axis B) with one loop. Returns (int32[B], int32[B, max_moves])."""
        batch = rooms.boxes.shape[0]
        roots = jax.vmap(lambda r: self.state_index(r.player, jnp.sort(r.boxes)))(rooms)
        claim = jnp.full((batch, self.num_states), np.iinfo(self.claim_dtype).max, self.claim_dtype)
        searches = dict(
            state=jnp.zeros((batch, self.queue_capacity), jnp.int32).at[:, 0].set(roots),
            code=jnp.full((batch, self.queue_capacity), -1, jnp.int32),  # parent position * 4 + direction
            depth=jnp.zeros((batch, self.queue_capacity), jnp.int32),
            claim=claim.at[jnp.arange(batch), roots].set(-1),
            head=jnp.zeros((batch,), jnp.int32), tail=jnp.ones((batch,), jnp.int32),
            goal=jnp.full((batch,), -1, jnp.int32), overflow=jnp.zeros((batch,), bool),
            running=jnp.ones((batch,), bool),
        )
        searches = jax.lax.while_loop(lambda s: jnp.any(s["running"]), lambda s: self._expand(rooms, s), searches)
        return jax.vmap(self._moves)(searches)

    def _expand(self, rooms: dynamics.Room, s: dict) -> dict:
        """One loop iteration over the batch: `chunk * B` expansion slots are handed to the running
        searches in batch order, each taking a prefix of its unexpanded queue. A search stops at the
        first solved state it dequeues; otherwise the new successors are appended to its queue."""
        batch = s["head"].shape[0]
        num_slots = batch * self.chunk
        pending = jnp.where(s["running"], s["tail"] - s["head"], 0)
        taken = jnp.clip(num_slots - (jnp.cumsum(pending) - pending), 0, pending)
        taken_end = jnp.cumsum(taken)
        slot = jnp.arange(num_slots)
        room_of = jnp.minimum(jnp.searchsorted(taken_end, slot, side="right"), batch - 1)
        live = slot < taken_end[-1]
        position = jnp.where(live, s["head"][room_of] + slot - (taken_end - taken)[room_of], 0)
        players, boxes = jax.vmap(self.state_from_index)(s["state"][room_of, position])
        depths = s["depth"][room_of, position]
        flat_fixed = rooms.fixed.reshape(batch, -1)

        solved = live & jnp.all(flat_fixed[room_of[:, None], boxes] == dynamics.TARGET, axis=-1)
        first_solved = jnp.full((batch,), _UNVISITED, jnp.int32)
        first_solved = first_solved.at[room_of].min(jnp.where(solved, position, _UNVISITED))
        found = first_solved < _UNVISITED

        def successor(room, player, box_cells, direction):
            player, box_cells, moved = dynamics.push(
                lambda cell: flat_fixed[room, cell] == dynamics.WALL, (self.height, self.width), player, box_cells,
                direction,
            )
            return self.state_index(player, jnp.sort(box_cells)), moved

        directions = jnp.arange(4)
        next_states, moved = jax.vmap(lambda r, p, b: jax.vmap(lambda d: successor(r, p, b, d))(directions))(
            room_of, players, boxes
        )
        next_states = next_states.reshape(-1)
        codes = (position[:, None] * 4 + directions).reshape(-1)
        room4 = jnp.repeat(room_of, 4)
        active = (live[:, None] & moved).reshape(-1) & ~found[room4]
        index = jnp.where(active, next_states, self.num_states)
        claim = s["claim"].at[room4, index].min(codes.astype(self.claim_dtype), mode="drop")
        # Codes grow with queue position, so a visited state keeps its older, smaller code: a candidate
        # whose code won the min is the first to reach an unvisited state.
        new = active & (claim[room4, jnp.minimum(index, self.num_states - 1)] == codes)
        count = jnp.zeros((batch,), jnp.int32).at[room4].add(new.astype(jnp.int32))
        rank = jnp.cumsum(new) - 1 - (jnp.cumsum(count) - count)[room4]
        destination = s["tail"][room4] + rank
        fits = new & (destination < self.queue_capacity)
        overflow = s["overflow"] | jnp.zeros((batch,), bool).at[room4].max(new & ~fits)
        destination = jnp.where(fits, destination, self.queue_capacity)
        head = s["head"] + taken
        tail = jnp.minimum(s["tail"] + count, self.queue_capacity)
        return dict(
            state=s["state"].at[room4, destination].set(next_states, mode="drop"),
            code=s["code"].at[room4, destination].set(codes, mode="drop"),
            depth=s["depth"].at[room4, destination].set(jnp.repeat(depths, 4) + 1, mode="drop"),
            claim=claim, head=head, tail=tail,
            goal=jnp.where(found, first_solved, s["goal"]), overflow=overflow,
            running=s["running"] & ~found & ~overflow & (head < tail),
        )

    def _moves(self, s: dict) -> tuple[jax.Array, jax.Array]:
        """(num_moves, moves) of a finished search by following parent codes back from the goal."""
        found = (s["goal"] >= 0) & ~s["overflow"]
        num_moves = jnp.where(found, s["depth"][jnp.maximum(s["goal"], 0)], -1)

        def back(walk):
            position, moves = walk
            code = s["code"][position]
            parent, direction = dynamics.row_col(code, 4)
            return parent, moves.at[s["depth"][position] - 1].set(direction, mode="drop")

        moves = jnp.full((self.max_moves,), -1, jnp.int32)
        _, moves = jax.lax.while_loop(lambda w: w[0] > 0, back, (jnp.where(found, s["goal"], 0), moves))
        return num_moves.astype(jnp.int32), moves

"""FrozenLake, RAGEN's CoordFrozenLake (docs/environments.md#frozenlake), generated and stepped in JAX.

Map: `size` x `size` (static, default 4); every tile is frozen with probability `p_frozen` (0.9), else
a hole; start and goal are uniformly random distinct tiles (forced frozen). `goal_distance` d > 0 (static, our
addition for small-scale curricula; 0 = RAGEN's anywhere) draws the goal uniformly among the tiles 1..d moves
(Manhattan distance) from the start. Like RAGEN we reject maps
without a start->goal path, but with a fixed number `map_tries` of candidates drawn at once from the
reset key and checked by flood fill; the first connected one is used. If none is (probability about
0.15**16 at the defaults), the first candidate gets the holes on an L-shaped start->goal path removed,
so a path ALWAYS exists.

Dynamics (gymnasium FrozenLake with RAGEN's `success_rate` s): the intended move happens with
probability s, otherwise one of the two perpendicular moves with (1 - s)/2 each; moves into the
border stay put. Reward 1 on reaching the goal; a hole or the goal ends the episode.
Actions Left/Down/Right/Up are 0..3 (gym order). `success_rate` and `p_frozen` are traced params.

Observation = RAGEN's `grid_coord` render: "Coordinates: \\n", the coordinate lines (Board size, Start,
Goal, Player | Player on goal | Player in hole, Holes) and "\\nGrid Map: \\n" with the symbol rows
(`P` player, `_` frozen and start, `O` hole, `G` goal, `X` player in hole, `√` player on goal).
"""
from __future__ import annotations

from collections import deque

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from environments import axis_words, registry
from environments.base import TextEnv
from environments.faithfulness import cell_fact
from environments.pieces import PieceTable

ACTIONS = ("Left", "Down", "Right", "Up")
MOVES = np.array([(0, -1), (1, 0), (0, 1), (-1, 0)], np.int32)  # (d_row, d_col) per action
SYMBOLS = {"player": "P", "frozen": "_", "hole": "O", "goal": "G", "player_in_hole": "X", "player_on_goal": "√"}
PLAYER_LABELS = ("\nPlayer: ", "\nPlayer on goal: ", "\nPlayer in hole: ")
INSTRUCTION = (
    "You are walking on a frozen lake. Reach the goal without falling into a hole. The observation gives "
    "the zero-indexed (row, col) coordinates of the start, the goal, the player and the holes, followed by a "
    "symbol grid. The ice is slippery, so you may slide to a tile you did not intend. "
    "Answer with a sequence of moves such as <answer>Left || Up || Up</answer>."
)


@struct.dataclass
class FrozenLakeParams:
    """success_rate f32[]: probability the intended move happens; p_frozen f32[]: frozen-tile probability."""

    success_rate: jnp.ndarray = 1.0
    p_frozen: jnp.ndarray = 0.9


@struct.dataclass
class FrozenLakeState:
    """holes bool[size*size] (row-major); start, goal, pos i32[] flat tile indices."""

    holes: jnp.ndarray
    start: jnp.ndarray
    goal: jnp.ndarray
    pos: jnp.ndarray


def _coord(i: int, size: int) -> str:
    return f"({i // size}, {i % size})"


class FrozenLake(TextEnv):
    """See the module docstring. Static args: `size`, `map_tries`, `goal_distance`; the rest go to `TextEnv`."""

    Params = FrozenLakeParams
    default_params = FrozenLakeParams(success_rate=jnp.float32(1.0), p_frozen=jnp.float32(0.9))

    def __init__(self, tokenizer, *, size: int = 4, map_tries: int = 16, goal_distance: int = 0, **base_kwargs):
        if size < 2 or map_tries < 1 or goal_distance < 0:
            raise ValueError(f"FrozenLake needs size >= 2, map_tries >= 1 and goal_distance >= 0, got size={size}, "
                             f"map_tries={map_tries}, goal_distance={goal_distance}")
        self.size, self.map_tries, self.goal_distance = size, map_tries, goal_distance
        n = size * size
        coords = [_coord(i, size) for i in range(n)]
        header = f"Coordinates: \nBoard size: {size} rows x {size} cols (zero-indexed).\nStart: "
        fixed = [header, "\nGoal: ", *PLAYER_LABELS, "\nHoles: ", "\nGrid Map: \n", "\n"]
        pieces = PieceTable(tokenizer, fixed + coords + [", " + c for c in coords] + list(SYMBOLS.values()))
        self._header = pieces.index(header)
        self._goal_label = pieces.index("\nGoal: ")
        self._player_labels = pieces.indices(list(PLAYER_LABELS))
        self._holes_label = pieces.index("\nHoles: ")
        self._grid_label = pieces.index("\nGrid Map: \n")
        self._newline = pieces.index("\n")
        self._coord = pieces.indices(coords)
        self._next_coord = pieces.indices([", " + c for c in coords])
        self._symbol = pieces.indices(list(SYMBOLS.values()))  # SYMBOLS order: P _ O G X √
        capacity = sum(pieces.token_len(t) for t in (header, "\nGoal: ", "\nHoles: ", "\nGrid Map: \n"))
        capacity += pieces.max_len(list(PLAYER_LABELS)) + 3 * pieces.max_len(coords)
        capacity += n * max(pieces.max_len(coords), pieces.max_len([", " + c for c in coords]))
        capacity += n * pieces.max_len(list(SYMBOLS.values())) + (size - 1) * pieces.token_len("\n")
        super().__init__(tokenizer, pieces=pieces, action_words=ACTIONS, obs_capacity=capacity,
                         instruction=INSTRUCTION, **base_kwargs)

    # ----------------------------------------------------------------- generation
    def _neighbours(self, mask: jnp.ndarray) -> jnp.ndarray:
        """bool[n]: tiles 4-adjacent to a tile of `mask` bool[n]."""
        g = mask.reshape(self.size, self.size)
        f = jnp.zeros_like(g)
        out = f.at[1:].set(g[:-1]) | f.at[:-1].set(g[1:]) | f.at[:, 1:].set(g[:, :-1]) | f.at[:, :-1].set(g[:, 1:])
        return out.reshape(-1)

    def reachable(self, holes: jnp.ndarray, start: jnp.ndarray) -> jnp.ndarray:
        """bool[n]: tiles reachable from `start` without entering a hole (flood fill, n steps)."""
        n = self.size * self.size
        seed = jnp.arange(n) == start
        return jax.lax.fori_loop(0, n, lambda _, r: r | (self._neighbours(r) & ~holes), seed)

    def init_state(self, key, params):
        n, t = self.size * self.size, self.map_tries
        u = jax.random.uniform(key, (t, n + 2))  # one draw: hole tests, start, goal offset
        holes = u[:, :n] >= params.p_frozen
        start = jnp.minimum((u[:, n] * n).astype(jnp.int32), n - 1)
        tiles = jnp.arange(n)
        goal = self._goal(start, u[:, n + 1])
        holes &= (tiles != start[:, None]) & (tiles != goal[:, None])
        connected = jax.vmap(lambda h, s, g: self.reachable(h, s)[g])(holes, start, goal)
        pick = jnp.argmax(connected)
        # fallback when no candidate is connected: clear an L path (start column, then goal row)
        (sr, sc), (gr, gc) = jnp.divmod(start[0], self.size), jnp.divmod(goal[0], self.size)
        r, c = jnp.divmod(tiles, self.size)
        on_path = ((c == sc) & (r >= jnp.minimum(sr, gr)) & (r <= jnp.maximum(sr, gr))) | (
            (r == gr) & (c >= jnp.minimum(sc, gc)) & (c <= jnp.maximum(sc, gc))
        )
        chosen = jnp.where(connected.any(), holes[pick], holes[0] & ~on_path)
        return FrozenLakeState(holes=chosen, start=start[pick], goal=goal[pick], pos=start[pick])

    def _goal(self, start: jnp.ndarray, u: jnp.ndarray) -> jnp.ndarray:
        """i32[t]: the goal tile of each candidate (start i32[t], u f32[t] uniform), != start and within
        `goal_distance` moves of it when that is > 0."""
        n = self.size * self.size
        if not self.goal_distance:
            offset = 1 + jnp.minimum((u * (n - 1)).astype(jnp.int32), n - 2)
            return (start + offset) % n
        (sr, sc), (r, c) = jnp.divmod(start[:, None], self.size), jnp.divmod(jnp.arange(n), self.size)
        distance = jnp.abs(r - sr) + jnp.abs(c - sc)
        eligible = (distance >= 1) & (distance <= self.goal_distance)  # [t, n]
        count = eligible.sum(axis=1)
        k = jnp.minimum((u * count).astype(jnp.int32), count - 1)
        return jnp.argmax(jnp.cumsum(eligible, axis=1) > k[:, None], axis=1).astype(start.dtype)

    # ----------------------------------------------------------------- dynamics
    def apply_action(self, key, s, action, params):
        u = jax.random.uniform(key)
        slip = (1.0 - params.success_rate) / 2.0
        direction = jnp.where(u < params.success_rate, action,
                              jnp.where(u < params.success_rate + slip, (action - 1) % 4, (action + 1) % 4))
        row, col = jnp.divmod(s.pos, self.size)
        move = jnp.asarray(MOVES)[direction]
        row = jnp.clip(row + move[0], 0, self.size - 1)
        col = jnp.clip(col + move[1], 0, self.size - 1)
        pos = row * self.size + col
        at_goal = pos == s.goal
        terminated = at_goal | s.holes[pos]
        return s.replace(pos=pos), jnp.where(at_goal, 1.0, 0.0), terminated, pos != s.pos

    def success(self, s):
        return s.pos == s.goal

    # ----------------------------------------------------------------- rendering
    def observation_pieces(self, s):
        n = self.size * self.size
        tiles = jnp.arange(n)
        coord, next_coord = jnp.asarray(self._coord), jnp.asarray(self._next_coord)
        player_kind = jnp.where(s.pos == s.goal, 1, jnp.where(s.holes[s.pos], 2, 0))
        first_hole = jnp.argmax(s.holes)
        hole_pieces = jnp.where(s.holes, jnp.where(tiles == first_hole, coord, next_coord), 0)
        # grid symbols (P _ O G X √ order): the player's tile shows its player variant
        kind = jnp.where(s.holes, 2, jnp.where(tiles == s.goal, 3, 1))
        kind = jnp.where(tiles == s.pos, jnp.array([0, 5, 4])[player_kind], kind)
        symbols = jnp.asarray(self._symbol)[kind].reshape(self.size, self.size)
        newlines = jnp.full((self.size, 1), self._newline).at[-1].set(0)
        grid = jnp.concatenate([symbols, newlines], axis=1).reshape(-1)
        head = jnp.stack([
            jnp.int32(self._header), coord[s.start], jnp.int32(self._goal_label), coord[s.goal],
            jnp.asarray(self._player_labels)[player_kind], coord[s.pos],
            jnp.where(s.holes.any(), self._holes_label, 0),
        ])
        return jnp.concatenate([head, hole_pieces, jnp.array([self._grid_label]), grid]).astype(jnp.int32)

    # ----------------------------------------------------------------- oracle
    def shortest_path(self, s) -> list[int] | None:
        """Host BFS: the action indices of a shortest hole-free path from `s.pos` to the goal, or None."""
        size, holes = self.size, np.asarray(s.holes).reshape(-1)
        start, goal = int(s.pos), int(s.goal)
        previous = {start: None}
        queue = deque([start])
        while queue:
            cur = queue.popleft()
            if cur == goal:
                break
            r, c = divmod(cur, size)
            for a, (dr, dc) in enumerate(MOVES):
                nr, nc = r + dr, c + dc
                nxt = nr * size + nc
                if 0 <= nr < size and 0 <= nc < size and nxt not in previous and (not holes[nxt] or nxt == goal):
                    previous[nxt] = (cur, a)
                    queue.append(nxt)
        if goal not in previous:
            return None
        path, cur = [], goal
        while previous[cur] is not None:
            cur, a = previous[cur]
            path.append(a)
        return path[::-1]

    def oracle_answer(self, s, rng, max_actions):
        pos, goal = int(s.pos), int(s.goal)
        if pos == goal or bool(np.asarray(s.holes)[pos]):
            raise ValueError(f"FrozenLake oracle called on a finished episode (player {_coord(pos, self.size)})")
        path = self.shortest_path(s)
        if path is None:
            raise ValueError(f"FrozenLake map has no path from {_coord(pos, self.size)} to {_coord(goal, self.size)}")
        moves = [ACTIONS[a] for a in path[:max_actions]]
        p, g = _coord(pos, self.size), _coord(goal, self.size)
        n_holes = int(np.asarray(s.holes).sum())
        templates = (
            f"I am at {p} and the goal is at {g}. The shortest safe path takes {len(path)} moves, so I go "
            f"{', then '.join(m.lower() for m in moves)}.",
            f"The player stands on {p}; the goal is {g}. Avoiding the {n_holes} hole(s), the next moves are "
            f"{' and '.join(moves)}.",
            f"Goal at {g}, me at {p}. {len(path)} steps remain on a hole-free route; first: {moves[0]}.",
            f"From {p} I need to reach {g} without stepping into a hole. I will move {' then '.join(moves)}.",
        )
        return templates[int(rng.integers(len(templates)))], " || ".join(moves)

    def describe(self, s, rng):
        (pr, pc), (gr, gc) = divmod(int(s.pos), self.size), divmod(int(s.goal), self.size)
        n_holes = int(np.asarray(s.holes).sum())
        # the observation's own labels (copying "Player: (r, c)" is plain induction for a small model), then the goal's
        # side of the player on each axis; the answer stays the model's own choice
        templates = (f"Player: ({pr}, {pc}). Goal: ({gr}, {gc})",
                     f"Goal: ({gr}, {gc}). Player: ({pr}, {pc}). Holes: {n_holes}")
        return f"{templates[int(rng.integers(len(templates)))]}; {axis_words.tail((pr, pc), (gr, gc))}"

    def facts(self, s):
        player, goal = divmod(int(s.pos), self.size), divmod(int(s.goal), self.size)
        return cell_fact("Player", player), cell_fact("Goal", goal), *axis_words.tail_facts(player, goal)

registry.register("frozen_lake", FrozenLake)

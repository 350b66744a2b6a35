"""Sokoban, RAGEN's CoordSokoban (docs/environments.md#sokoban), as a `TextEnv`: generated, stepped, rendered and parsed
in JAX.

Levels come from `generator.Generator` (every level solvable and unsolved; `min_solution_length` is a
traced param). Actions are the words "Up", "Down", "Left", "Right" (indices 0..3, RAGEN's ids 1..4),
executed with gym-sokoban's rules and rewards (`dynamics.step_room`): -0.1 per step, +1 / -1 for a box
pushed onto / off a target, +10 when solved. An episode terminates when solved or after `max_steps`
(gym-sokoban's 100) env steps. info: success = all boxes on targets, action_is_effective = the player moved.

Observation = RAGEN's `grid_coord` text (walls and empty categories omitted):

    Coordinates: \\nBoard size: 6 rows x 6 cols (zero-indexed).\\nTargets: (r, c)\\nBoxes: (r, c)...
    \\nBoxes on target: ...\\nPlayer: (r, c)  or  \\nPlayer on target: (r, c)\\nGrid Map: \\n#####...

`env.solve(state)` runs the exact BFS solver in-graph; `env.oracle` answers with its first moves.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from environments import axis_words, registry
from environments.base import TextEnv, TurnState
from environments.faithfulness import Fact, cell_fact
from environments.pieces import PieceTable
from environments.sokoban import dynamics
from environments.sokoban.generator import Generator
from environments.sokoban.solver import Solver

BOX_LABELS = ("\nTargets: ", "\nBoxes: ", "\nBoxes on target: ")
PLAYER_LABELS = ("\nPlayer: ", "\nPlayer on target: ")
GRID_LABEL = "\nGrid Map: \n"
INSTRUCTION = (
    "You are solving the Sokoban puzzle. You are the player and you need to push all boxes to targets.\n"
    "You are provided with a symbol grid and the zero-indexed coordinates of the player, each box, and each "
    "target. \nCoordinates range from the top-left corner (0, 0) to the bottom-right corner ({last_row}, {last_col}). "
    "\nWhen you are exactly next to a box, you can push it by moving in the same direction. \n"
    "You cannot push a box through a wall, and you cannot pull a box.\n"
    "The answer should be a sequence of actions, like <answer>Right || Right || Up</answer>.\n"
)  # RAGEN's CoordSokoban env_instruction, with the board's corner filled in


@struct.dataclass
class SokobanParams:
    """min_solution_length i32[]: fewest optimal moves a generated level may need (at least 1);
    max_steps i32[]: env steps after which the episode ends (gym-sokoban's max_steps)."""

    min_solution_length: jnp.ndarray = 1
    max_steps: jnp.ndarray = 100


@struct.dataclass
class SokobanState:
    """room: the `dynamics.Room`; num_env_steps i32[]: actions executed so far."""

    room: dynamics.Room
    num_env_steps: jnp.ndarray


def _coord(cell: int, width: int) -> str:
    return f"({cell // width}, {cell % width})"


def _join(items: list[str]) -> str:
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


class Sokoban(TextEnv):
    """See the module docstring.

    Static args: `height`, `width`, `num_boxes` (room geometry), `attempts`, `reverse_steps`,
    `search_capacity`, `push_distance` (generator, see `Generator`), `max_moves` (length of `solve`'s move array);
    the rest go to `TextEnv`.
    """

    Params = SokobanParams
    default_params = SokobanParams(min_solution_length=jnp.int32(1), max_steps=jnp.int32(100))

    def __init__(self, tokenizer, *, height: int = 6, width: int = 6, num_boxes: int = 1, attempts: int | None = None,
                 reverse_steps: int | None = None, search_capacity: int = 4096, max_moves: int = 100,
                 push_distance: int = 0, **base_kwargs):
        self.height, self.width, self.num_boxes = height, width, num_boxes
        self.generator = Generator(height, width, num_boxes, attempts=attempts, reverse_steps=reverse_steps,
                                   search_capacity=search_capacity, max_moves=max_moves, push_distance=push_distance)
        self.solver = Solver(height, width, num_boxes, max_moves=max_moves)
        self.solve_batch = jax.jit(jax.vmap(self.solve))
        cells = height * width
        coords = [_coord(i, width) for i in range(cells)]
        next_coords = [", " + c for c in coords]
        header = f"Coordinates: \nBoard size: {height} rows x {width} cols (zero-indexed)."
        pieces = PieceTable(
            tokenizer,
            [header, *BOX_LABELS, *PLAYER_LABELS, GRID_LABEL, "\n", *coords, *next_coords, *dynamics.GRID_SYMBOLS],
        )
        self._header = pieces.index(header)
        self._box_labels = pieces.indices(list(BOX_LABELS))
        self._player_labels = pieces.indices(list(PLAYER_LABELS))
        self._grid_label = pieces.index(GRID_LABEL)
        self._newline = pieces.index("\n")
        self._coord = pieces.indices(coords)
        self._next_coord = pieces.indices(next_coords)
        self._symbol = pieces.indices(list(dynamics.GRID_SYMBOLS))
        # at most 2 * num_boxes listed box/target cells plus the player
        capacity = pieces.token_len(header) + sum(pieces.token_len(t) for t in BOX_LABELS)
        capacity += pieces.max_len(list(PLAYER_LABELS)) + pieces.token_len(GRID_LABEL)
        capacity += (2 * num_boxes + 1) * pieces.max_len(coords + next_coords)
        capacity += cells * pieces.max_len(list(dynamics.GRID_SYMBOLS)) + (height - 1) * pieces.token_len("\n")
        instruction = INSTRUCTION.format(last_row=height - 1, last_col=width - 1)
        super().__init__(tokenizer, pieces=pieces, action_words=dynamics.ACTION_WORDS, obs_capacity=capacity,
                         instruction=instruction, **base_kwargs)

    # ----------------------------------------------------------------- hooks
    def init_state(self, key, params):
        room, _ = self.generator(key, params.min_solution_length)
        return SokobanState(room=room, num_env_steps=jnp.int32(0))

    def apply_action(self, key, s, action, params):
        room, reward, solved, moved = dynamics.step_room(s.room, action)
        steps = s.num_env_steps + 1
        return SokobanState(room=room, num_env_steps=steps), reward, solved | (steps >= params.max_steps), moved

    def success(self, s):
        return dynamics.is_solved(s.room)

    def observation_pieces(self, s):
        """Piece ids of the grid_coord text: 3 * (1 + num_boxes) + 4 coordinate slots and H * (W + 1) grid slots.
        Rooms have one target per box (gym-sokoban's invariant), so each listing has at most num_boxes cells."""
        k = self.num_boxes
        codes = dynamics.room_codes(s.room).reshape(-1)
        coord, next_coord = jnp.asarray(self._coord), jnp.asarray(self._next_coord)

        def listing(label, cells, shown):
            """Label and comma-separated coordinates of `cells` i32[k] (row-major order) where `shown`."""
            first = jnp.argmax(shown)
            items = jnp.where(shown, jnp.where(jnp.arange(k) == first, coord[cells], next_coord[cells]), 0)
            return jnp.concatenate([jnp.where(jnp.any(shown), label, 0)[None], items])

        targets = jnp.nonzero(s.room.fixed.reshape(-1) == dynamics.TARGET, size=k, fill_value=0)[0]
        boxes = jnp.sort(s.room.boxes)
        box_on_target = codes[boxes] == dynamics.CODE_BOX_ON_TARGET
        on_target = codes[s.room.player] == dynamics.CODE_PLAYER_ON_TARGET
        symbols = jnp.asarray(self._symbol)[codes].reshape(self.height, self.width)
        newlines = jnp.full((self.height, 1), self._newline).at[-1].set(0)
        return jnp.concatenate([
            jnp.array([self._header]),
            listing(self._box_labels[0], targets, jnp.ones((k,), bool)),
            listing(self._box_labels[1], boxes, ~box_on_target),
            listing(self._box_labels[2], boxes, box_on_target),
            jnp.stack([jnp.asarray(self._player_labels)[on_target.astype(jnp.int32)], coord[s.room.player]]),
            jnp.array([self._grid_label]),
            jnp.concatenate([symbols, newlines], axis=1).reshape(-1),
        ]).astype(jnp.int32)

    # ----------------------------------------------------------------- solver and oracle
    def solve(self, state: TurnState) -> tuple[jax.Array, jax.Array]:
        """Exact in-graph BFS on the state's room (jittable, vmappable).

        Returns (num_moves int32[]: optimal number of moves, 0 if solved, -1 if unsolvable;
        moves int32[max_moves]: action indices 0..3 = Up, Down, Left, Right, padded with -1).
        `env.solve_batch` is its jitted vmap over a leading batch axis (one search loop for the batch).
        """
        return self.solver(state.env.room)

    def oracle_answer(self, s, rng, max_actions):
        batch = jax.tree.map(lambda x: jnp.asarray(x)[None], s)
        num_moves, moves = jax.device_get(self.solve_batch(TurnState(env=batch, actions_left=None, done=None)))
        return self._oracle_text(s, int(num_moves[0]), moves[0], rng, max_actions)

    def oracles(self, states: TurnState, rng: np.random.Generator, max_actions: int | None = None):
        """`oracle` for each state of a batch (leading axis), with one solver call for the whole batch;
        None where the episode is done."""
        return self._batch_oracles(states, rng, max_actions, skip_unsolvable=False)

    def oracle_answers(self, states: TurnState, rng: np.random.Generator, max_actions: int | None = None):
        """The oracle's answer per state (one solver call), None where done, solved or unsolvable."""
        return [None if o is None else o[1] for o in self._batch_oracles(states, rng, max_actions, True)]

    def _batch_oracles(self, states, rng, max_actions, skip_unsolvable: bool):
        num_moves, moves = jax.device_get(self.solve_batch(states))
        m = self._max_actions(max_actions)
        return [None if s is None or (skip_unsolvable and num_moves[i] <= 0)
                else self._oracle_text(s, int(num_moves[i]), moves[i], rng, m)
                for i, s in enumerate(self._host_rows(states))]

    def _oracle_text(self, s, num_moves, moves, rng, max_actions):
        """(reasoning, answer) from the solver's optimal moves for host state `s`."""
        player = _coord(int(s.room.player), self.width)
        if num_moves == 0:
            raise ValueError(f"Sokoban oracle called on a solved room (player at {player})")
        if num_moves < 0:
            raise ValueError(f"Sokoban room is unsolvable (player at {player}): a box is stuck")
        words = [dynamics.ACTION_WORDS[m] for m in moves[: min(max_actions, num_moves)]]
        fixed = np.asarray(s.room.fixed).reshape(-1)
        boxes = [int(b) for b in np.sort(np.asarray(s.room.boxes))]
        open_boxes = [_coord(b, self.width) for b in boxes if fixed[b] != dynamics.TARGET]
        free_targets = [_coord(t, self.width) for t in np.flatnonzero(fixed == dynamics.TARGET) if t not in boxes]
        box_word = "box" if len(open_boxes) == 1 else "boxes"
        target_word = "target" if len(free_targets) == 1 else "targets"
        b, t, n = _join(open_boxes), _join(free_targets), num_moves
        templates = (
            f"The player is at {player}. The {box_word} at {b} must reach the {target_word} at {t}. The shortest "
            f"solution takes {n} moves, so I start with {', then '.join(w.lower() for w in words)}.",
            f"I stand at {player}; {box_word} {b}; free {target_word} {t}. I can only push, never pull, so I "
            f"move {' then '.join(words)}.",
            f"Player {player}, {box_word} at {b}, {target_word} at {t}. {n} moves solve the puzzle; the next "
            f"ones are {' and '.join(words)}.",
            f"To push the {box_word} at {b} onto {t} from {player} without getting stuck against a wall, I go "
            f"{', '.join(words)}.",
        )
        return templates[int(rng.integers(len(templates)))], " || ".join(words)


    def describe(self, s, rng):
        player = _coord(int(s.room.player), self.width)
        fixed = np.asarray(s.room.fixed).reshape(-1)
        boxes = [int(b) for b in np.sort(np.asarray(s.room.boxes))]
        open_boxes = [_coord(b, self.width) for b in boxes if fixed[b] != dynamics.TARGET] or ["none"]
        free_targets = [_coord(t, self.width) for t in np.flatnonzero(fixed == dynamics.TARGET) if t not in boxes]
        # the observation's own labels, then on which side of the player the first open box lies on each axis, as
        # FrozenLake's description does for its goal (the reasoning a from-scratch model can learn to act on)
        templates = (f"Player: {player}. Boxes: {_join(open_boxes)}. Targets: {_join(free_targets or ['none'])}",
                     f"Boxes: {_join(open_boxes)}. Player: {player}")
        pr, pc = divmod(int(s.room.player), self.width)
        first_open = [b for b in boxes if fixed[b] != dynamics.TARGET]
        br, bc = divmod(first_open[0], self.width) if first_open else (pr, pc)
        return f"{templates[int(rng.integers(len(templates)))]}; {axis_words.tail((pr, pc), (br, bc))}"

    def facts(self, s):
        player = divmod(int(s.room.player), self.width)
        fixed = np.asarray(s.room.fixed).reshape(-1)
        first_open = [int(b) for b in np.sort(np.asarray(s.room.boxes)) if fixed[b] != dynamics.TARGET][:1]
        box = divmod(first_open[0], self.width) if first_open else player
        # the description lists the open boxes after "Boxes: ", the first of them (the tail's cell) first
        boxes = cell_fact("Boxes", box) if first_open else Fact("boxes", r"Boxes: (none)", ("none",))
        return cell_fact("Player", player), boxes, *axis_words.tail_facts(player, box)


registry.register("sokoban", Sokoban)
registry.register("larger_sokoban", Sokoban, height=8, width=8, num_boxes=2)

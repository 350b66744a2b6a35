"""The Python peers' side of the env benchmarks: RAGEN's host-side parse and the gymnasium / gym-sokoban text renders.

Shared by benchmarks/envs.py (env step and reset throughput) and benchmarks/rollout_e2e.py (whole rollouts). The
renders give the same text as our envs' `render_text` of the same state (rollout_e2e checks this on every level it
plays); the parse is what RAGEN does per env and turn (docs/prompts_and_parsing.md#response-parsing). Not a benchmark
(the leading underscore keeps `run_all` from running it).
"""
from __future__ import annotations

import re

import numpy as np

_PATTERN = re.compile(r"<think>(.*?)</think>\s*<answer>(.*?)</answer>", re.DOTALL)
_SPECIAL = re.compile(r"<think>|</think>|<answer>|</answer>|<\|im_start\|>|<\|im_end\|>")
_SOKOBAN_SYMBOLS = {0: "#", 1: "_", 2: "O", 3: "√", 4: "X", 5: "P", 6: "S"}


def ragen_parse(tokenizer, ids, lookup: dict[str, int], max_actions: int = 2) -> list[int]:
    """What RAGEN does per env and turn on the host (docs/prompts_and_parsing.md): decode, regex, split, map names.

    ids: the response's token ids (prefill included); lookup: lower-case action word -> the peer env's action.
    """
    match = _PATTERN.search(tokenizer.decode(ids))
    if match is None:
        return []
    parts = [a.strip() for a in _SPECIAL.sub("", match.group(2)).split("||") if a.strip()][:max_actions]
    return [lookup[a.lower()] for a in parts if a.lower() in lookup]


def frozen_lake_text(desc: np.ndarray, pos: int) -> str:
    """RAGEN-style coordinates + grid text of a gymnasium FrozenLake map (desc: bytes[size, size]; pos: flat tile)."""
    size = desc.shape[0]
    xy = lambda i: f"({i // size}, {i % size})"
    flat = desc.reshape(-1)
    lines = [f"Board size: {size} rows x {size} cols (zero-indexed).",
             f"Start: {xy(int(np.flatnonzero(flat == b'S')[0]))}", f"Goal: {xy(int(np.flatnonzero(flat == b'G')[0]))}"]
    tile = flat[pos]
    label = "Player on goal" if tile == b"G" else "Player in hole" if tile == b"H" else "Player"
    lines.append(f"{label}: {xy(pos)}")
    holes = np.flatnonzero(flat == b"H")
    if holes.size:
        lines.append("Holes: " + ", ".join(xy(int(i)) for i in holes))
    symbols = {b"S": "_", b"F": "_", b"H": "O", b"G": "G"}
    grid = [[symbols[t] for t in row] for row in desc]
    r, c = divmod(pos, size)
    grid[r][c] = "√" if tile == b"G" else "X" if tile == b"H" else "P"
    return "Coordinates: \n" + "\n".join(lines) + "\nGrid Map: \n" + "\n".join("".join(row) for row in grid)


def sokoban_text(room_state: np.ndarray, room_fixed: np.ndarray) -> str:
    """RAGEN-style coordinates + grid text of a gym-sokoban room (room_state, room_fixed: i[H, W] in its codes).

    Targets lists every target cell (also those under a box or the player), as our render does."""
    state = room_state.copy()
    state[(state == 5) & (room_fixed == 2)] = 6  # player on target
    xy = lambda cells: ", ".join(f"({int(r)}, {int(c)})" for r, c in cells)
    lines = [f"Board size: {state.shape[0]} rows x {state.shape[1]} cols (zero-indexed)."]
    for label, cells in (("Targets", room_fixed == 2), ("Boxes", state == 4), ("Boxes on target", state == 3),
                         ("Player", state == 5), ("Player on target", state == 6)):
        if cells.any():
            lines.append(f"{label}: {xy(np.argwhere(cells))}")
    grid = "\n".join("".join(_SOKOBAN_SYMBOLS[int(v)] for v in row) for row in state)
    return "Coordinates: \n" + "\n".join(lines) + "\nGrid Map: \n" + grid


def sokoban_step(env, action: int) -> tuple[float, bool]:
    """gym-sokoban's `step` without its mandatory image render (the faster peer): (reward, done) of one push action
    (1..4 = up, down, left, right) on a `SokobanEnv`."""
    env.num_env_steps += 1
    env._push(action)
    env._calc_reward()
    return env.reward_last, env._check_if_done()

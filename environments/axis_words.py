"""The per-axis tail of the grid envs' observation descriptions (`TextEnv.describe`): on which side of the player a
cell lies on each axis, "rows 1 to 2: down, cols 3 to 3: same." A from-scratch d64 x 2 model learns to compare two
adjacent numbers; one move from four far-apart coordinates it barely learns (experiments/results/README.md)."""
from __future__ import annotations

import numpy as np

from environments.faithfulness import Fact

ROW_WORDS = {-1: "up", 0: "same", 1: "down"}  # the side of the player the cell lies on, rows
COL_WORDS = {-1: "left", 0: "same", 1: "right"}


def words(start: tuple[int, int], end: tuple[int, int]) -> tuple[str, str]:
    """(row word, column word) of cell `end` seen from cell `start`, both (row, col)."""
    return ROW_WORDS[int(np.sign(end[0] - start[0]))], COL_WORDS[int(np.sign(end[1] - start[1]))]


def tail(start: tuple[int, int], end: tuple[int, int]) -> str:
    """`rows {r0} to {r1}: {word}, cols {c0} to {c1}: {word}.` from cell `start` to cell `end`."""
    row_word, col_word = words(start, end)
    return f"rows {start[0]} to {end[0]}: {row_word}, cols {start[1]} to {end[1]}: {col_word}."


def tail_facts(start: tuple[int, int], end: tuple[int, int]) -> tuple[Fact, Fact]:
    """The two facts `tail(start, end)` states (`environments.faithfulness`): "rows", the rows and their word, and
    "cols", the columns and theirs."""
    row_word, col_word = words(start, end)
    return (Fact("rows", r"rows (\d+) to (\d+): (\w+)", (str(start[0]), str(end[0]), row_word)),
            Fact("cols", r"cols (\d+) to (\d+): (\w+)", (str(start[1]), str(end[1]), col_word)))

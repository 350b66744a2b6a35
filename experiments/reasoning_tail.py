"""Is a grid policy's reasoning still true to its input? Reads the validation transcripts of runs or sweeps
(`samples/step_N.jsonl`, `logging.samples_every`) of the one-move rungs (`configs/frozen_lake.py:tiny`,
`configs/sokoban.py:tiny`, whose warm starts end their reasoning "rows a to b: down, cols c to d: same.",
environments/axis_words.py) and prints, per transcript step over all runs:

* tail digits right: a, b, c, d are the player's and the cell's row and column of the observation (the cell: the
  goal on FrozenLake, the box on Sokoban);
* words right: the two axis words are the cell's true side of the player;
* words follow digits: the words are the ones the reasoning's own digits imply;
* answer follows words: the move is the one the reasoning's own words name (a single move: one axis "same");
* success: of those trajectories.

    .venv/bin/python experiments/reasoning_tail.py experiments/results/frozen_lake_filter [more folders]

A transcript holds the validation batch's first rows (the same prompts at every step), so n is small: 4 per run.
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import re

import numpy as np

from environments import axis_words

POSITION = r"\((\d+), (\d+)\)"
TAIL = re.compile(r"rows (\d+) to (\d+): (\w+), cols (\d+) to (\d+): (\w+)")
MOVES = {("down", "same"): "Down", ("up", "same"): "Up", ("same", "right"): "Right", ("same", "left"): "Left"}
COLUMNS = ("tail digits right", "words right", "words follow digits", "answer follows words", "success")


def checks(transcript: dict) -> tuple[bool, ...]:
    """The COLUMNS of one trajectory's first turn (all False but success when its reasoning has no tail)."""
    observation = transcript["chat"][transcript["chat"].rindex("Turn 1:"):]
    player = tuple(map(int, re.search("Player(?: on target)?: " + POSITION, observation).groups()))
    goal = tuple(map(int, re.search(("Goal: " if "Goal: " in observation else "Boxes: ") + POSITION,
                                    observation).groups()))
    turn = transcript["turns"][0] if transcript["turns"] else {"reasoning": "", "answer": ""}
    tail = TAIL.search(turn["reasoning"])
    if tail is None:
        return False, False, False, False, bool(transcript["success"])
    a, b, row_word, c, d, col_word = tail.groups()
    a, b, c, d = map(int, (a, b, c, d))
    words = (row_word, col_word)
    return ((a, b, c, d) == (player[0], goal[0], player[1], goal[1]),
            words == axis_words.words(player, goal), words == axis_words.words((a, c), (b, d)),
            MOVES.get(words) == turn["answer"], bool(transcript["success"]))


def by_step(folders: list[str]) -> dict[int, np.ndarray]:
    """{transcript step: bool[n, len(COLUMNS)]} over every run under `folders`."""
    out: dict[int, list] = {}
    for folder in folders:
        for path in glob.glob(os.path.join(folder, "**", "samples", "step_*.jsonl"), recursive=True):
            step = int(re.search(r"step_(\d+)\.jsonl$", path).group(1))
            with open(path, encoding="utf-8") as f:
                out.setdefault(step, []).extend(checks(json.loads(line)) for line in f)
    return {step: np.array(rows, bool) for step, rows in sorted(out.items())}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("folders", nargs="+", help="run or sweep folders holding samples/step_N.jsonl")
    args = parser.parse_args(argv)
    print("| step | n | " + " | ".join(COLUMNS) + " |\n|---|---|" + "---|" * len(COLUMNS))
    for step, rows in by_step(args.folders).items():
        print(f"| {step} | {len(rows)} | " + " | ".join(f"{v:.2f}" for v in rows.mean(axis=0)) + " |")


if __name__ == "__main__":
    main()

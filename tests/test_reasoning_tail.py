"""experiments/reasoning_tail.py on worked transcripts: a true tail, one whose digits are wrong but whose words follow
them, and one without a tail (FrozenLake); a Sokoban one about the box."""
from __future__ import annotations

import json

import numpy as np

from experiments import reasoning_tail as fl

CHAT = ("<|user|>\nTurn 1:\nState:\nStart: (2, 0)\nGoal: (3, 0)\nPlayer: (2, 0)\nHoles: (1, 3)\n<|end|><|assistant|>"
        "<think>...")


def transcript(reasoning: str, answer: str, success: bool) -> dict:
    return {"chat": CHAT, "success": success, "turns": [{"reasoning": reasoning, "answer": answer}]}


def test_checks_and_table(tmp_path, capsys):
    true = transcript("Player: (2, 0). Goal: (3, 0); rows 2 to 3: down, cols 0 to 0: same.", "Down", True)
    # digits copied wrong (the player's row twice), words that follow them ("same" row), an answer naming them not
    wrong = transcript("Goal: (2, 0). Goal: (2, 0); rows 2 to 2: same, cols 0 to 1: right.", "Up", False)
    untidy = transcript("no tail here", "Down", True)
    assert fl.checks(true) == (True, True, True, True, True)
    assert fl.checks(wrong) == (False, False, True, False, False)
    assert fl.checks(untidy) == (False, False, False, False, True)

    for run, step, rows in (("a", 0, [true, wrong]), ("b", 0, [untidy]), ("b", 10, [true])):
        (tmp_path / run / "samples").mkdir(parents=True, exist_ok=True)
        (tmp_path / run / "samples" / f"step_{step}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    table = fl.by_step([str(tmp_path)])
    assert list(table) == [0, 10] and table[0].shape == (3, len(fl.COLUMNS))
    np.testing.assert_allclose(table[0].mean(axis=0), [1 / 3, 1 / 3, 2 / 3, 1 / 3, 2 / 3])
    fl.main([str(tmp_path)])
    assert "| 10 | 1 | 1.00 | 1.00 | 1.00 | 1.00 | 1.00 |" in capsys.readouterr().out


def test_sokoban_tail_is_about_the_box():
    chat = ("<|user|>\nTurn 1:\nState:\nCoordinates: \nBoard size: 6 rows x 6 cols (zero-indexed).\nTargets: (1, 3)"
            "\nBoxes: (2, 3)\nPlayer: (3, 3)\nGrid Map: \n######\n<|end|><|assistant|><think>...")
    true = {"chat": chat, "success": True, "turns": [{"reasoning": "Boxes: (2, 3). Player: (3, 3); rows 3 to 2: up, "
                                                                   "cols 3 to 3: same.", "answer": "Up"}]}
    assert fl.checks(true) == (True, True, True, True, True)
    to_target = {**true, "turns": [{"reasoning": "rows 3 to 1: up, cols 3 to 3: same.", "answer": "Up"}]}
    assert fl.checks(to_target)[:3] == (False, True, True)  # the words happen to agree, the digits name the target

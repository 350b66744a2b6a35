"""`experiments.benchmarks.run_all`'s report and goals on a worked example: no benchmark runs."""
from __future__ import annotations

import pytest

from experiments.benchmarks import _goals, run_all

GOALS = {"tiny.decode_tok_s.ratio": 3.0, "ratio": ("<=", 0.40), "sokoban.tokens_ratio": 5.0}
RESULT = {  # a JSON line: one goal met, one missed, one not measured (sokoban skipped)
    "tiny": {"decode_tok_s": {"jax": 3309.0, "torch": 733.0, "ratio": 4.514}, "train_vs_matmul": 0.75},
    "ratio": 0.5, "sokoban": {"skipped": "no gym_sokoban"}, "threads": 2, "resets": 31036.2,
    "goals_met": {"tiny.decode_tok_s.ratio": True},
}
HEADER = [("date", "2026-01-01T00:00:00+00:00"), ("commit", "abc123 (tracked files modified)")]


def runs() -> list[run_all.Run]:
    ok = run_all.Run("lm", ".venv/bin/python -m experiments.benchmarks.lm --quick", 0, 12.34, RESULT, "", GOALS)
    failed = run_all.Run("envs", ".venv/bin/python -m experiments.benchmarks.envs --quick", 1, 3.04, None,
                         "Traceback (most recent call last):\nModuleNotFoundError: No module named 'gym_sokoban'\n",
                         {"sokoban.step_ratio": 100.0})
    silent = run_all.Run("sweep", ".venv/bin/python -m experiments.benchmarks.sweep --quick", 0, 1.0, None, "", {})
    return [ok, failed, silent]


def test_report_rows_and_ratios():
    text = run_all.report(HEADER, runs())
    lines = text.splitlines()
    assert lines[0] == "# Benchmarks"
    assert "| commit | abc123 (tracked files modified) |" in lines
    # summary: 4.514 >= 3 met, 0.5 <= 0.4 missed, the sokoban figure absent
    assert "| [lm](#lm) | ok | 12.3 | 1 of 3 (1 not measured) |" in lines
    assert "| [envs](#envs) | failed (exit 1) | 3.0 | 0 of 1 (not measured) |" in lines
    assert "| [sweep](#sweep) | failed (no JSON line) | 1.0 | - |" in lines
    lm = text[text.index("## lm"):text.index("## envs")].splitlines()
    assert "`.venv/bin/python -m experiments.benchmarks.lm --quick`: ok, 12.3 s" in lm
    assert lm[lm.index("| figure | value | goal | met |") + 2:][:5] == [
        "| tiny.decode_tok_s.ratio | 4.514 | ≥ 3 | yes |",
        "| ratio | 0.5 | ≤ 0.4 | **no** |",
        "| sokoban.tokens_ratio | - | ≥ 5 | not measured |",
        "| tiny.train_vs_matmul | 0.75 | | |",  # a ratio figure without a goal
        "",  # and no more: the tok/s figures, threads and resets are no ratios
    ]
    assert '"resets": 31036.2' in lm[lm.index("```json") + 1]
    envs = text[text.index("## envs"):text.index("## sweep")]
    assert "ModuleNotFoundError: No module named 'gym_sokoban'" in envs and "| figure |" not in envs


def test_numbers_and_json_line():
    assert [run_all.number(x) for x in (31036.2, 4.51449, 0.0533, 3, 1234567)] == [
        "31,036", "4.514", "0.0533", "3", "1,234,567"]
    stdout = 'progress\n{"a": 1}\n{"benchmark": "vocab", "x": {"y": 2}}\n| table | row |\n[1, 2]\n'
    assert run_all.json_line(stdout) == {"benchmark": "vocab", "x": {"y": 2}}
    assert run_all.json_line("no json\n") is None
    assert run_all.numbers({"a": {"b": 1, "ok": True, "s": "x"}, "c": 2.5}) == [("a.b", 1), ("c", 2.5)]


def test_goals():
    assert _goals.goals_met(RESULT, GOALS) == {"tiny.decode_tok_s.ratio": True, "ratio": False}
    assert _goals.met(0.40, ("<=", 0.40)) and _goals.met(5, 5.0) and _goals.met(None, 1.0) is None
    source = 'import x\nGOALS = {"a.b": 3, "c": ("<=", 0.1)}\nOTHER = 1\n'
    assert _goals.read_goals(source) == {"a.b": 3, "c": ("<=", 0.1)}
    assert _goals.read_goals("X = 1\n") == {}
    for bad in ('GOALS = {"a": ("<", 1)}\n', 'GOALS = {k: 1 for k in "ab"}\n', "GOALS = [1]\n"):
        with pytest.raises(ValueError):
            _goals.read_goals(bad)


def test_discovery_and_commands(tmp_path):
    for name in ("b.py", "a.py", "_helper.py", "__init__.py", "run_all.py", "notes.md"):
        (tmp_path / name).write_text("")
    assert run_all.discover(tmp_path) == ["a", "b"]
    names = run_all.discover()
    assert "rollout_e2e" in names and "lm" in names and not {"run_all", "_peers", "_goals"} & set(names)
    for name in names:  # run_all --quick passes --quick to each, and reads each one's GOALS
        source = (run_all.FOLDER / f"{name}.py").read_text(encoding="utf-8")
        assert '"--quick"' in source, name
        _goals.read_goals(source)
    argv = run_all.command("lm", quick=True)
    assert argv[1:] == ["-m", "experiments.benchmarks.lm", "--quick"]
    assert run_all.shown([str(run_all.ROOT / ".venv/bin/python"), "-m", "x"]) == ".venv/bin/python -m x"


def test_a_missing_peer_refuses_to_start_and_names_the_install(monkeypatch, capsys):
    monkeypatch.setattr(run_all, "_version", lambda p: None if p == "gym-sokoban" else "1.0")  # all but one
    assert run_all.missing_peers() == ["gym-sokoban==0.0.6"]  # setup.py's pin, read from the installed metadata
    monkeypatch.setattr("sys.argv", ["run_all", "--only", "vocab"])
    with pytest.raises(SystemExit):
        run_all.main()
    assert "the peers are not installed (gym-sokoban==0.0.6): .venv/bin/pip install -e '.[bench]'" in \
        capsys.readouterr().err

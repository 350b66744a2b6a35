"""Benchmark goals: what a script's `GOALS` dict means, and reading it without importing the script.

A benchmark script may define a module-level literal `GOALS = {figure: bound}`. A figure is a dotted path into the
script's JSON line ("tiny.decode_tok_s.ratio" is `result["tiny"]["decode_tok_s"]["ratio"]`); a bound is a number (the
figure must be at least that), (">=", x) (the same) or ("<=", x) (at most x). `run_all` reads GOALS from the source
(`read_goals`: the script's own imports, torch and jax, stay unloaded) and reports every figure against its bound;
scripts may put `goals_met(result, GOALS)` in their own JSON line. Not a benchmark (the leading underscore keeps
`run_all` from running it).
"""
from __future__ import annotations

import ast
from typing import Any

OPERATORS = (">=", "<=")


def bound(spec: Any) -> tuple[str, float]:
    """(operator, value) of one GOALS bound; a bare number means (">=", number). ValueError on anything else."""
    if isinstance(spec, (int, float)) and not isinstance(spec, bool):
        return ">=", float(spec)
    if isinstance(spec, (tuple, list)) and len(spec) == 2 and spec[0] in OPERATORS:
        return spec[0], float(spec[1])
    raise ValueError(f"a goal bound is a number or one of {OPERATORS} with a number, got {spec!r}")


def figure(result: dict, path: str) -> Any:
    """The value at dotted `path` of a JSON result; None where a key is missing or the value is no number."""
    value: Any = result
    for key in path.split("."):
        if not isinstance(value, dict) or key not in value:
            return None
        value = value[key]
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def met(value: float | None, spec: Any) -> bool | None:
    """Whether `value` meets the bound `spec`; None when the figure was not measured (`value` None)."""
    if value is None:
        return None
    operator, limit = bound(spec)
    return value >= limit if operator == ">=" else value <= limit


def goals_met(result: dict, goals: dict) -> dict[str, bool]:
    """{figure: met} for each goal whose figure `result` holds."""
    return {path: met(figure(result, path), spec) for path, spec in goals.items() if figure(result, path) is not None}


def read_goals(source: str) -> dict:
    """The literal `GOALS` assigned at the top level of a script's `source` text ({} if it has none); ValueError
    when GOALS is no literal dict of valid bounds."""
    for node in ast.parse(source).body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "GOALS" for t in node.targets):
            goals = ast.literal_eval(node.value)
            if not isinstance(goals, dict):
                raise ValueError(f"GOALS must be a dict, got {type(goals).__name__}")
            for spec in goals.values():
                bound(spec)
            return goals
    return {}

"""Sokoban (docs/environments.md#sokoban) in pure JAX: rules (`dynamics`), level generation (`generator`), an exact BFS
solver (`solver`) and the text environment (`env`, registered as "sokoban" and "larger_sokoban")."""
from environments.sokoban.env import Sokoban, SokobanParams, SokobanState

__all__ = ["Sokoban", "SokobanParams", "SokobanState"]

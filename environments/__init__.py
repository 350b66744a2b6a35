"""Text environments in pure JAX: `make(name, tokenizer, **overrides) -> (env, params)`.

See `environments/base.py` for the API (reset/step/render_text/oracle) and the subclass contract.
"""
from environments.base import TextEnv, TurnState
from environments.parsing import ParsedResponse, ResponseParser
from environments.pieces import Observation, PieceTable
from environments.registry import make, register, registered

__all__ = [
    "Observation",
    "ParsedResponse",
    "PieceTable",
    "ResponseParser",
    "TextEnv",
    "TurnState",
    "make",
    "register",
    "registered",
]

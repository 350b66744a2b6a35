"""The one exception class of user mistakes: a bad config value, model folder, tokenizer file or workdir.

Every such mistake raises a `UserInputError` (or a subclass: `config.ConfigError`, `models.hf.CheckpointError`,
`models.tokenizer.TokenizerError`, `workdir.WorkdirError`) whose message is one line naming the file, tensor or
config key at fault. The console scripts (`experiments.cli.one_line_errors`) print that line and exit with code 2,
before anything is written; every other exception is a bug and keeps its traceback.
"""
from __future__ import annotations

import contextlib
import json
from typing import Any, Iterator


class UserInputError(ValueError):
    """A mistake in what the user gave; the message is one line naming the file, tensor or key at fault."""


def one_line(text: str) -> str:
    """`text` with its lines stripped and joined by spaces (an error message that must fit one line)."""
    return " ".join(line.strip() for line in str(text).splitlines() if line.strip())


@contextlib.contextmanager
def reraised(error_class: type[UserInputError], where: str, *kinds: type[BaseException]) -> Iterator[None]:
    """Re-raises an exception of `kinds` raised in the block as `error_class(f"{where}: {message}")`, for the one
    library call that parses a user's file (a JSON decoder, safetensors, tokenizers); a UserInputError raised in the
    block passes unchanged."""
    try:
        yield
    except UserInputError:
        raise
    except kinds as error:
        message = error.args[0] if isinstance(error, KeyError) and error.args else error  # KeyError quotes its text
        raise error_class(f"{where}: {one_line(str(message))}") from error


def read_json(file: str, error_class: type[UserInputError], holds: str | None = None) -> Any:
    """The JSON value in `file`; `error_class` naming the file when it is unreadable or not JSON, or, when `holds`
    says what the file should hold (e.g. "a tokenizer"), not a JSON object."""
    with reraised(error_class, f"{file} is not readable JSON", OSError, UnicodeDecodeError, json.JSONDecodeError):
        with open(file, encoding="utf-8") as f:
            value = json.load(f)
    if holds is not None and not isinstance(value, dict):
        raise error_class(f"{file} holds a JSON {type(value).__name__}, not {holds}")
    return value

"""The one exception class of user mistakes: a bad config value, model folder, tokenizer file or workdir.

Every such mistake raises a `UserInputError` (or a subclass: `config.ConfigError`, `models.hf.CheckpointError`,
`models.tokenizer.TokenizerError`, `workdir.WorkdirError`) whose message is one line naming the file, tensor or
config key at fault. The console scripts (`experiments.cli.one_line_errors`) print that line and exit with code 2,
before anything is written; every other exception is a bug and keeps its traceback.
"""
from __future__ import annotations

import contextlib
from typing import Iterator


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

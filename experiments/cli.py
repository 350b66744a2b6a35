"""The entry points' shared command line: `--config=FILE[:ARG]` with `--config.KEY=VALUE` overrides (ml_collections),
`--workdir=DIR` (`ragen_jax.workdir`), `--distributed` (`ragen_jax.distributed`), and `--help` listing them next to
each script's own flags.

    parser = cli.parser(__doc__)                      # add the script's own flags to it
    args, config_argv = cli.parse(parser, argv)       # starts the multi-host runtime on --distributed
    config = cli.load_config(parser, args, config_argv)
    with cli.one_line_errors(parser):                 # a UserInputError later: one line, exit 2
        ...
"""
from __future__ import annotations

import argparse
import contextlib
import os
import sys
from typing import Any, Mapping

from absl import flags

from ragen_jax import config as config_lib
from ragen_jax import distributed
from ragen_jax import workdir as workdir_lib
from ragen_jax.errors import UserInputError, one_line
from ragen_jax.train.build import check_inputs

CONFIG_FLAG, OVERRIDE = "--config=", "--config."
CONFIG_HELP = """config flags (ml_collections):
  --config=FILE[:ARG]   the experiment config file, e.g. --config=configs/bandit.py:tiny
  --config.KEY=VALUE    override one of its keys, e.g. --config.filter.value=0.5 (repeatable)"""


def parser(doc: str) -> argparse.ArgumentParser:
    """An argument parser with the module doc as its help text and the shared `--workdir` and `--distributed`."""
    out = argparse.ArgumentParser(description=doc, epilog=CONFIG_HELP, allow_abbrev=False,
                                  formatter_class=argparse.RawDescriptionHelpFormatter)
    out.add_argument("--workdir", metavar="DIR", help="the run's folder: config.json, metrics.jsonl, TensorBoard events, "
                     "checkpoints/ (logging.dir and checkpoint.dir default to it); the same command again resumes")
    out.add_argument("--distributed", action="store_true",
                     help="start JAX's multi-host runtime first (run the same command on every host)")
    return out


def parse(parser: argparse.ArgumentParser, argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    """(the parser's flags, `[argv[0], *config flags]` for `ragen_jax.config.load`); `argv` as in `sys.argv`.
    `--help` prints the usage and exits 0; `--distributed` initialises the runtime here, before any other JAX call."""
    parser.prog = os.path.basename(argv[0])
    args, rest = parser.parse_known_args(argv[1:])
    if args.distributed:
        distributed.initialize()
    return args, [argv[0], *rest]


def overridden(config_argv: list[str]) -> set[str]:
    """The dotted keys a command line overrides (`--config.KEY=VALUE` or `--config.KEY VALUE`)."""
    return {a[len(OVERRIDE):].partition("=")[0] for a in config_argv if a.startswith(OVERRIDE)}


def load_config(parser: argparse.ArgumentParser, args: argparse.Namespace, config_argv: list[str],
                extra: Mapping[str, Any] | None = None):
    """The validated config of `--config` and its overrides, with the files it names checked
    (`ragen_jax.train.build.check_inputs`) and only then placed in `--workdir` when given
    (`ragen_jax.workdir.prepare`, with `extra`); a user mistake exits with one line naming it, nothing written."""
    with one_line_errors(parser):
        with _config_flag_errors():
            config = config_lib.load(config_argv)
        check_inputs(config)
        if args.workdir is not None:
            config = workdir_lib.prepare(config, args.workdir, overridden(config_argv), extra)
        return config


def load_workdir_config(parser: argparse.ArgumentParser, args: argparse.Namespace, config_argv: list[str]):
    """The config stored in `--workdir`'s config.json with the command line's `--config.KEY=VALUE` overrides."""
    if any(a.startswith(CONFIG_FLAG) for a in config_argv):
        parser.error("--workdir brings its config.json: give --config.KEY=VALUE overrides only, not --config=FILE")
    with one_line_errors(parser), _config_flag_errors():
        return config_lib.load(config_argv, stored=workdir_lib.read_config(args.workdir))


@contextlib.contextmanager
def one_line_errors(parser: argparse.ArgumentParser):
    """A `UserInputError` (a bad config, model folder, tokenizer or workdir) raised in the block prints
    `<prog>: error: <message>` as the one line on stderr and exits 2; any other exception passes with its traceback."""
    try:
        yield
    except UserInputError as error:
        print(f"{parser.prog}: error: {one_line(str(error))}", file=sys.stderr)
        raise SystemExit(2) from None


@contextlib.contextmanager
def _config_flag_errors():
    """The mistakes of `--config=FILE` and its overrides as a UserInputError: absl's flag errors (a config file's
    traceback reduced to its last line), an unreadable file, an override of a key the locked config lacks
    (ml_collections raises KeyError, or AttributeError(KeyError(message)) for a leaf)."""
    try:
        yield
    except (flags.Error, OSError) as error:
        lines = str(error).strip().splitlines()
        if "Traceback (most recent call last)" in str(error):  # absl quotes a config file's traceback: its last line
            lines = lines[-1:]
        raise UserInputError(one_line("\n".join(lines))) from None
    except (KeyError, AttributeError) as error:
        while isinstance(error, BaseException) and error.args:
            error = error.args[0]
        raise UserInputError("--config.KEY=VALUE names a key the config does not have: "
                             + str(error).replace("\n", "; ")) from None

"""The persistent XLA compilation cache of a run (`logging.compilation_cache`), so a resumed or repeated run loads its
compiled programs (the training step, validation, the SFT step) from disk instead of compiling them again.

    folder = compile_cache.enable(config.logging.compilation_cache)   # before the run's first compilation

`logging.compilation_cache` is "auto" (the default), a folder, or "" (no cache from the config):

* "auto": the folder the process has already chosen (`jax_compilation_cache_dir`, set e.g. by the
  JAX_COMPILATION_CACHE_DIR variable or a test's set-up) is kept; else `default_dir()`, a user cache folder shared by
  every run of this user, so a fresh workdir with a config run before compiles nothing new either.
* a folder: that one (created if missing; `~` is expanded).
* "": the config sets no cache (whatever the process set itself stays).

JAX writes a program to the cache when compiling it took at least `jax_persistent_cache_min_compile_time_secs`
(JAX's default, 1 s: the programs that matter take 10 s to minutes here) and reads it back in any later process on
the same backend, devices, flags and JAX version. The folder must be one only trusted users can write to: JAX runs
what it finds there. JAX opens the cache at the process's first compilation, so a folder set after that takes no
effect in this process.
"""
from __future__ import annotations

import os

import jax

AUTO = "auto"


def default_dir() -> str:
    """`$XDG_CACHE_HOME/ragen_jax/xla` (`~/.cache/ragen_jax/xla` when the variable is unset)."""
    root = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(root, "ragen_jax", "xla")


def resolve(setting: str) -> str | None:
    """The folder `setting` names (see the module doc): None for "", the process's own folder or `default_dir()`
    for "auto", else the expanded absolute path."""
    if not setting:
        return None
    if setting == AUTO:
        return jax.config.jax_compilation_cache_dir or default_dir()
    return os.path.abspath(os.path.expanduser(setting))


def enable(setting: str) -> str | None:
    """Points JAX's persistent compilation cache at `resolve(setting)` (created if missing); returns the folder, or
    None when the setting is "" (JAX's own setting left as it is)."""
    folder = resolve(setting)
    if folder is None:
        return None
    os.makedirs(folder, exist_ok=True)
    if jax.config.jax_compilation_cache_dir != folder:
        jax.config.update("jax_compilation_cache_dir", folder)
    return folder

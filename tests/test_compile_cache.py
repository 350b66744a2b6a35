"""The persistent compilation cache (`ragen_jax.compile_cache`, `logging.compilation_cache`): "auto" keeps a folder
the process chose and otherwise uses the user cache folder, where a second process finds what the first compiled;
"" sets none; a file is refused."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import jax
import pytest

from configs import base
from ragen_jax import compile_cache
from ragen_jax import config as config_lib

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# small programs compiled in a fresh process; prints the folder enable() chose and JAX's persistent-cache hits
PROGRAM = """
import json, sys
import jax, jax.numpy as jnp
from jax import monitoring
from ragen_jax import compile_cache
hits = []
monitoring.register_event_listener(lambda name, **_: hits.append(name) if name.endswith("/cache_hits") else None)
folder = compile_cache.enable(sys.argv[1])
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)  # this program compiles in well under 1 s
jax.jit(lambda x: jnp.sin(x) @ x.T + 1)(jnp.ones((32, 32))).block_until_ready()
print(json.dumps({"folder": folder, "hits": len(hits)}))
"""


def run_fresh_process(setting: str, cache_home) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("XLA_FLAGS", "JAX_COMPILATION_CACHE"))}
    env.update(XDG_CACHE_HOME=str(cache_home), JAX_PLATFORMS="cpu", PYTHONPATH=REPO_ROOT)
    out = subprocess.run([sys.executable, "-c", PROGRAM, setting], env=env, capture_output=True, text=True,
                         timeout=120, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_a_second_process_loads_what_the_first_compiled(tmp_path):
    default = str(tmp_path / "ragen_jax" / "xla")
    assert run_fresh_process("auto", tmp_path) == {"folder": default, "hits": 0}
    assert os.listdir(default)  # the executable was written
    second = run_fresh_process("auto", tmp_path)  # its programs (jnp.ones' too) all come from the cache
    assert second["folder"] == default and second["hits"] >= 1
    entries = sorted(os.listdir(default))
    assert run_fresh_process("", tmp_path) == {"folder": None, "hits": 0}  # off: nothing read or written
    assert sorted(os.listdir(default)) == entries


def test_auto_keeps_the_processes_own_folder_and_resolves_paths(tmp_path, monkeypatch):
    own = jax.config.jax_compilation_cache_dir  # tests/conftest.py's per-run folder
    assert own and compile_cache.enable("auto") == own and jax.config.jax_compilation_cache_dir == own
    assert compile_cache.resolve("") is None
    monkeypatch.setenv("HOME", str(tmp_path))
    assert compile_cache.resolve("~/xla") == str(tmp_path / "xla")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    assert compile_cache.default_dir() == str(tmp_path / "cache" / "ragen_jax" / "xla")


def test_a_file_is_refused(tmp_path):
    (tmp_path / "file").write_text("")
    config = config_lib.apply_overrides(base.get_config(), {"logging.compilation_cache": str(tmp_path / "file")})
    with pytest.raises(config_lib.ConfigError, match="logging.compilation_cache .* not a file"):
        config_lib.validate(config, num_devices=8)
    for ok in ("auto", "", str(tmp_path), str(tmp_path / "new")):
        config_lib.validate(config_lib.apply_overrides(config, {"logging.compilation_cache": ok}), num_devices=8)

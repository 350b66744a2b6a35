"""Security: model folders are read as JSON and safetensors only (a pickle or a `.py` file in the folder is never
executed), the config's model path is resolved and checked before use, and `tests.guards.no_network` catches
socket use even when the code swallows the error (the env fuzzing and a whole training step run inside it:
tests/environments/test_fuzz.py, tests/train/test_step.py)."""
from __future__ import annotations

import functools
import json
import os
import pickle
import re
import runpy
import socket
import subprocess
import sys

import jax
import numpy as np
import pytest

from configs import base
from ragen_jax.config import ConfigError
from ragen_jax.models import hf, transformer
from ragen_jax.models.config import ModelConfig
from ragen_jax.models.tokenizer import builtin
from ragen_jax.train.build import build_model, build_tokenizer
from tests.guards import no_network

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = ModelConfig(vocab_size=512, d_model=8, num_layers=1, num_heads=2, num_kv_heads=1, head_dim=4, mlp_dim=16,
                   max_seq_len=64)


class _Payload:
    """Unpickling it creates the folder `marker`: proof that a pickle ran code."""

    def __init__(self, marker: str):
        self.marker = marker

    def __reduce__(self):
        return os.mkdir, (self.marker,)


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """{name: folder}: a tiny saved model with a malicious `pytorch_model.bin` and a `modeling_evil.py` next to its
    safetensors ("model"), the same config with only the pickle ("pickle_only"), and an index whose only shard is
    the pickle ("index_to_pickle"); plus the markers each trap would create."""
    root = tmp_path_factory.mktemp("folders")
    markers = {"pickle": str(root / "pickle_ran"), "module": str(root / "module_ran")}
    rng = np.random.default_rng(0)
    shapes = jax.eval_shape(functools.partial(transformer.init_params, TINY), jax.random.key(0))
    params = jax.tree.map(lambda s: rng.standard_normal(s.shape, np.float32), shapes)
    out = {name: root / name for name in ("model", "pickle_only", "index_to_pickle")}
    hf.save_pretrained(transformer.Model(TINY, params), str(out["model"]))
    config = json.loads((out["model"] / hf.CONFIG_FILE).read_text())
    config["auto_map"] = {"AutoModelForCausalLM": "modeling_evil.EvilModel"}  # transformers' remote-code hook
    payload = pickle.dumps(_Payload(markers["pickle"]))
    for folder in out.values():
        folder.mkdir(exist_ok=True)
        (folder / hf.CONFIG_FILE).write_text(json.dumps(config))
        (folder / "pytorch_model.bin").write_bytes(payload)
        (folder / "modeling_evil.py").write_text(f"import os\nos.mkdir({markers['module']!r})\n")
    names = hf.tensor_map(TINY)
    (out["index_to_pickle"] / hf.INDEX_FILE).write_text(json.dumps({"weight_map": dict.fromkeys(names, "pytorch_model.bin")}))
    # both traps are live: loading the pickle or running the module executes code
    pickle.loads(payload)
    runpy.run_path(str(out["model"] / "modeling_evil.py"))
    assert all(os.path.isdir(m) for m in markers.values())
    for m in markers.values():
        os.rmdir(m)
    return {k: str(v) for k, v in out.items()}, markers, params


# Runs in a fresh interpreter, so nothing the test process imported (torch, for the HF parity tests) counts.
AUDIT = r"""
import json, sys
folders = json.loads(sys.argv[1])
events, python_opened, safetensors_opened = [], [], []

def hook(event, args):
    if event == "pickle.find_class" or (event == "import" and args[0].split(".")[0] in ("torch", "modeling_evil")):
        events.append(f"{event} {args[:2]}")
    elif event == "open" and isinstance(args[0], str) and any(args[0].startswith(f) for f in folders.values()):
        python_opened.append(args[0])

sys.addaudithook(hook)
from ragen_jax.models import hf
open_safetensors = hf.safetensors.safe_open

def recording(file, *args, **kwargs):
    safetensors_opened.append(file)
    return open_safetensors(file, *args, **kwargs)

hf.safetensors.safe_open = recording
results = {}
for name, folder in folders.items():
    try:
        hf.load_pretrained(folder)
        results[name] = "loaded"
    except Exception as err:  # the error kind is the loader's business; what ran while failing is ours
        results[name] = f"{type(err).__name__}: {err}"
print(json.dumps({"results": results, "events": events, "python_opened": python_opened,
                  "safetensors_opened": safetensors_opened, "torch": "torch" in sys.modules}))
"""


def test_model_folders_are_read_as_json_and_safetensors_only(folders):
    paths, markers, _ = folders
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": REPO_ROOT}
    done = subprocess.run([sys.executable, "-c", AUDIT, json.dumps(paths)], capture_output=True, text=True,
                          env=env, cwd=REPO_ROOT, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    results = report["results"]
    assert results["model"] == "loaded"
    assert results["pickle_only"].startswith("CheckpointError") and hf.WEIGHTS_FILE in results["pickle_only"]
    assert results["index_to_pickle"] != "loaded"  # handed to safetensors, which rejects it unparsed
    assert report["events"] == [] and not report["torch"]  # nothing unpickled, no torch, no module from the folder
    assert not any(os.path.exists(m) for m in markers.values())
    assert report["python_opened"] and all(p.endswith(".json") for p in report["python_opened"])
    model_files = [p for p in report["safetensors_opened"] if p.startswith(paths["model"])]
    assert model_files == [os.path.join(paths["model"], hf.WEIGHTS_FILE)]


def test_config_model_and_tokenizer_paths_are_resolved_and_checked(folders, tmp_path, monkeypatch):
    paths, _, params = folders
    monkeypatch.chdir(os.path.dirname(paths["model"]))
    config = base.get_config()
    config.model.pretrained_path = "model"  # relative to the working directory
    model_config, loaded = build_model(config, builtin())
    assert model_config == TINY
    jax.tree.map(np.testing.assert_array_equal, loaded, params)
    for missing in ("no_such_model", os.path.join("model", hf.CONFIG_FILE)):  # absent, and a file, not a folder
        config.model.pretrained_path = missing
        message = f"config.model.pretrained_path = '{missing}' is invalid: no such folder: {os.path.abspath(missing)}"
        with pytest.raises(ConfigError, match=re.escape(message)):
            build_model(config, builtin())
    config.tokenizer.kind, config.tokenizer.path = "json", str(tmp_path / "no_such_tokenizer.json")
    with pytest.raises((ConfigError, FileNotFoundError), match="no_such_tokenizer.json"):
        build_tokenizer(config)


def test_no_network_catches_a_connection_even_when_the_error_is_swallowed():
    with pytest.raises(AssertionError, match="socket"):
        with no_network():
            try:
                socket.create_connection(("127.0.0.1", 9), timeout=1)
            except OSError:
                pass
    socket.socket().close()  # outside the block sockets work again

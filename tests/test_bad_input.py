"""Bad input is one `UserInputError` line naming the file, tensor or key (issue 12 item 2): model folders, tokenizer
files and chat formats through `build.check_inputs` (what the console scripts run before writing anything), config
values through `config.validate`, workdirs through `workdir.prepare`. The console scripts themselves:
tests/test_bad_input_cli.py."""
from __future__ import annotations

import dataclasses
import functools
import json
import math
import os
import shutil

import jax
import numpy as np
import pytest
import safetensors.numpy
import tokenizers
from tokenizers import decoders, models, pre_tokenizers

from configs import base
from ragen_jax import config as config_lib
from ragen_jax import workdir
from ragen_jax.config import apply_overrides
from ragen_jax.errors import UserInputError
from ragen_jax.models import hf, transformer
from ragen_jax.models import tokenizer as tok_lib
from ragen_jax.models.config import ModelConfig
from ragen_jax.train import build

# vocab 512 covers the built-in tokenizer, so a folder passes the vocabulary check and reaches its weights
TINY = ModelConfig(vocab_size=512, d_model=8, num_layers=2, num_heads=2, num_kv_heads=1, head_dim=4, mlp_dim=16,
                   max_seq_len=4096, tie_embeddings=False)
WEIGHTS = hf.WEIGHTS_FILE
TENSOR = "model.layers.1.mlp.up_proj.weight"


def save_tiny_model(folder: str, max_shard_size: int | None = None) -> str:
    """A random TINY model saved as a HF folder (sharded when `max_shard_size` is given); returns the folder."""
    rng = np.random.default_rng(0)
    shapes = jax.eval_shape(functools.partial(transformer.init_params, TINY), jax.random.key(0))
    params = jax.tree.map(lambda s: rng.standard_normal(s.shape, np.float32), shapes)
    hf.save_pretrained(transformer.Model(TINY, params), folder, max_shard_size=max_shard_size)
    return folder


def _one_line(error: pytest.ExceptionInfo, *parts: str) -> str:
    message = str(error.value)
    assert "\n" not in message and all(p in message for p in parts), (message, parts)
    return message


def _config(**overrides):
    return apply_overrides(base.get_config(), overrides)


# ---- model folder ---------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def good_folders(tmp_path_factory):
    """(single-file folder, sharded folder) of TINY."""
    root = tmp_path_factory.mktemp("models")
    return save_tiny_model(str(root / "single")), save_tiny_model(str(root / "sharded"), max_shard_size=2000)


def _edit_json(name, edit):
    def apply(folder):
        with open(os.path.join(folder, name), encoding="utf-8") as f:
            data = json.load(f)
        edit(data)
        with open(os.path.join(folder, name), "w", encoding="utf-8") as f:
            json.dump(data, f)
    return apply


def _edit_tensors(edit):
    def apply(folder):
        file = os.path.join(folder, WEIGHTS)
        tensors = safetensors.numpy.load_file(file)
        edit(tensors)
        safetensors.numpy.save_file(tensors, file)
    return apply


def _write(name, data: bytes):
    def apply(folder):
        with open(os.path.join(folder, name), "wb") as f:
            f.write(data)
    return apply


def _truncate(folder):
    file = os.path.join(folder, WEIGHTS)
    os.truncate(file, os.path.getsize(file) // 2)


def _drop_a_shard(folder):
    with open(os.path.join(folder, hf.INDEX_FILE), encoding="utf-8") as f:
        os.remove(os.path.join(folder, json.load(f)["weight_map"][TENSOR]))


SINGLE_FILE_CASES = {  # name: (edit of the good folder, the file named (None: the folder), what else it names)
    "no config.json": (lambda f: os.remove(os.path.join(f, hf.CONFIG_FILE)), hf.CONFIG_FILE, "does not exist"),
    "config.json not JSON": (_write(hf.CONFIG_FILE, b'{"vocab_size": 5'), hf.CONFIG_FILE, "not readable JSON"),
    "config.json a list": (_write(hf.CONFIG_FILE, b"[1, 2]"), hf.CONFIG_FILE, "JSON list"),
    "unsupported architecture": (_edit_json(hf.CONFIG_FILE, lambda c: c.update(architectures=["MistralForCausalLM"])),
                                 hf.CONFIG_FILE, "MistralForCausalLM"),
    "size not an int": (_edit_json(hf.CONFIG_FILE, lambda c: c.update(hidden_size="8")), hf.CONFIG_FILE,
                        "hidden_size = '8' is not a positive integer"),
    "heads not dividing": (_edit_json(hf.CONFIG_FILE, lambda c: c.update(num_key_value_heads=3)), hf.CONFIG_FILE,
                           "num_heads = 2 is invalid"),
    "theta not a number": (_edit_json(hf.CONFIG_FILE, lambda c: c.update(rope_theta="fast")), hf.CONFIG_FILE,
                           "rope_theta = 'fast' is not a number"),
    "no weights": (lambda f: os.remove(os.path.join(f, WEIGHTS)), None, "no model.safetensors or"),
    "missing tensor": (_edit_tensors(lambda t: t.pop(TENSOR)), WEIGHTS, f"missing tensor {TENSOR!r}"),
    "wrong shape": (_edit_tensors(lambda t: t.update({TENSOR: np.zeros((16, 9), np.float32)})), WEIGHTS,
                    f"tensor {TENSOR!r} has shape (16, 9), expected (16, 8)"),
    "wrong dtype": (_edit_tensors(lambda t: t.update({TENSOR: np.zeros((16, 8), np.int32)})), WEIGHTS,
                    f"tensor {TENSOR!r} has dtype I32"),
    "truncated": (_truncate, WEIGHTS, "not a readable safetensors file (truncated or corrupt?)"),
    "corrupt header": (_write(WEIGHTS, (40).to_bytes(8, "little") + b"{not json" + b" " * 60), WEIGHTS,
                       "not a readable safetensors file"),
}


@pytest.mark.parametrize("case", SINGLE_FILE_CASES)
def test_a_bad_model_folder_is_one_line_naming_the_file_and_tensor(case, good_folders, tmp_path):
    edit, file, detail = SINGLE_FILE_CASES[case]
    folder = shutil.copytree(good_folders[0], tmp_path / "model")
    edit(str(folder))
    with pytest.raises(hf.CheckpointError) as error:
        build.check_inputs(_config(**{"model.pretrained_path": str(folder)}))
    _one_line(error, str(folder) if file is None else os.path.join(str(folder), file), detail)


def test_a_sharded_folder_names_its_index_and_the_tensor_of_a_missing_shard(good_folders, tmp_path):
    assert build.check_inputs(_config(**{"model.pretrained_path": good_folders[1]})) is None
    folder = str(shutil.copytree(good_folders[1], tmp_path / "no_shard"))
    _drop_a_shard(folder)
    with pytest.raises(hf.CheckpointError) as error:
        hf.check_pretrained(folder)
    _one_line(error, os.path.join(folder, hf.INDEX_FILE), f"tensor {TENSOR!r} in shard 'model-0000")
    bad_index = str(shutil.copytree(good_folders[1], tmp_path / "bad_index"))
    _write(hf.INDEX_FILE, b'{"weight_map": ["model-00001-of-00002.safetensors"]}')(bad_index)
    with pytest.raises(hf.CheckpointError) as error:
        hf.check_pretrained(bad_index)
    _one_line(error, os.path.join(bad_index, hf.INDEX_FILE), "lacks a weight_map")


def test_non_finite_weights_fail_the_load_after_the_header_checks_pass(good_folders, tmp_path):
    folder = str(shutil.copytree(good_folders[0], tmp_path / "nan"))
    _edit_tensors(lambda t: t[TENSOR].__setitem__((3, 2), np.nan))(folder)
    assert hf.check_pretrained(folder) == TINY  # the headers are fine: no weight is read
    with pytest.raises(hf.CheckpointError) as error:
        hf.load_pretrained(folder)
    _one_line(error, os.path.join(folder, WEIGHTS), f"tensor {TENSOR!r} holds NaN")


# ---- tokenizer --------------------------------------------------------------------------------------------


def _tokenizer_file(folder, special_tokens) -> str:
    """A byte-level tokenizer.json whose only added tokens are `special_tokens`."""
    alphabet = tok_lib.byte_level_alphabet().values()
    tok = tokenizers.Tokenizer(models.BPE({c: i for i, c in enumerate(alphabet)}, []))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(list(special_tokens))
    os.makedirs(folder, exist_ok=True)
    tok.save(os.path.join(folder, tok_lib.HF_FILE))
    return os.path.join(folder, tok_lib.HF_FILE)


def _json_tokenizer(path, chat_format="chatml"):
    return _config(**{"tokenizer.kind": "json", "tokenizer.path": path, "tokenizer.chat_format": chat_format})


def test_a_bad_tokenizer_or_chat_format_is_one_line_naming_the_file_and_token(tmp_path):
    good = _tokenizer_file(tmp_path / "good", ["<|im_start|>", "<|im_end|>"])
    assert build.check_inputs(_json_tokenizer(good)) is None
    cases = {  # the file: (the error class, what else the message names)
        str(tmp_path / "missing.json"): (config_lib.ConfigError, "config.tokenizer.path"),
        _tokenizer_file(tmp_path / "no_start", ["<|im_end|>"]): (tok_lib.TokenizerError, "'<|im_start|>'"),
        _tokenizer_file(tmp_path / "no_end", ["<|im_start|>"]): (tok_lib.TokenizerError, "no end-of-turn token"),
    }
    for name, text, detail in (("cut.json", b'{"version": "1.0", "model": ', "not readable JSON"),
                               ("odd.json", b'{"version": "1.0", "model": 3}', "is not a HF tokenizer.json")):
        (tmp_path / name).write_bytes(text)
        cases[str(tmp_path / name)] = (tok_lib.TokenizerError, detail)
    for file, (kind, detail) in cases.items():
        with pytest.raises(kind) as error:
            build.check_inputs(_json_tokenizer(file))
        _one_line(error, file, detail)
    with pytest.raises(tok_lib.TokenizerError) as error:  # the built-in vocabulary has only the plain markers
        build.check_inputs(_config(**{"tokenizer.chat_format": "chatml"}))
    _one_line(error, "the builtin tokenizer does not fit tokenizer.chat_format = 'chatml'", "'<|im_start|>'")


# ---- config -----------------------------------------------------------------------------------------------

VALIDATION_CASES = [  # (overrides, the message's start), one per class of check in config.validate
    ({"algo.name": "ppo2"}, "config.algo.name = 'ppo2' is invalid: allowed values"),
    ({"filter.value": 1.5}, "config.filter.value = 1.5"),
    ({"optim.actor_lr": -1e-6}, "config.optim.actor_lr = -1e-06 is invalid: must be >= 0"),
    ({"algo.kl_loss_coef": math.inf}, "config.algo.kl_loss_coef = inf is invalid: must be finite"),
    ({"train.test_freq": -1}, "config.train.test_freq = -1"),  # a negative frequency
    ({"checkpoint.save_freq": 0}, "config.checkpoint.save_freq = 0 is invalid: must be >= 1"),
    ({"model.num_heads": 0}, "config.model.num_heads = 0"),
    ({"filter.rv_collapse_window": -1}, "config.filter.rv_collapse_window = -1"),
    ({"env.success_rate": 1.5}, "config.env.success_rate = 1.5 is invalid: must be in [0, 1]"),
    ({"rollout.top_p": -0.5}, "config.rollout.top_p = -0.5"),
    ({"optim.b2": 1.01}, "config.optim.b2 = 1.01"),
    ({"model.norm_eps": 0.0}, "config.model.norm_eps = 0.0 is invalid: must be > 0"),
    ({"rollout.response_length": 3600}, "config.rollout.response_length = 3600 is invalid: a turn's prompt"),
    ({"algo.clip_ratio_c": 1.0}, "config.algo.clip_ratio_c = 1.0 is invalid: the dual-clip bound must be > 1"),
    ({"rollout.group_size": 1}, "config.rollout.group_size = 1"),
    ({"rollout.group_size": 1, "filter.metric": "reward", "algo.adv_estimator": "grpo"},
     "config.rollout.group_size = 1 is invalid: the grpo"),
    ({"diagnostics.grad_analysis_group_size": 1}, "config.diagnostics.grad_analysis_group_size = 1"),
    ({"train.sft_batch_size": -1}, "config.train.sft_batch_size = -1"),
    ({"train.sft_batch_size": 16, "train.sft_micro_batch_size": 5},
     "config.train.sft_micro_batch_size = 5 is invalid: must be 0 (the whole batch) or divide the warm-start batch "
     "of 16"),
    ({"tokenizer.chat_format": "auto"}, "config.tokenizer.chat_format = 'auto' is invalid: is recognised from a GGUF"),
    ({"model.preset": "qwen2.5-0.5b", "model.pretrained_path": "m"}, "config.model.preset = 'qwen2.5-0.5b'"),
    ({"tokenizer.kind": "json"}, "config.tokenizer.path = '' is invalid"),
    ({"tokenizer.kind": "qwen2.5"}, "config.tokenizer.chat_format = 'plain'"),
    ({"mesh.data": 2}, "config.mesh.data = 2"),
    ({"algo.ppo_mini_batch_size": 24}, "config.algo.ppo_mini_batch_size = 24 is invalid: must divide"),
    ({"algo.ppo_micro_batch_size": 5}, "config.algo.ppo_micro_batch_size = 5"),
]


@pytest.mark.parametrize("overrides, message", VALIDATION_CASES, ids=[",".join(c[0]) for c in VALIDATION_CASES])
def test_each_class_of_invalid_config_is_one_line_naming_the_key(overrides, message):
    with pytest.raises(config_lib.ConfigError) as error:
        config_lib.validate(_config(**overrides), num_devices=1)
    assert isinstance(error.value, UserInputError) and _one_line(error).startswith(message)


def test_what_only_the_build_can_check_names_the_key_too():
    for overrides, message in (({"env.name": "sokobann"}, "config.env.name = 'sokobann'"),
                               ({"model.d_model": 130}, "model sizes: config.model.d_model = 130"),
                               ({"model.vocab_size": 100}, "config.model.vocab_size = 100")):
        with pytest.raises(UserInputError) as error:
            build.check_inputs(_config(**overrides))
        _one_line(error, message)
    config = _config(**{"env.name": "bandit"})
    with config.unlocked():
        config.env.kwargs.armz = 3
    with pytest.raises(UserInputError) as error:
        build.build_env(config, tok_lib.builtin())
    _one_line(error, "config.env.kwargs: environment 'bandit'", "'armz'")


def test_what_only_the_rollout_and_step_can_check_names_the_key_too():
    """The exact one-turn length needs the rendered prompts: the rollout checks it, and the step the collapse
    diagnostics' reach; each a one-line ConfigError the console scripts print as such."""
    import environments
    from ragen_jax.models import chat
    from ragen_jax.rollout.rollout import Rollout
    from ragen_jax.train.step import TrainStep

    tokenizer = tok_lib.builtin()
    env, _ = environments.make("frozen_lake", tokenizer)
    geometry = dict(num_groups=1, group_size=1, max_turn=1, response_length=16)
    for model, max_len, message in ((TINY, 64, "config.rollout.max_model_len = 64 is invalid: cannot hold"),
                                    (TINY, 5000, "config.rollout.max_model_len = 5000 is invalid: exceeds"),
                                    (dataclasses.replace(TINY, vocab_size=100), 512,
                                     "config.model.vocab_size = 100 is invalid")):
        with pytest.raises(config_lib.ConfigError) as error:
            Rollout(env, tokenizer, chat.plain(), transformer.DecoderLM(model), max_len=max_len, **geometry)
        _one_line(error, message)
    config = _config(**{"env.name": "frozen_lake", "rollout.max_model_len": 1024, "model.max_seq_len": 1030})
    with pytest.raises(config_lib.ConfigError) as error:
        TrainStep(config, env, tokenizer, ModelConfig.from_config(config.model, tokenizer.vocab_size), chat.plain())
    _one_line(error, "config.model.max_seq_len = 1030 is invalid: must be >= rollout.max_model_len - 1")


# ---- workdir ----------------------------------------------------------------------------------------------


def _snapshot(folder) -> dict[str, tuple[bytes, int]]:
    """{relative path: (bytes, mtime_ns)} of every file under `folder`."""
    out = {}
    for root, _, files in os.walk(folder):
        for name in files:
            path = os.path.join(root, name)
            with open(path, "rb") as f:
                out[os.path.relpath(path, folder)] = (f.read(), os.stat(path).st_mtime_ns)
    return out


def test_a_workdir_that_is_unreadable_foreign_or_unwritable_is_refused_untouched(tmp_path):
    config = base.get_config()
    run = tmp_path / "run"
    (run / workdir.CHECKPOINTS / "7").mkdir(parents=True)  # checkpoints of an unknown config
    with pytest.raises(workdir.WorkdirError) as error:
        workdir.prepare(config, str(run))
    _one_line(error, os.path.join(str(run), workdir.CHECKPOINTS), "holds checkpoints but", workdir.CONFIG_FILE)
    assert not (run / workdir.CONFIG_FILE).exists()
    start_over = apply_overrides(config, {"checkpoint.resume": False})
    workdir.prepare(start_over, str(run), overridden={"checkpoint.resume"})  # resume off on the command line: allowed
    os.remove(run / workdir.CONFIG_FILE)
    (run / workdir.CONFIG_FILE).write_text('{"train": ')
    before = _snapshot(run)
    for read in (lambda: workdir.prepare(config, str(run)), lambda: workdir.read_config(str(run))):
        with pytest.raises(workdir.WorkdirError) as error:
            read()
        _one_line(error, os.path.join(str(run), workdir.CONFIG_FILE), "is not readable JSON")
    assert _snapshot(run) == before
    blocker = tmp_path / "a_file"
    blocker.write_text("not a folder")
    with pytest.raises(workdir.WorkdirError) as error:  # the parent is a file: fails for root too
        workdir.prepare(config, str(blocker / "run"))
    _one_line(error, f"--workdir={blocker / 'run'} cannot be written")
    if os.geteuid() != 0:  # root writes through permission bits
        locked = tmp_path / "locked"
        locked.mkdir(mode=0o500)
        with pytest.raises(workdir.WorkdirError) as error:
            workdir.prepare(config, str(locked))
        _one_line(error, f"--workdir={locked} cannot be written", "Permission denied")

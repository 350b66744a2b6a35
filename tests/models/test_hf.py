"""HF safetensors import/export against transformers (random tiny Qwen2 / Llama-3 models saved in the test)."""
import functools
import json
import os
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import safetensors.numpy
import torch
import transformers

from ragen_jax.models import hf as hf_io
from ragen_jax.models import transformer as tfm

ROPE_V4 = {"rope_theta": 500000.0, "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                                    "high_freq_factor": 4.0, "original_max_position_embeddings": 16}}


def _hf_model(kind):
    """Random tiny HF model; every tensor (norm scales and biases too) randomised so parity is meaningful."""
    torch.manual_seed(0 if kind == "qwen2" else 1)
    if kind == "qwen2":  # q/k/v bias, tied embeddings, Qwen2.5-style theta
        config = transformers.Qwen2Config(
            vocab_size=96, hidden_size=64, intermediate_size=112, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, tie_word_embeddings=True, max_position_embeddings=128,
            rope_parameters={"rope_type": "default", "rope_theta": 1000000.0})
        model = transformers.Qwen2ForCausalLM(config)
    else:  # untied head, head_dim != hidden / heads, Llama-3.1 RoPE rescaling
        config = transformers.LlamaConfig(
            vocab_size=80, hidden_size=48, intermediate_size=96, num_hidden_layers=3, num_attention_heads=4,
            num_key_value_heads=1, head_dim=16, rms_norm_eps=1e-5, tie_word_embeddings=False,
            max_position_embeddings=128, rope_parameters={**ROPE_V4["rope_scaling"], "rope_theta": 500000.0})
        model = transformers.LlamaForCausalLM(config)
    with torch.no_grad():
        for name, tensor in model.named_parameters():
            tensor.copy_((1.0 if "norm" in name else 0.0) + 0.1 * torch.randn_like(tensor))
    model.config._attn_implementation = "eager"
    return model.eval()


@pytest.fixture(scope="module", params=["qwen2", "llama"])
def saved(request, tmp_path_factory):
    """(torch model, single-file folder, sharded folder)."""
    model = _hf_model(request.param)
    single, sharded = (str(tmp_path_factory.mktemp(f"{request.param}_{k}")) for k in ("single", "sharded"))
    model.save_pretrained(single)
    model.save_pretrained(sharded, max_shard_size="20KB")
    assert os.path.isfile(os.path.join(sharded, hf_io.INDEX_FILE))
    return model, single, sharded


def _batch(vocab):
    """A left-padded batch: tokens int32[3, 10], mask [3, 10]."""
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, vocab, (3, 10)).astype(np.int32)
    mask = np.ones((3, 10), np.int32)
    mask[1, :4] = 0
    mask[2, :7] = 0
    return tokens, mask


def _torch_logits(model, tokens, mask):
    with torch.no_grad():
        return model(input_ids=torch.tensor(tokens, dtype=torch.long), attention_mask=torch.tensor(mask)).logits.numpy()


def _our_logits(model, tokens, mask):
    return np.asarray(jax.jit(tfm.apply, static_argnums=0)(model.config, model.params, tokens, None, mask))


def test_load_matches_transformers_logits(saved):
    torch_model, single, sharded = saved
    tokens, mask = _batch(torch_model.config.vocab_size)
    expected = _torch_logits(torch_model, tokens, mask)
    for folder in (single, sharded):
        model = hf_io.load_pretrained(folder)
        assert model.config.qkv_bias == (torch_model.config.model_type == "qwen2")
        assert model.config.tie_embeddings == torch_model.config.tie_word_embeddings
        got = _our_logits(model, tokens, mask)
        real = mask.astype(bool)
        np.testing.assert_allclose(got[real], expected[real], atol=1e-4, rtol=0)


def test_round_trip_is_bit_exact_and_transformers_reads_our_save(saved, tmp_path):
    torch_model, single, _ = saved
    model = hf_io.load_pretrained(single)
    for kwargs in ({}, {"max_shard_size": 30_000}):
        out = str(tmp_path / f"out{len(kwargs)}")
        hf_io.save_pretrained(model, out, **kwargs)
        assert os.path.isfile(os.path.join(out, hf_io.INDEX_FILE)) == bool(kwargs)
        again = hf_io.load_pretrained(out)
        assert again.config == model.config
        assert jax.tree.structure(again.params) == jax.tree.structure(model.params)
        for a, b in zip(jax.tree.leaves(again.params), jax.tree.leaves(model.params)):
            assert a.dtype == jnp.float32 and np.array_equal(np.asarray(a), np.asarray(b))
    # same tensor names as transformers writes, and transformers loads our folder to the same logits
    with safetensors.safe_open(os.path.join(single, hf_io.WEIGHTS_FILE), "numpy") as f:
        hf_names = set(f.keys())
    with safetensors.safe_open(os.path.join(str(tmp_path / "out0"), hf_io.WEIGHTS_FILE), "numpy") as f:
        assert set(f.keys()) == hf_names
    reloaded = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path / "out0"), attn_implementation="eager")
    tokens, mask = _batch(torch_model.config.vocab_size)
    np.testing.assert_array_equal(_torch_logits(reloaded.eval(), tokens, mask), _torch_logits(torch_model, tokens, mask))


def test_both_rope_layouts_give_the_same_config(saved, tmp_path):
    torch_model, single, _ = saved
    with open(os.path.join(single, hf_io.CONFIG_FILE)) as f:
        v5 = json.load(f)
    assert "rope_parameters" in v5  # transformers 5 writes this layout
    v4 = {k: v for k, v in v5.items() if k != "rope_parameters"}
    rope = v5["rope_parameters"]
    v4["rope_theta"] = rope["rope_theta"]
    if rope["rope_type"] != "default":
        v4["rope_scaling"] = {k: v for k, v in rope.items() if k != "rope_theta"}
    config5, arch5 = hf_io.config_from_hf(v5)
    config4, arch4 = hf_io.config_from_hf(v4)
    assert (config4, arch4) == (config5, arch5)
    assert config5.rope_theta == rope["rope_theta"]
    assert (config5.rope_scaling is None) == (rope["rope_type"] == "default")
    if config5.rope_scaling is not None:  # the legacy "type" key is accepted too
        v4["rope_scaling"]["type"] = v4["rope_scaling"].pop("rope_type")
        assert hf_io.config_from_hf(v4)[0] == config5


def test_loading_on_cpu_keeps_one_host_copy(saved, monkeypatch):
    """Every leaf is built in one host buffer that the JAX array then aliases (no second copy)."""
    _, single, _ = saved
    placed = []

    def spy(buffer, sharding):
        array = to_device(buffer, sharding)
        placed.append(array.unsafe_buffer_pointer() == buffer.ctypes.data)
        return array

    to_device = hf_io._to_device
    monkeypatch.setattr(hf_io, "_to_device", spy)
    model = hf_io.load_pretrained(single)
    assert len(placed) == len(jax.tree.leaves(model.params)) and all(placed)


def test_load_to_shardings(saved):
    _, single, _ = saved
    plain = hf_io.load_pretrained(single)
    mesh = jax.sharding.Mesh(np.array(jax.devices()[:8]), ("fsdp",))
    rows = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("fsdp"))
    replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
    shardings = jax.tree.map(lambda _: replicated, plain.params)
    shardings["embed"]["embedding"] = rows  # vocab 96 / 80 rows over 8 devices
    sharded = hf_io.load_pretrained(single, shardings=shardings)
    assert sharded.params["embed"]["embedding"].sharding == rows
    for a, b in zip(jax.tree.leaves(sharded.params), jax.tree.leaves(plain.params)):
        assert np.array_equal(np.asarray(a), np.asarray(b))


def test_bfloat16_checkpoint_loads_as_float32(tmp_path):
    torch_model = _hf_model("qwen2").to(torch.bfloat16)
    torch_model.save_pretrained(str(tmp_path))
    model = hf_io.load_pretrained(str(tmp_path))
    embedding = torch_model.model.embed_tokens.weight.detach().float().numpy()
    q_kernel_1 = torch_model.model.layers[1].self_attn.q_proj.weight.detach().float().numpy().T
    assert np.array_equal(np.asarray(model.params["embed"]["embedding"]), embedding)
    assert np.array_equal(np.asarray(model.params["layers"]["q_proj"]["kernel"][1]), q_kernel_1)
    assert model.params["layers"]["q_proj"]["kernel"].dtype == jnp.float32


# ---- errors -------------------------------------------------------------------------------------------


def _rewrite(src, dst, edit_tensors=None, edit_config=None):
    shutil.copytree(src, dst)
    if edit_tensors is not None:
        file = os.path.join(dst, hf_io.WEIGHTS_FILE)
        tensors = safetensors.numpy.load_file(file)
        edit_tensors(tensors)
        safetensors.numpy.save_file(tensors, file, metadata={"format": "pt"})
    if edit_config is not None:
        file = os.path.join(dst, hf_io.CONFIG_FILE)
        with open(file) as f:
            config = json.load(f)
        edit_config(config)
        with open(file, "w") as f:
            json.dump(config, f)
    return str(dst)


def test_errors_name_the_offending_tensor_or_setting(tmp_path):
    config, _ = hf_io.config_from_hf({"architectures": ["LlamaForCausalLM"], "vocab_size": 32, "hidden_size": 16,
                                      "intermediate_size": 24, "num_hidden_layers": 2, "num_attention_heads": 2,
                                      "num_key_value_heads": 1, "tie_word_embeddings": True})
    rng = np.random.default_rng(0)
    shapes = jax.eval_shape(functools.partial(tfm.init_params, config), jax.random.key(0))
    model = tfm.Model(config, jax.tree.map(lambda s: jnp.asarray(rng.standard_normal(s.shape), jnp.float32), shapes))
    good = str(tmp_path / "good")
    hf_io.save_pretrained(model, good)
    cases = [
        (dict(edit_tensors=lambda t: t.pop("model.layers.1.mlp.up_proj.weight")),
         "missing tensor 'model.layers.1.mlp.up_proj.weight'"),
        (dict(edit_tensors=lambda t: t.update({"model.layers.0.self_attn.q_proj.bias": np.zeros(16, np.float32)})),
         "unexpected tensor 'model.layers.0.self_attn.q_proj.bias'"),
        (dict(edit_tensors=lambda t: t.update({"model.norm.weight": np.zeros(17, np.float32)})),
         "tensor 'model.norm.weight' has shape \\(17,\\), expected \\(16,\\)"),
        (dict(edit_tensors=lambda t: t.update({"lm_head.weight": t["model.embed_tokens.weight"] + 1})),
         "'lm_head.weight' differs from 'model.embed_tokens.weight'"),
        (dict(edit_tensors=lambda t: t.update({"model.layers.10.mlp.up_proj.weight": np.zeros(1, np.float32),
                                               "model.layers.x.mlp.up_proj.weight": np.zeros(1, np.float32)})),
         "unexpected tensor 'model.layers.10.mlp.up_proj.weight'"),
        (dict(edit_config=lambda c: c.update(architectures=["MistralForCausalLM"])), "MistralForCausalLM"),
        (dict(edit_config=lambda c: c.update(rope_scaling={"rope_type": "yarn", "factor": 4.0})), "'yarn'"),
        (dict(edit_config=lambda c: c.update(attention_bias=True)), "attention_bias"),
        (dict(edit_config=lambda c: c.update(hidden_act="gelu")), "hidden_act = 'gelu'"),
        (dict(edit_config=lambda c: c.pop("hidden_size")), "hidden_size"),
    ]
    for k, (edit, message) in enumerate(cases):
        with pytest.raises(hf_io.CheckpointError, match=message):
            hf_io.load_pretrained(_rewrite(good, tmp_path / f"case{k}", **edit))
    # a tied checkpoint that also stores the head as an exact copy of the embedding loads
    copy = _rewrite(good, tmp_path / "tied_copy",
                    edit_tensors=lambda t: t.update({"lm_head.weight": t["model.embed_tokens.weight"].copy()}))
    assert np.array_equal(np.asarray(hf_io.load_pretrained(copy).params["embed"]["embedding"]),
                          np.asarray(model.params["embed"]["embedding"]))
    os.remove(os.path.join(good, hf_io.WEIGHTS_FILE))
    with pytest.raises(hf_io.CheckpointError, match="model.safetensors"):
        hf_io.load_pretrained(good)
    with pytest.raises(hf_io.CheckpointError, match="config.json"):
        hf_io.load_pretrained(str(tmp_path / "nowhere"))
    with pytest.raises(hf_io.CheckpointError, match="Qwen2ForCausalLM"):
        hf_io.save_pretrained(model, str(tmp_path / "bad"), architecture="Qwen2ForCausalLM")  # no qkv bias

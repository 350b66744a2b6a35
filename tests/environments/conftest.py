"""Tokenizers for the environment tests: the built-in one and a ByteLevel BPE trained here, offline."""
import pytest

CORPUS = [
    "<think>The player is at (1, 2) and the goal is at (3, 3). I should move Down then Right.</think>",
    "<answer>Left || Down || Right || Up</answer> <answer>Teacher</answer> Trader Explorer",
    "Coordinates: Start: (0, 1) Goal: (3, 2) Player: (2, 2) Holes: (1, 1), (2, 3)\nGrid Map:\nP__G\n_O__\n",
    "Which arm is better? Target: 24, nums: [3, 5, 8, 1] 0123456789 √ ×",
]


@pytest.fixture(scope="session")
def builtin_tokenizer():
    from ragen_jax.models.tokenizer import builtin

    return builtin()


@pytest.fixture(scope="session")
def bpe_tokenizer(tmp_path_factory):
    """A ByteLevel BPE `tokenizer.json` (vocab ~400) trained on a few env-like lines, loaded by our loader."""
    import tokenizers
    from tokenizers import decoders, models, pre_tokenizers, trainers

    from ragen_jax.models.tokenizer import load

    tok = tokenizers.Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=["<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(CORPUS * 20, trainer=trainer)
    path = tmp_path_factory.mktemp("bpe") / "tokenizer.json"
    tok.save(str(path))
    return load(str(path))


@pytest.fixture(scope="session", params=["builtin", "bpe"])
def tokenizer(request):
    """Both tokenizers, for tests that must hold for any vocabulary."""
    return request.getfixturevalue(f"{request.param}_tokenizer")

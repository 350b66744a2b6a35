"""tfds builders (array_record, no TensorFlow): tiny datasets in tmp_path, read back, drawn by envs."""
import json
import sys

import jax
import numpy as np
import pytest
import tensorflow_datasets as tfds

import environments
from environments import arithmetic, countdown
from environments.datasets.generated import (
    ArithmeticConfig, ArithmeticProblems, CountdownConfig, CountdownInstances, load_countdown, load_problems,
)
from environments.datasets.math_jsonl import MathJsonl
from tests.environments.helpers import batched, countdown_sampler, key_seeds, sample_problems, take


def documented_keys(seed, split, size):
    return jax.random.split(jax.random.fold_in(jax.random.key(seed), ["train", "test"].index(split)), size)


def test_no_tensorflow_and_array_record(tmp_path, builtin_tokenizer):
    # the sampling options and train size of test_countdown's reference sampler, so its compile is shared
    config = CountdownConfig(name="tiny", num_train=100, num_test=8, seed=5, operators="+-*/", max_target=100)
    builder = CountdownInstances(config=config, data_dir=str(tmp_path), file_format="array_record")
    builder.download_and_prepare()
    assert "tensorflow" not in sys.modules
    files = [p.name for p in (tmp_path / "countdown_instances" / "tiny" / "1.0.0").iterdir()]
    assert any(".array_record" in f for f in files) and not any("tfrecord" in f for f in files)

    # stored split i == sample_instance(documented key i), in order, read through tfds.data_source
    source = tfds.data_source("countdown_instances/tiny", data_dir=str(tmp_path), split="train")
    assert len(source) == 100
    nums, count, target = jax.device_get(countdown_sampler("+-*/", 100)(documented_keys(5, "train", 100)))
    loaded = load_countdown(str(tmp_path), config="tiny")
    np.testing.assert_array_equal(loaded["nums"], nums)
    np.testing.assert_array_equal(loaded["count"], count)
    np.testing.assert_array_equal(loaded["target"], target)
    np.testing.assert_array_equal(source[3]["nums"], nums[3])
    test = load_countdown(str(tmp_path), split="test", config="tiny")
    assert len(test["target"]) == 8 and not np.array_equal(test["nums"][:8], loaded["nums"][:8])
    for row, c, t in zip(loaded["nums"], loaded["count"], loaded["target"]):
        assert countdown.solve(row[:c].tolist(), int(t)) is not None and 1 <= t <= 100

    # an env built on the dataset draws instance seed mod size
    env, params = environments.make("countdown", builtin_tokenizer, instances=loaded)
    keys = jax.random.split(jax.random.key(9), 10)
    _, state = batched(env).reset(keys, params)
    for i, j in enumerate(np.asarray(key_seeds(keys)) % 100):
        record = source[int(j)]
        want = f"Target: {record['target']}, nums: {record['nums'][: record['count']].tolist()}"
        assert env.render_text(take(state, i)) == want


def test_arithmetic_problems_round_trip(tmp_path):
    # test_arithmetic's batch of 600 problems, so the compiled reference sampler is shared
    config = ArithmeticConfig(name="tiny", num_train=600, num_test=4, seed=2)
    ArithmeticProblems(config=config, data_dir=str(tmp_path), file_format="array_record").download_and_prepare()
    problems = load_problems(str(tmp_path), config="tiny")
    template, numbers, name, item, answer = jax.device_get(sample_problems(documented_keys(2, "train", 600)))
    assert len(problems["question"]) == 600
    for i in range(600):
        assert problems["question"][i] == arithmetic.problem_text(template[i], numbers[i], name[i], item[i])
        assert problems["answer"][i] == str(answer[i])
        assert str(answer[i]) in problems["solution"][i]
    source = tfds.data_source("arithmetic_problems/tiny", data_dir=str(tmp_path), split="test")
    assert len(source) == 4 and set(source[0]) == {"question", "solution", "answer", "template", "numbers"}


METAMATH = [
    {"query": "James has 3 apples and buys 4 more. How many?", "response": "3 + 4 = 7.\nThe answer is: 7"},
    {"query": "What is half of 1/2?", "response": "Half of 1/2 is 1/4. The answer is: \\frac{1}{4}"},
]
GSM8K = [
    {"question": "A farm has 600 cows and 400 sheep. How many animals?",
     "answer": "600 + 400 = <<600+400=1000>>1000 animals.\n#### 1,000"},
]


def write_jsonl(path, records, blank_line=False):
    lines = [json.dumps(r) for r in records]
    if blank_line:
        lines.insert(1, "")
    path.write_text("\n".join(lines) + "\n")


def test_math_jsonl_manual_dir(tmp_path, builtin_tokenizer):
    manual = tmp_path / "manual"
    manual.mkdir()
    write_jsonl(manual / "metamath.jsonl", METAMATH, blank_line=True)
    write_jsonl(manual / "test_gsm8k.jsonl", GSM8K)
    data_dir = str(tmp_path / "data")
    builder = MathJsonl(data_dir=data_dir, file_format="array_record")
    builder.download_and_prepare(download_config=tfds.download.DownloadConfig(manual_dir=str(manual)))
    train = load_problems(data_dir, name="math_jsonl")
    assert train == {
        "question": [r["query"] for r in METAMATH],
        "answer": ["7", "\\frac{1}{4}"],
        "solution": ["3 + 4 = 7.", "Half of 1/2 is 1/4."],
    }
    test = load_problems(data_dir, split="test", name="math_jsonl")
    assert test == {"question": [GSM8K[0]["question"]], "answer": ["1,000"], "solution": ["600 + 400 = 1000 animals."]}

    env, params = environments.make("arithmetic", builtin_tokenizer, problems=train)
    keys = jax.random.split(jax.random.key(4), 6)
    _, state = batched(env).reset(keys, params)
    for i, j in enumerate(np.asarray(key_seeds(keys)) % 2):
        s = take(state, i)
        assert env.render_text(s) == train["question"][j]
        assert env.oracle(s, np.random.default_rng(0)) == (train["solution"][j], train["answer"][j])


@pytest.mark.parametrize("record,message", [
    ({"prompt": "x", "completion": "y"}, "expected keys"),
    ({"query": "x", "response": "no final answer here"}, "no final answer"),
])
def test_math_jsonl_errors_name_the_line(tmp_path, record, message):
    manual = tmp_path / "manual"
    manual.mkdir()
    write_jsonl(manual / "bad.jsonl", [METAMATH[0], record])
    builder = MathJsonl(data_dir=str(tmp_path / "data"), file_format="array_record")
    with pytest.raises(Exception, match=f"bad.jsonl:2: {message}"):
        builder.download_and_prepare(download_config=tfds.download.DownloadConfig(manual_dir=str(manual)))

"""tensorflow-datasets builders for instances made by the environments' own JAX generators.

`CountdownInstances` stores `countdown.sample_instance` draws (nums, count, target);
`ArithmeticProblems` stores `arithmetic.sample_problem` draws with their question, answer and a
worked solution text. Both write array_record files (no TensorFlow) in generation order: example i of
a split is drawn from key `split(fold_in(key(seed), split_id), size)[i]`, so a dataset is a frozen,
shareable copy of what the environment would generate. Configure through the config dataclasses:

    builder = CountdownInstances(config=CountdownConfig(name="ops4", operators="+-*/"), data_dir=d)
    builder.download_and_prepare()
    env, params = environments.make("countdown", tokenizer, instances=load_countdown(d, config="ops4"))
"""
from __future__ import annotations

import dataclasses
import functools

import jax
import numpy as np
import tensorflow_datasets as tfds

from environments import arithmetic, countdown

_CHUNK = 1024  # keys per jitted generator call (the last chunk is padded: one compile per process)
_SPLITS = ("train", "test")


@dataclasses.dataclass(eq=False)
class CountdownConfig(tfds.core.BuilderConfig):
    """Sizes, seed and `countdown.sample_instance` options."""

    num_train: int = 10_000
    num_test: int = 1_000
    seed: int = 0
    counts: tuple[int, ...] = (3, 4)
    min_number: int = 1
    max_number: int = 99
    max_target: int = 999
    operators: str = "+-"


@dataclasses.dataclass(eq=False)
class ArithmeticConfig(tfds.core.BuilderConfig):
    """Sizes and seed of the generated arithmetic problems."""

    num_train: int = 10_000
    num_test: int = 1_000
    seed: int = 0


def _split_keys(seed: int, split: str, size: int):
    return jax.random.split(jax.random.fold_in(jax.random.key(seed), _SPLITS.index(split)), size)


@functools.partial(jax.jit, static_argnames="options")
def _countdown_batch(keys, options: tuple):
    return jax.vmap(lambda k: countdown.sample_instance(k, **dict(options)))(keys)


_arithmetic_batch = jax.jit(jax.vmap(arithmetic.sample_problem))


def _generate(batched, keys):
    """Rows (tuples of numpy values) of the jitted batched generator over `keys`, in order."""
    size = keys.shape[0]
    for start in range(0, size, _CHUNK):
        chunk = keys[start : start + _CHUNK]
        pad = _CHUNK - chunk.shape[0]
        if pad:
            chunk = jax.numpy.concatenate([chunk, jax.numpy.broadcast_to(chunk[:1], (pad,))])
        out = jax.device_get(batched(chunk))
        yield from zip(*(leaf[: _CHUNK - pad] for leaf in out))


def _sizes(config) -> dict[str, int]:
    return {"train": config.num_train, "test": config.num_test}


class CountdownInstances(tfds.core.GeneratorBasedBuilder):
    """Countdown instances from `countdown.sample_instance`."""

    VERSION = tfds.core.Version("1.0.0")
    BUILDER_CONFIGS = [CountdownConfig(name="default", description="3-4 numbers in 1..99, + and - trees")]

    def _info(self):
        n = max(self.builder_config.counts)
        return tfds.core.DatasetInfo(
            builder=self,
            description=self.__doc__,
            features=tfds.features.FeaturesDict({
                "nums": tfds.features.Tensor(shape=(n,), dtype=np.int32),
                "count": tfds.features.Scalar(dtype=np.int32),
                "target": tfds.features.Scalar(dtype=np.int32),
            }),
            disable_shuffling=True,
        )

    def _split_generators(self, dl_manager):
        return {split: self._generate_examples(split, size) for split, size in _sizes(self.builder_config).items()}

    def _generate_examples(self, split, size):
        c = self.builder_config
        options = (("counts", tuple(c.counts)), ("min_number", c.min_number), ("max_number", c.max_number),
                   ("max_target", c.max_target), ("operators", c.operators))
        batched = functools.partial(_countdown_batch, options=options)
        for i, (nums, count, target) in enumerate(_generate(batched, _split_keys(c.seed, split, size))):
            yield i, {"nums": nums, "count": count, "target": target}


class ArithmeticProblems(tfds.core.GeneratorBasedBuilder):
    """Arithmetic word and expression problems from `arithmetic.sample_problem`."""

    VERSION = tfds.core.Version("1.0.0")
    BUILDER_CONFIGS = [ArithmeticConfig(name="default", description="the 12 built-in templates")]

    def _info(self):
        return tfds.core.DatasetInfo(
            builder=self,
            description=self.__doc__,
            features=tfds.features.FeaturesDict({
                "question": tfds.features.Text(),
                "solution": tfds.features.Text(),
                "answer": tfds.features.Text(),
                "template": tfds.features.Scalar(dtype=np.int32),
                "numbers": tfds.features.Tensor(shape=(len(arithmetic.SLOTS),), dtype=np.int32),
            }),
            disable_shuffling=True,
        )

    def _split_generators(self, dl_manager):
        return {split: self._generate_examples(split, size) for split, size in _sizes(self.builder_config).items()}

    def _generate_examples(self, split, size):
        c = self.builder_config
        rng = np.random.default_rng([c.seed, _SPLITS.index(split)])
        rows = _generate(_arithmetic_batch, _split_keys(c.seed, split, size))
        for i, (template, numbers, name, item, _) in enumerate(rows):
            solution, answer = arithmetic.explain(int(template), numbers, rng)
            question = arithmetic.problem_text(template, numbers, name, item)
            yield i, {"question": question, "solution": solution, "answer": answer,
                      "template": template, "numbers": numbers}


def _records(name: str, data_dir: str, split: str, config: str):
    source = tfds.data_source(f"{name}/{config}", data_dir=data_dir, split=split)
    return source.__getitems__(range(len(source)))


def load_countdown(data_dir: str, split: str = "train", config: str = "default") -> dict[str, np.ndarray]:
    """A stored Countdown split as the arrays `Countdown(instances=...)` takes: nums [N, n], count, target."""
    records = _records("countdown_instances", data_dir, split, config)
    return {k: np.stack([r[k] for r in records]).astype(np.int32) for k in ("nums", "count", "target")}


def load_problems(data_dir: str, split: str = "train", config: str = "default", name: str = "arithmetic_problems"):
    """A stored question/answer split (`arithmetic_problems` or `math_jsonl`) as the lists
    `Arithmetic(problems=...)` takes: question, answer, solution."""
    records = _records(name, data_dir, split, config)
    return {k: [r[k].decode("utf-8") for r in records] for k in ("question", "answer", "solution")}

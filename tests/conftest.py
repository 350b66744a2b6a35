"""Shared test set-up: 8 fake CPU devices, set before jax is imported anywhere."""
import os
import sys

# The suite's programs are tiny and mostly compiled once, run a few times: XLA's CPU backend without LLVM
# optimisations and with its older fusion emitters compiles them several times faster and runs them a little slower.
TEST_XLA_FLAGS = ("--xla_force_host_platform_device_count=8 --xla_backend_optimization_level=0 "
                  "--xla_cpu_use_fusion_emitters=false")
os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + TEST_XLA_FLAGS).strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")

# `from tests.environments.helpers import ...` works under plain `pytest` too, not only `python -m pytest`.
REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO_ROOT not in sys.path:
    sys.path.insert(0, REPO_ROOT)

# CI runs a fixed example sequence so a run is reproducible; `HYPOTHESIS_PROFILE=explore` draws fresh examples.
from hypothesis import settings  # noqa: E402

settings.register_profile("ci", derandomize=True, print_blob=True)
settings.register_profile("explore", derandomize=False, print_blob=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

# One compilation cache per test run: the loop and sweep tests build identical programs in separate `train()`
# calls (a resumed run recompiles what the uninterrupted one compiled), and test files on different xdist workers
# build the same rollout; with the cache each compiles once. The first process (xdist's controller) makes the folder
# and removes it at exit; the workers it starts inherit the variable. JAX recompiles, with a warning, if it reads an
# entry another worker is still writing.
import atexit  # noqa: E402
import shutil  # noqa: E402
import tempfile  # noqa: E402

import jax  # noqa: E402
import pytest  # noqa: E402

_CACHE_VARIABLE = "RAGEN_JAX_TEST_XLA_CACHE"
if _CACHE_VARIABLE not in os.environ:
    os.environ[_CACHE_VARIABLE] = tempfile.mkdtemp(prefix="ragen-jax-test-xla-cache-")
    atexit.register(shutil.rmtree, os.environ[_CACHE_VARIABLE], ignore_errors=True)
_CACHE_DIR = os.environ[_CACHE_VARIABLE]
jax.config.update("jax_compilation_cache_dir", _CACHE_DIR)
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.5)
jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)

# Scheduling (`make test` runs two xdist workers, one whole file at a time): xdist would hand out the files with the
# most tests first, which leaves the few-test, compile-heavy training files (minutes each) for the end, where one
# worker runs them while the other idles. The heaviest files go first instead, in this order (rough cost from
# `--durations`), then every other file in collection order.
HEAVY_FILES = ("train/test_loop.py", "train/test_step.py", "train/test_sweep.py", "train/test_preemption.py",
               "train/test_learning.py", "models/test_gguf.py", "train/test_sft.py", "rollout/test_rollout.py",
               "environments/test_fuzz.py",
               "train/test_batch.py", "train/test_validation.py", "train/test_chunked_scoring.py")


@pytest.fixture(autouse=True, scope="module")
def fresh_jax_caches():
    """Each test file starts with empty in-memory JAX caches, as when run alone. A worker that has run other files
    has filled JAX's LRU trace caches; they then evict mid-trace and a big program lowers with some nested functions
    duplicated: a different module, which misses the compilation cache above and compiles again (e.g. the resumed
    sweep's validator, the workdir run's step in train/test_loop.py). Compiled programs stay in the persistent
    cache."""
    jax.clear_caches()


def pytest_configure(config):
    if hasattr(config.option, "loadscopereorder"):  # xdist's "files with more tests first"
        config.option.loadscopereorder = False


def pytest_collection_modifyitems(config, items):
    def rank(item):
        path = os.path.relpath(str(item.path), os.path.join(REPO_ROOT, "tests")).replace(os.sep, "/")
        return HEAVY_FILES.index(path) if path in HEAVY_FILES else len(HEAVY_FILES)

    items.sort(key=rank)  # stable: a file's tests keep their order

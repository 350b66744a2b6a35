"""One process of the two-process run in tests/train/test_loop.py (not collected: no test_ prefix).

    RAGEN_COORDINATOR=127.0.0.1:PORT RAGEN_NUM_PROCESSES=2 RAGEN_PROCESS_ID=i python multihost_worker.py RUN_DIR JSON

JSON holds the config overrides; the process trains with one CPU device of its own and prints its metrics rows as
one JSON line prefixed `HISTORY `.
"""
import json
import os
import sys

os.environ["JAX_PLATFORMS"] = "cpu"
os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=1"
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from ragen_jax import distributed  # noqa: E402

distributed.initialize()

from ragen_jax.train.loop import train  # noqa: E402
from tests.train.test_loop import config_for  # noqa: E402

if __name__ == "__main__":
    run_dir, overrides = sys.argv[1], json.loads(sys.argv[2])
    _, history = train(config_for(run_dir, **overrides), log=print)
    print("HISTORY " + json.dumps(history), flush=True)

"""Environment throughput: our JAX envs (vmapped, jitted, render + parse included) vs the Python peers.

    .venv/bin/python experiments/benchmarks/envs.py [--quick] [--num-envs 4096]

Ours: `jax.jit(jax.vmap(env.step))` over `num_envs` environments, each step parsing its own copy of a
fixed valid response ("<think>...</think><answer>Down</answer>", one action, about 25 tokens) and
rendering the next observation to tokens (built-in tokenizer); resets likewise (Sokoban's include the
in-graph level generation).
A vmapped step costs the same whether an env is done or not, so done envs are not reset in the loop.

Peers, one env in a Python loop, with a text render of the same information per step/reset:
* FrozenLake: gymnasium `FrozenLake-v1` (4x4, slippery off), a RAGEN-style coordinate + grid text render;
  reset = RAGEN's pattern: a new random map (`generate_random_map`, p=0.9), a new env, reset, render.
* Sokoban: the `gym-sokoban` package (6x6, 1 box), `step(a, observation_mode="tiny_rgb_array")` (its
  cheapest mandatory image) + text render; reset = its room generation + text render. Also timed: its
  step without the image (`_push` + `_calc_reward` + `_check_if_done`), the faster peer is the one
  the ratio uses.

Also timed: the peers with RAGEN's host-side parse of the same response (decode + regex + name lookup,
docs/prompts_and_parsing.md#response-parsing) and ours with the parse hoisted out, so three step ratios: as specified
(ours parse, peers do not), both parsing, neither parsing. Prints one JSON line with steps/s, resets/s and ratios
(ours / peer).
"""
from __future__ import annotations

import argparse
import json
import platform
import time
import warnings

import jax
import jax.numpy as jnp
import numpy as np

import environments
from experiments.benchmarks._peers import frozen_lake_text, ragen_parse, sokoban_step, sokoban_text
from ragen_jax.models.tokenizer import builtin

GOALS = {  # ours / peer, as specified: ours parse, the peers do not (benchmarks/_goals.py)
    "sokoban.reset_ratio": 100.0, "sokoban.step_ratio": 100.0, "frozen_lake.reset_ratio": 100.0,
    "frozen_lake.step_ratio": 100.0,
}
RESPONSES = {  # one action each, so one of our steps does the work of one peer step (+ parsing)
    "frozen_lake": "<think>The goal is below me and to the right, so I go down first.</think><answer>Down</answer>",
    "sokoban": "<think>The box is above me and its target above it, so I push it up.</think><answer>Up</answer>",
}


def _rate(fn, count: int, min_seconds: float, min_calls: int = 3) -> float:
    """Items per second of `fn()` (which handles `count` items and blocks), after one warm-up call."""
    fn()
    calls, start = 0, time.perf_counter()
    while calls < min_calls or time.perf_counter() - start < min_seconds:
        fn()
        calls += 1
    return count * calls / (time.perf_counter() - start)


def bench_ours(name: str, num_envs: int, min_seconds: float) -> dict:
    tokenizer = builtin()
    env, params = environments.make(name, tokenizer)
    reset = jax.jit(jax.vmap(env.reset, in_axes=(0, None)))
    step = jax.jit(jax.vmap(env.step, in_axes=(0, 0, 0, 0, None)))
    ids = tokenizer.encode(RESPONSES[name])
    # one row per env (a real array, so every env parses its own response)
    tokens = jnp.asarray(np.tile(np.asarray(ids, np.int32), (num_envs, 1)))
    length = jnp.full((num_envs,), len(ids), jnp.int32)
    keys = jax.random.split(jax.random.key(0), num_envs)
    compile_start = time.perf_counter()
    _, state = jax.block_until_ready(reset(keys, params))
    jax.block_until_ready(step(keys, state, tokens, length, params))
    compile_s = time.perf_counter() - compile_start
    holder = {"state": state, "i": 0}

    def do_step():
        holder["i"] += 1
        out = step(jax.random.split(jax.random.key(holder["i"]), num_envs), holder["state"], tokens, length, params)
        holder["state"] = jax.block_until_ready(out[1])

    # the same turn with the parse hoisted out (one parsed response shared): env transition + render only
    parsed = jax.tree.map(lambda x: x[0], jax.vmap(env.parse)(tokens[:1], length[:1]))

    def turn_without_parse(key, s):
        new_env = env._run_actions(key, s, parsed, params)[0]
        return env.render(new_env), s.replace(env=new_env)

    no_parse = jax.jit(jax.vmap(turn_without_parse))
    jax.block_until_ready(no_parse(keys, state))

    def do_step_without_parse():
        holder["i"] += 1
        out = no_parse(jax.random.split(jax.random.key(holder["i"]), num_envs), holder["state"])
        holder["state"] = jax.block_until_ready(out[1])

    def do_reset():
        holder["i"] += 1
        jax.block_until_ready(reset(jax.random.split(jax.random.key(holder["i"]), num_envs), params))

    return {
        "steps_per_s": _rate(do_step, num_envs, min_seconds),
        "steps_per_s_without_parse": _rate(do_step_without_parse, num_envs, min_seconds),
        "resets_per_s": _rate(do_reset, num_envs, min_seconds),
        "compile_s": compile_s,
        "response_tokens": len(ids),
        "obs_capacity": env.obs_capacity,
    }


# ----------------------------------------------------------------------------- FrozenLake peer
def bench_frozen_lake_peer(min_seconds: float) -> dict:
    import gymnasium
    from gymnasium.envs.toy_text.frozen_lake import FrozenLakeEnv, generate_random_map

    rng = np.random.default_rng(0)
    env = FrozenLakeEnv(desc=generate_random_map(size=4, p=0.9, seed=0), is_slippery=False)
    env.reset(seed=0)

    def one_step():
        _, _, terminated, truncated, _ = env.step(int(rng.integers(4)))
        frozen_lake_text(env.desc, int(env.s))
        if terminated or truncated:
            env.reset()

    tokenizer = builtin()
    ids = tokenizer.encode(RESPONSES["frozen_lake"])
    lookup = {"left": 0, "down": 1, "right": 2, "up": 3}

    def one_step_with_parse():
        for action in ragen_parse(tokenizer, ids, lookup):
            _, _, terminated, truncated, _ = env.step(action)
        frozen_lake_text(env.desc, int(env.s))
        if terminated or truncated:
            env.reset()

    seeds = iter(range(10**9))

    def one_reset():
        fresh = FrozenLakeEnv(desc=generate_random_map(size=4, p=0.9, seed=next(seeds)), is_slippery=False)
        fresh.reset(seed=0)
        frozen_lake_text(fresh.desc, int(fresh.s))

    return {"steps_per_s": _rate(one_step, 1, min_seconds, 100),
            "steps_per_s_with_parse": _rate(one_step_with_parse, 1, min_seconds, 100),
            "resets_per_s": _rate(one_reset, 1, min_seconds, 20), "package": f"gymnasium=={gymnasium.__version__}"}


# ----------------------------------------------------------------------------- Sokoban peer
def bench_sokoban_peer(min_seconds: float) -> dict:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from gym_sokoban.envs.sokoban_env import SokobanEnv  # (its package needs setuptools' pkg_resources)
    import importlib.metadata as md

    rng = np.random.default_rng(0)
    env = SokobanEnv(dim_room=(6, 6), num_boxes=1, max_steps=100)
    env.reset(render_mode="tiny_rgb_array")

    def one_step():
        _, _, done, _ = env.step(int(rng.integers(1, 5)), observation_mode="tiny_rgb_array")
        sokoban_text(env.room_state, env.room_fixed)
        if done:
            env.reset(render_mode="tiny_rgb_array")

    def one_step_no_image():
        _, done = sokoban_step(env, int(rng.integers(1, 5)))
        sokoban_text(env.room_state, env.room_fixed)
        if done:
            env.reset(render_mode="tiny_rgb_array")

    tokenizer = builtin()
    ids = tokenizer.encode(RESPONSES["sokoban"])
    lookup = {"up": 1, "down": 2, "left": 3, "right": 4}

    def one_step_with_parse():
        for action in ragen_parse(tokenizer, ids, lookup):
            _, done = sokoban_step(env, action)
        sokoban_text(env.room_state, env.room_fixed)
        if done:
            env.reset(render_mode="tiny_rgb_array")

    def one_reset():
        env.reset(render_mode="tiny_rgb_array")
        sokoban_text(env.room_state, env.room_fixed)

    with_image = _rate(one_step, 1, min_seconds, 100)
    no_image = _rate(one_step_no_image, 1, min_seconds, 100)
    return {"steps_per_s": max(with_image, no_image), "steps_per_s_with_image": with_image,
            "steps_per_s_no_image": no_image, "steps_per_s_with_parse": _rate(one_step_with_parse, 1, min_seconds, 100),
            "resets_per_s": _rate(one_reset, 1, min_seconds, 5),
            "package": f"gym-sokoban=={md.version('gym-sokoban')}, gym=={md.version('gym')}"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="512 envs, short timings")
    parser.add_argument("--num-envs", type=int, default=4096)
    args = parser.parse_args()
    num_envs = 512 if args.quick else args.num_envs
    seconds = 0.5 if args.quick else 3.0
    result = {"benchmark": "envs", "num_envs": num_envs, "device": jax.devices()[0].device_kind,
              "cpu": platform.processor() or platform.machine(), "jax": jax.__version__}
    peers = {"frozen_lake": bench_frozen_lake_peer}
    if "sokoban" in environments.registered():
        peers["sokoban"] = bench_sokoban_peer
    else:
        result["sokoban"] = {"skipped": "no 'sokoban' environment registered"}
    for name, peer_fn in peers.items():
        ours, peer = bench_ours(name, num_envs, seconds), peer_fn(seconds)
        result[name] = {
            "ours": ours,
            "peer": peer,
            "step_ratio": ours["steps_per_s"] / peer["steps_per_s"],
            "step_ratio_both_parsing": ours["steps_per_s"] / peer["steps_per_s_with_parse"],
            "step_ratio_neither_parsing": ours["steps_per_s_without_parse"] / peer["steps_per_s"],
            "reset_ratio": ours["resets_per_s"] / peer["resets_per_s"],
        }
    print(json.dumps(result))


if __name__ == "__main__":
    main()

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
import re
import time
import warnings

import jax
import jax.numpy as jnp
import numpy as np

import environments
from ragen_jax.models.tokenizer import builtin

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


# ----------------------------------------------------------------------------- RAGEN's host-side parse
_PATTERN = re.compile(r"<think>(.*?)</think>\s*<answer>(.*?)</answer>", re.DOTALL)
_SPECIAL = re.compile(r"<think>|</think>|<answer>|</answer>|<\|im_start\|>|<\|im_end\|>")


def ragen_parse(tokenizer, ids, lookup: dict[str, int], max_actions: int = 2) -> list[int]:
    """What RAGEN does per env and turn on the host (docs/prompts_and_parsing.md): decode, regex, split, map names."""
    match = _PATTERN.search(tokenizer.decode(ids))
    if match is None:
        return []
    parts = [a.strip() for a in _SPECIAL.sub("", match.group(2)).split("||") if a.strip()][:max_actions]
    return [lookup[a.lower()] for a in parts if a.lower() in lookup]


# ----------------------------------------------------------------------------- FrozenLake peer
def _frozen_lake_text(desc: np.ndarray, pos: int) -> str:
    size = desc.shape[0]
    xy = lambda i: f"({i // size}, {i % size})"
    flat = desc.reshape(-1)
    lines = [f"Board size: {size} rows x {size} cols (zero-indexed).",
             f"Start: {xy(int(np.flatnonzero(flat == b'S')[0]))}", f"Goal: {xy(int(np.flatnonzero(flat == b'G')[0]))}"]
    tile = flat[pos]
    label = "Player on goal" if tile == b"G" else "Player in hole" if tile == b"H" else "Player"
    lines.append(f"{label}: {xy(pos)}")
    holes = np.flatnonzero(flat == b"H")
    if holes.size:
        lines.append("Holes: " + ", ".join(xy(int(i)) for i in holes))
    symbols = {b"S": "_", b"F": "_", b"H": "O", b"G": "G"}
    grid = [[symbols[t] for t in row] for row in desc]
    r, c = divmod(pos, size)
    grid[r][c] = "√" if tile == b"G" else "X" if tile == b"H" else "P"
    return "Coordinates: \n" + "\n".join(lines) + "\nGrid Map: \n" + "\n".join("".join(row) for row in grid)


def bench_frozen_lake_peer(min_seconds: float) -> dict:
    import gymnasium
    from gymnasium.envs.toy_text.frozen_lake import FrozenLakeEnv, generate_random_map

    rng = np.random.default_rng(0)
    env = FrozenLakeEnv(desc=generate_random_map(size=4, p=0.9, seed=0), is_slippery=False)
    env.reset(seed=0)

    def one_step():
        _, _, terminated, truncated, _ = env.step(int(rng.integers(4)))
        _frozen_lake_text(env.desc, int(env.s))
        if terminated or truncated:
            env.reset()

    tokenizer = builtin()
    ids = tokenizer.encode(RESPONSES["frozen_lake"])
    lookup = {"left": 0, "down": 1, "right": 2, "up": 3}

    def one_step_with_parse():
        for action in ragen_parse(tokenizer, ids, lookup):
            _, _, terminated, truncated, _ = env.step(action)
        _frozen_lake_text(env.desc, int(env.s))
        if terminated or truncated:
            env.reset()

    seeds = iter(range(10**9))

    def one_reset():
        fresh = FrozenLakeEnv(desc=generate_random_map(size=4, p=0.9, seed=next(seeds)), is_slippery=False)
        fresh.reset(seed=0)
        _frozen_lake_text(fresh.desc, int(fresh.s))

    return {"steps_per_s": _rate(one_step, 1, min_seconds, 100),
            "steps_per_s_with_parse": _rate(one_step_with_parse, 1, min_seconds, 100),
            "resets_per_s": _rate(one_reset, 1, min_seconds, 20), "package": f"gymnasium=={gymnasium.__version__}"}


# ----------------------------------------------------------------------------- Sokoban peer
_SOKOBAN_SYMBOLS = {0: "#", 1: "_", 2: "O", 3: "√", 4: "X", 5: "P", 6: "S"}


def _sokoban_text(room_state: np.ndarray, room_fixed: np.ndarray) -> str:
    """RAGEN-style coordinates + grid text of a gym-sokoban room."""
    state = room_state.copy()
    state[(state == 5) & (room_fixed == 2)] = 6  # player on target
    xy = lambda cells: ", ".join(f"({int(r)}, {int(c)})" for r, c in cells)
    lines = [f"Board size: {state.shape[0]} rows x {state.shape[1]} cols (zero-indexed)."]
    for label, codes in (("Targets", (2,)), ("Boxes", (4,)), ("Boxes on target", (3,)), ("Player", (5,)),
                         ("Player on target", (6,))):
        cells = np.argwhere(np.isin(state, codes))
        if cells.size:
            lines.append(f"{label}: {xy(cells)}")
    grid = "\n".join("".join(_SOKOBAN_SYMBOLS[int(v)] for v in row) for row in state)
    return "Coordinates: \n" + "\n".join(lines) + "\nGrid Map: \n" + grid


def bench_sokoban_peer(min_seconds: float) -> dict:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import gym_sokoban  # noqa: F401  (registers; needs setuptools' pkg_resources)
        from gym_sokoban.envs.sokoban_env import SokobanEnv
    import importlib.metadata as md

    rng = np.random.default_rng(0)
    env = SokobanEnv(dim_room=(6, 6), num_boxes=1, max_steps=100)
    env.reset(render_mode="tiny_rgb_array")

    def one_step():
        _, _, done, _ = env.step(int(rng.integers(1, 5)), observation_mode="tiny_rgb_array")
        _sokoban_text(env.room_state, env.room_fixed)
        if done:
            env.reset(render_mode="tiny_rgb_array")

    def one_step_no_image():
        env.num_env_steps += 1
        env._push(int(rng.integers(1, 5)))
        env._calc_reward()
        done = env._check_if_done()
        _sokoban_text(env.room_state, env.room_fixed)
        if done:
            env.reset(render_mode="tiny_rgb_array")

    tokenizer = builtin()
    ids = tokenizer.encode(RESPONSES["sokoban"])
    lookup = {"up": 1, "down": 2, "left": 3, "right": 4}

    def one_step_with_parse():
        for action in ragen_parse(tokenizer, ids, lookup):
            env.num_env_steps += 1
            env._push(action)
            env._calc_reward()
            done = env._check_if_done()
        _sokoban_text(env.room_state, env.room_fixed)
        if done:
            env.reset(render_mode="tiny_rgb_array")

    def one_reset():
        env.reset(render_mode="tiny_rgb_array")
        _sokoban_text(env.room_state, env.room_fixed)

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

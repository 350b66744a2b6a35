"""End-to-end multi-turn rollout: our compiled rollout vs the usual Python loop (transformers `generate` per turn and a
gymnasium / gym-sokoban env loop), same model, same levels, same geometry.

    .venv/bin/python -m experiments.benchmarks.rollout_e2e [--quick] [--repeats 3] [--envs frozen_lake,sokoban]

Model: the env's shipped warm start (`configs/warm_starts/{env}_tiny`: a Llama-style decoder, d_model 64, 2 layers,
vocabulary 511, the built-in tokenizer and plain chat format, float32), read by both sides from the same folder: ours
by `ragen_jax.models.hf.load_pretrained`, the peer by transformers' `AutoModelForCausalLM.from_pretrained` (torch on
the CPU, on one thread or all cores, whichever a short `generate` before the timings finds faster: on a loaded machine
all cores can be several times slower). Its answers parse, so episodes end after different numbers of turns, as in
training.

Geometry, both sides: `num_groups` x `group_size` trajectories (8 x 16; --quick 2 x 4), the members of a group on the
same level; up to `max_turn` turns (5; --quick 3) of at most `response_length` = 56 sampled tokens (the warm starts'),
temperature 1, top-p 1, no top-k, a turn ending at the end-of-turn token; the envs' default action budget (RAGEN's: 2
parsed actions per turn, 10 per trajectory); FrozenLake 4 x 4 with the goal anywhere and no slipping, Sokoban 6 x 6
with one box. A trajectory stops when its episode ends, or when its next turn would not fit in `max_len` tokens (the
system prompt and `max_turn` turns of the longest observation and response).

Ours: `ragen_jax.rollout.rollout.Rollout` under `jax.jit`, lowered and compiled ahead of time (`compile_s`, not in the
timings): the resets, then per turn the in-graph prompt chunk, sampling on one KV cache kept across turns, the in-graph
parse and env step, all in one call. On the CPU its attention is the fused kernel of `ragen_jax.models.cpu_kernels`
(built, if it was not already, while compiling).
Peer, RAGEN's host loop with transformers: per trajectory a gymnasium `FrozenLakeEnv(is_slippery=False)` or a
gym-sokoban `SokobanEnv` set to the same level as ours (so both sides play the same levels; converting the levels is
not timed), then per turn, for the trajectories still running: the whole conversation rendered as chat text
(`ChatFormat.render` of `prompts.system_content`, `prompts.user_content` and the decoded earlier responses: our
prompt's text) and tokenized, the batch left-padded, `model.generate` (so every turn prefills the whole history), the
responses decoded, RAGEN's regex parse (`_peers.ragen_parse`), each action stepped in Python (Sokoban without its
image render, `_peers.sokoban_step`) and the observation rendered as text (`_peers`, checked equal to our
`render_text` on every level before it is timed).

Timing: each side runs once untimed (warm-up), then `repeats` rounds run ours, then the peer, each round on a fresh
batch of levels (the same levels for both sides). Each side's figures are over all its timed rounds: trajectories/s =
trajectories / seconds, generated tokens/s = sampled tokens (stop tokens included) / seconds, success = the share of
trajectories that succeeded; the ratios are ours / peer, so both sides are measured on the same levels. `fastest`
gives each side's fastest round as well; the fastest rounds of the two sides may have played different levels (a
round whose episodes end sooner is cheaper), which is why the ratios do not use them.
The peer's seconds are split into generate, prompt (render + tokenize) and env (the rest: env construction,
decode, parse, steps, observation renders). Prints one JSON line.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import torch
import transformers

import environments
from configs import frozen_lake, sokoban
from environments.sokoban import dynamics
from experiments.benchmarks._goals import goals_met
from experiments.benchmarks._peers import frozen_lake_text, ragen_parse, sokoban_step, sokoban_text
from ragen_jax.models import chat as chat_lib
from ragen_jax.models import hf, transformer
from ragen_jax.models.tokenizer import builtin
from ragen_jax.rollout import prompts as prompts_lib
from ragen_jax.rollout.rollout import Rollout

GOALS = {  # figure -> minimum (issue #11: at least 5x on this CPU)
    "frozen_lake.trajectories_ratio": 5.0, "frozen_lake.tokens_ratio": 5.0,
    "sokoban.trajectories_ratio": 5.0, "sokoban.tokens_ratio": 5.0,
}
WARM_STARTS = {"frozen_lake": frozen_lake.WARM_START, "sokoban": sokoban.WARM_START}
RESPONSE = 56  # new tokens per turn, the warm starts' (configs/{env}.py:tiny)
CALIBRATION_TOKENS = 8  # new tokens of the peer's thread-count calibration
GEOMETRY = {False: {"num_groups": 8, "group_size": 16, "max_turn": 5},
            True: {"num_groups": 2, "group_size": 4, "max_turn": 3}}  # keyed by --quick


class FrozenLakePeer:
    """gymnasium's FrozenLake on our levels; its actions 0..3 are our action words' order (Left, Down, Right, Up)."""

    offset = 0

    def __init__(self):
        import gymnasium
        from gymnasium.envs.toy_text.frozen_lake import FrozenLakeEnv

        self.env_class, self.package = FrozenLakeEnv, f"gymnasium=={gymnasium.__version__}"

    def levels(self, env, states) -> list[list[str]]:
        """gymnasium `desc` rows (S start, G goal, H hole, F frozen) of a batch of our initial states."""
        s = jax.tree.map(np.asarray, jax.device_get(states.env))
        out = []
        for holes, start, goal in zip(s.holes, s.start, s.goal):
            tiles = np.where(holes, "H", "F")
            tiles[start], tiles[goal] = "S", "G"
            out.append(["".join(row) for row in tiles.reshape(env.size, env.size)])
        return out

    def load(self, level):
        gym_env = self.env_class(desc=level, is_slippery=False)
        gym_env.reset(seed=0)
        return gym_env

    def step(self, gym_env, action: int) -> tuple[float, bool]:
        _, reward, terminated, _, _ = gym_env.step(action)
        return float(reward), terminated

    def text(self, gym_env) -> str:
        return frozen_lake_text(gym_env.desc, int(gym_env.s))

    def success(self, gym_env) -> bool:
        return gym_env.desc.reshape(-1)[gym_env.s] == b"G"


class SokobanPeer:
    """gym-sokoban's SokobanEnv set to our levels; its push actions 1..4 are our action words' order + 1."""

    offset = 1

    def __init__(self):
        import importlib.metadata as md

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            from gym_sokoban.envs.sokoban_env import SokobanEnv  # (its package needs setuptools' pkg_resources)
        self.env_class = SokobanEnv
        self.package = f"gym-sokoban=={md.version('gym-sokoban')}, gym=={md.version('gym')}"

    def levels(self, env, states) -> list[tuple[np.ndarray, np.ndarray, int]]:
        """(room_state, room_fixed, max_steps) in gym-sokoban's codes of a batch of our initial states."""
        codes = np.asarray(jax.vmap(dynamics.room_codes)(states.env.room))
        room_state = np.where(codes == dynamics.CODE_PLAYER_ON_TARGET, dynamics.CODE_PLAYER, codes)
        fixed = np.asarray(states.env.room.fixed)
        return [(room_state[i], fixed[i], int(env.default_params.max_steps)) for i in range(len(codes))]

    def load(self, level):
        room_state, room_fixed, max_steps = level
        gym_env = self.env_class(dim_room=room_fixed.shape, max_steps=max_steps,
                                 num_boxes=int((room_fixed == dynamics.TARGET).sum()), reset=False)
        gym_env.room_fixed, gym_env.room_state = room_fixed.copy(), room_state.copy()
        gym_env.player_position = np.argwhere(room_state == dynamics.CODE_PLAYER)[0]
        gym_env.num_env_steps, gym_env.reward_last = 0, 0
        gym_env.boxes_on_target = int((room_state == dynamics.CODE_BOX_ON_TARGET).sum())
        return gym_env

    def step(self, gym_env, action: int) -> tuple[float, bool]:
        return sokoban_step(gym_env, action)

    def text(self, gym_env) -> str:
        return sokoban_text(gym_env.room_state, gym_env.room_fixed)

    def success(self, gym_env) -> bool:
        return gym_env._check_if_all_boxes_on_target()


PEERS = {"frozen_lake": FrozenLakePeer, "sokoban": SokobanPeer}


@dataclasses.dataclass
class PeerTrajectory:
    """One trajectory of the peer loop: its gym env, chat messages and budget (as our `TurnCarry` row holds them)."""

    env: object
    messages: list
    actions_left: int
    obs: str
    reward: float | None = None  # the last turn's (None before the first)
    warn: bool = False
    done: bool = False
    cut: bool = False
    turns: int = 0


class Setup:
    """Both sides of one env: the model read from the warm start, our compiled rollout, the peer's env and model.

    name: "frozen_lake" | "sokoban"; geometry: GEOMETRY[quick]. `ours(key)` and `peer(levels, seed)` each run one
    batch of B = num_groups * group_size trajectories and return {seconds, tokens, turns, success} (peer: + split).
    """

    def __init__(self, name: str, geometry: dict):
        self.tokenizer, self.chat_format = builtin(), chat_lib.plain()
        self.env, self.env_params = environments.make(name, self.tokenizer)
        self.geometry = geometry
        turn_prompts = prompts_lib.TurnPrompts(self.tokenizer, self.chat_format, self.env.instruction,
                                               geometry["max_turn"], self.env.max_actions_per_traj, RESPONSE,
                                               self.env.enable_think)
        self.max_len = (len(turn_prompts.system_ids) + geometry["max_turn"] * (
            turn_prompts.chunk_capacity(self.env.obs_capacity) + RESPONSE) + len(turn_prompts.close_ids))
        self.prefill_ids = turn_prompts.prefill_ids.tolist()
        self.close_len = len(turn_prompts.close_ids)
        model = hf.load_pretrained(WARM_STARTS[name])
        model_config = dataclasses.replace(model.config, max_seq_len=max(model.config.max_seq_len, self.max_len))
        self.params = model.params
        self.rollout = Rollout(self.env, self.tokenizer, self.chat_format, transformer.DecoderLM(model_config),
                               num_groups=geometry["num_groups"], group_size=geometry["group_size"],
                               max_turn=geometry["max_turn"], response_length=RESPONSE, max_len=self.max_len)
        self.first_prompts = jax.jit(lambda key: self.rollout.first_prompts(key, self.env_params))
        one = jnp.float32(1.0)
        start = time.perf_counter()
        self.compiled = jax.jit(self.rollout).lower(self.params, jax.random.key(0), self.env_params, one, one).compile()
        self.compile_s = time.perf_counter() - start
        self.peer_env = PEERS[name]()
        self.hf_model = transformers.AutoModelForCausalLM.from_pretrained(WARM_STARTS[name], dtype=torch.float32).eval()
        self.hf_model.config.max_position_embeddings = model_config.max_seq_len  # as ours (RoPE has no table)
        self.lookup = {w.lower(): i + self.peer_env.offset for i, w in enumerate(self.env.action_words)}

    def levels(self, key: jax.Array) -> list:
        """The peer's levels of the batch that `ours(key)` plays, after checking that the peer renders each one as
        our env does (untimed)."""
        states = self.first_prompts(key)[2]
        levels = self.peer_env.levels(self.env, states)
        for i, (ours, level) in enumerate(zip(self.env.render_texts(states), levels)):
            theirs = self.peer_env.text(self.peer_env.load(level))
            if theirs != ours:
                raise AssertionError(f"the peer renders level {i} as\n{theirs}\nbut our env as\n{ours}")
        return levels

    def ours(self, key: jax.Array) -> dict:
        one = jnp.float32(1.0)
        start = time.perf_counter()
        traj = jax.block_until_ready(self.compiled(self.params, key, self.env_params, one, one))
        seconds = time.perf_counter() - start
        return {"seconds": seconds, "tokens": int(traj.sampled.sum()), "turns": int(traj.turn_taken.sum()),
                "success": float(traj.success.mean())}

    def peer(self, levels: list, seed: int) -> dict:
        """The usual loop (module docstring) over `levels`; the clock runs from the first env built to the last step."""
        torch.manual_seed(seed)
        tok, fmt, n = self.tokenizer, self.chat_format, RESPONSE
        prefill = chat_lib.prefill(self.env.enable_think)
        split = {"generate_s": 0.0, "prompt_s": 0.0}
        tokens = 0
        start = time.perf_counter()
        system = ("system", prompts_lib.system_content(self.env.instruction))
        trajs = []
        for level in levels:
            gym_env = self.peer_env.load(level)
            trajs.append(PeerTrajectory(gym_env, [system], self.env.max_actions_per_traj, self.peer_env.text(gym_env)))
        for t in range(self.geometry["max_turn"]):
            tick = time.perf_counter()
            rows, ids = [], []
            for traj in trajs:
                if traj.done or traj.cut:
                    continue
                traj.messages.append(("user", prompts_lib.user_content(
                    t + 1, traj.obs, traj.actions_left, n, self.env.enable_think, traj.warn, traj.reward)))
                prompt = tok.encode(fmt.render(traj.messages, add_generation_prompt=True, prefill=prefill))
                if len(prompt) + n + self.close_len > self.max_len:
                    traj.cut = True
                    continue
                rows.append(traj)
                ids.append(prompt)
            split["prompt_s"] += time.perf_counter() - tick
            if not rows:
                break
            tick = time.perf_counter()
            new = self._generate(ids)
            split["generate_s"] += time.perf_counter() - tick
            for traj, row in zip(rows, new):
                stopped = tok.eos_id in row
                length = row.index(tok.eos_id) + 1 if stopped else len(row)
                response = self.prefill_ids + row[:length]
                tokens += length
                traj.messages.append(("assistant", tok.decode(response[:-1] if stopped else response)))
                self._step(traj, ragen_parse(tok, response, self.lookup, self.env.max_actions_per_turn))
        seconds = time.perf_counter() - start
        return {"seconds": seconds, "tokens": tokens, "turns": sum(traj.turns for traj in trajs),
                "success": float(np.mean([self.peer_env.success(traj.env) for traj in trajs])), **split,
                "env_s": seconds - split["generate_s"] - split["prompt_s"]}

    def torch_threads(self, key: jax.Array) -> tuple[int, dict]:
        """The peer's faster torch thread count, 1 or all cores, and the seconds of each: the best of two interleaved
        `generate` calls of `CALIBRATION_TOKENS` on the batch's first prompts. On a loaded machine all cores can be
        several times slower than one (torch's threads wait on each other), so the peer gets the faster."""
        tokens, length, _ = jax.device_get(self.first_prompts(key))
        ids = [row[:n].tolist() for row, n in zip(tokens, length)]
        seconds = {}
        for threads in (1, os.cpu_count(), 1, os.cpu_count()):
            torch.set_num_threads(threads)
            start = time.perf_counter()
            self._generate(ids, CALIBRATION_TOKENS)
            seconds[threads] = min(seconds.get(threads, float("inf")), time.perf_counter() - start)
        best = min(seconds, key=seconds.get)
        torch.set_num_threads(best)
        return best, {str(k): round(v, 3) for k, v in seconds.items()}

    def _generate(self, ids: list[list[int]], new_tokens: int = RESPONSE) -> list[list[int]]:
        """transformers `generate` on the left-padded prompts: each row's new tokens (pad after its stop token)."""
        width = max(len(x) for x in ids)
        batch = torch.full((len(ids), width), self.tokenizer.pad_id, dtype=torch.long)
        mask = torch.zeros((len(ids), width), dtype=torch.long)
        for i, x in enumerate(ids):
            batch[i, width - len(x):] = torch.tensor(x, dtype=torch.long)
            mask[i, width - len(x):] = 1
        with torch.inference_mode():
            out = self.hf_model.generate(batch, attention_mask=mask, do_sample=True, temperature=1.0, top_k=0,
                                         top_p=1.0, max_new_tokens=new_tokens, eos_token_id=self.tokenizer.eos_id,
                                         pad_token_id=self.tokenizer.pad_id)
        return out[:, width:].tolist()

    def _step(self, traj: PeerTrajectory, actions: list[int]) -> None:
        """One turn's actions on the gym env, in order, until the episode terminates or the budget is spent (as
        `TextEnv.step`); then the next observation's text."""
        reward, executed, terminated = 0.0, 0, False
        for action in actions:
            if terminated or traj.actions_left <= 0:
                break
            r, terminated = self.peer_env.step(traj.env, action)
            reward, executed, traj.actions_left = reward + r, executed + 1, traj.actions_left - 1
        traj.turns += 1
        traj.reward, traj.warn = reward, executed == 0
        traj.done = terminated or traj.actions_left <= 0
        traj.obs = self.peer_env.text(traj.env)


def rates(run: dict, batch: int) -> dict:
    """A round's (or several rounds' summed) figures with trajectories/s and generated tokens/s, rounded; `batch` is
    the trajectories played."""
    out = {k: round(v, 4) if isinstance(v, float) else v for k, v in run.items()}
    seconds = run["seconds"]
    out.update(trajectories_per_s=round(batch / seconds, 3), tokens_per_s=round(run["tokens"] / seconds, 1),
               turns_per_trajectory=round(run["turns"] / batch, 3))
    return out


def summed(rounds: list[dict]) -> dict:
    """Rounds' figures added up (success: the mean over rounds of equal size)."""
    total = {k: sum(r[k] for r in rounds) for k in rounds[0] if k != "success"}
    return {**total, "success": float(np.mean([r["success"] for r in rounds]))}


def bench(name: str, geometry: dict, repeats: int) -> dict:
    """Both sides of one env (module docstring): each side over all timed rounds (and its fastest round), and ours /
    peer."""
    setup = Setup(name, geometry)
    print(f"{name}: compiled in {setup.compile_s:.1f} s (max_len {setup.max_len})", file=sys.stderr, flush=True)
    threads, calibration = setup.torch_threads(jax.random.key(0))
    print(f"{name}: the peer runs torch on {threads} thread(s) ({calibration} s)", file=sys.stderr, flush=True)
    rounds = {"ours": [], "peer": []}
    for r in range(repeats + 1):  # round 0 warms both sides up
        key = jax.random.key(r)
        levels = setup.levels(key)
        ours, peer = setup.ours(key), setup.peer(levels, seed=r)
        print(f"{name} round {r}: ours {ours['seconds']:.2f} s ({ours['tokens']} tokens), peer {peer['seconds']:.2f} s "
              f"({peer['tokens']} tokens)", file=sys.stderr, flush=True)
        if r:
            rounds["ours"].append(ours)
            rounds["peer"].append(peer)
    batch = geometry["num_groups"] * geometry["group_size"]
    ours, peer = ({**rates(summed(rounds[side]), batch * repeats),
                   "fastest": rates(min(rounds[side], key=lambda x: x["seconds"]), batch)} for side in ("ours", "peer"))
    return {"max_len": setup.max_len, "ours": {**ours, "compile_s": round(setup.compile_s, 2)},
            "peer": {**peer, "package": setup.peer_env.package, "torch_threads": threads,
                     "thread_calibration_s": calibration},
            "trajectories_ratio": round(ours["trajectories_per_s"] / peer["trajectories_per_s"], 3),
            "tokens_ratio": round(ours["tokens_per_s"] / peer["tokens_per_s"], 3),
            "fastest_trajectories_ratio": round(
                ours["fastest"]["trajectories_per_s"] / peer["fastest"]["trajectories_per_s"], 3)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="2 groups x 4, 3 turns, one timed round")
    parser.add_argument("--repeats", type=int, default=3, help="timed rounds after the warm-up (--quick: 1)")
    parser.add_argument("--envs", default=",".join(PEERS), help="comma-separated: frozen_lake, sokoban")
    args = parser.parse_args()
    geometry = GEOMETRY[args.quick]
    transformers.logging.disable_progress_bar()
    result = {"benchmark": "rollout_e2e", "jax": jax.__version__, "torch": torch.__version__,
              "transformers": transformers.__version__, "device": jax.devices()[0].device_kind,
              "cores": os.cpu_count(), "repeats": 1 if args.quick else args.repeats,
              "geometry": {**geometry, "response_length": RESPONSE, "temperature": 1.0}}
    for name in args.envs.split(","):
        try:
            PEERS[name]()
        except ImportError as error:
            result[name] = {"skipped": f"the peer needs {error.name!r}: .venv/bin/pip install -e '.[bench]'"}
            print(f"{name}: skipped ({result[name]['skipped']})", file=sys.stderr, flush=True)
            continue
        result[name] = bench(name, geometry, result["repeats"])
    result["goals_met"] = goals_met(result, GOALS)
    print(json.dumps(result))


if __name__ == "__main__":
    main()

"""Transcripts: a few decoded trajectories of a step, for reading rollouts (template collapse shows as the same
reasoning whatever the observation), as RAGEN logs generations (`trainer.generations_to_log_to_wandb`).

    sample = select(traj, rollout)                       # jittable: the first COUNT rows, their responses parsed
    rows = records(jax.device_get(sample), tokenizer)
    write(run_dir, step, rows)                           # <run_dir>/samples/step_<step>.jsonl, one JSON object a line
    write(run_dir, step, rows, batch="train")            # <run_dir>/samples/train_step_<step>.jsonl
    newest(run_dir)                                      # (step, rows) of the newest validation file, or None
    print(report(run_dir))                               # what `ragen-report` prints: the newest of both batches

Two batches, two files. Every `logging.samples_every` steps (step 0 included) the host loop (`train.loop`,
`train.sweep`, per member) writes the validation rollout's first COUNT trajectories (`train.validation.Validator.run`:
fixed prompts, so the transcripts of different steps answer the same observations) to `samples/step_N.jsonl`, and
(from step 1) the training batch's first COUNT trajectories, which the compiled step returns beside its metrics
(`TrainStep.with_transcripts`), to `samples/train_step_N.jsonl`: step N's rollout, sampled by the policy before step
N's update (the validation of step N scores the policy after it), the rows of its first groups, whose rewards and
success enter step N's metrics. `ragen-eval` writes the validation kind only. One line per trajectory, in both:

    {"step": 10, "index": 0, "group": 0, "success": true, "episode_reward": 0.9, "chat": "<|system|>...",
     "turns": [{"turn": 1, "response": "I am at ...</think><answer>Down</answer><|end|>", "reasoning": "I am at ...",
                "answer": "Down", "actions": ["Down"], "reward": 0.0, "format_ok": true}, ...]}

`chat` is the trajectory's buffer decoded (the chat text of its messages as the model saw them, the closing included);
per taken turn, `response` is what the policy sampled (after the prefilled "<think>"), `reasoning` the span inside
<think>..</think>, and `answer` and `actions` what the env's own parser (`env.parse`, the one the rollout steps with)
read from the response: the answer with the special strings removed and its non-empty stripped `||`-parts (at most
`max_actions_per_turn`; [] when nothing parsed).
"""
from __future__ import annotations

import json
import os
import re
import shutil
from typing import Sequence

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from ragen_jax.rollout.rollout import Rollout, Trajectory

SAMPLES_DIR = "samples"
COUNT = 4  # trajectories per transcript: the rollout batch's first rows
# batch -> (file name prefix, the markdown heading's name of it)
BATCHES = {"val": ("step_", "validation"), "train": ("train_step_", "training batch")}


@flax.struct.dataclass
class Sample:
    """The first n rows of a `Trajectory` (T = max_turn, L = buffer length) and each turn's parsed response
    (M = max actions per turn, A = the parser's answer bytes).

    tokens: i32[n, L]; length: i32[n]; turn_taken, format_ok: bool[n, T]; response_start, response_len,
    think_start, think_len: i32[n, T]; turn_reward: f32[n, T]; success: bool[n]; episode_reward: f32[n];
    group_ids: i32[n] (all as in `Trajectory`). answer_bytes: u8[n, T, A] and answer_len: i32[n, T] the cleaned
    answer; part_start, part_end: i32[n, T, M] and num_parts: i32[n, T] its `||`-parts (`environments.parsing`).
    """

    tokens: jax.Array
    length: jax.Array
    turn_taken: jax.Array
    format_ok: jax.Array
    response_start: jax.Array
    response_len: jax.Array
    think_start: jax.Array
    think_len: jax.Array
    turn_reward: jax.Array
    success: jax.Array
    episode_reward: jax.Array
    group_ids: jax.Array
    answer_bytes: jax.Array
    answer_len: jax.Array
    part_start: jax.Array
    part_end: jax.Array
    num_parts: jax.Array


def select(traj: Trajectory, rollout: Rollout, count: int = COUNT) -> Sample:
    """The first `count` trajectories of `traj` (a batch of `rollout`) with every turn's response re-parsed by
    `rollout.env.parse` exactly as the rollout parsed it (the prefill, then the sampled tokens); pure, jittable."""
    rows = jax.tree.map(lambda x: x[:count], traj)
    prefill = jnp.asarray(rollout.prompts.prefill_ids)
    n = rollout.response_length
    padded = jnp.pad(rows.tokens, ((0, 0), (0, n)))  # a slice at any response start stays in bounds

    def parse(buffer, start, length):
        response = jnp.concatenate([prefill, jax.lax.dynamic_slice(buffer, (start,), (n,))])
        return rollout.env.parse(response, prefill.shape[0] + length)

    parsed = jax.vmap(jax.vmap(parse, (None, 0, 0)))(padded, rows.response_start, rows.response_len)
    return Sample(tokens=rows.tokens, length=rows.length, turn_taken=rows.turn_taken, format_ok=rows.format_ok,
                  response_start=rows.response_start, response_len=rows.response_len, think_start=rows.think_start,
                  think_len=rows.think_len, turn_reward=rows.turn_reward, success=rows.success,
                  episode_reward=rows.episode_reward, group_ids=rows.group_ids, answer_bytes=parsed.answer_bytes,
                  answer_len=parsed.answer_len, part_start=parsed.part_start, part_end=parsed.part_end,
                  num_parts=parsed.num_parts)


def records(sample: Sample, tokenizer, first_index: int = 0) -> list[dict]:
    """One JSON-ready dict per row of a host (numpy) `sample` (see the module doc); `index` counts from
    `first_index`."""
    s = jax.tree.map(np.asarray, sample)
    out = []
    for b in range(s.tokens.shape[0]):
        turns = []
        for t in np.flatnonzero(s.turn_taken[b]):
            answer = bytes(s.answer_bytes[b, t, :s.answer_len[b, t]])
            parts = [answer[i:j].decode("utf-8", errors="replace")
                     for i, j in zip(s.part_start[b, t, :s.num_parts[b, t]], s.part_end[b, t, :s.num_parts[b, t]])]
            turns.append({
                "turn": int(t) + 1,
                "response": _decode(tokenizer, s.tokens[b], s.response_start[b, t], s.response_len[b, t]),
                "reasoning": _decode(tokenizer, s.tokens[b], s.think_start[b, t], s.think_len[b, t]),
                "answer": answer.decode("utf-8", errors="replace"), "actions": parts,
                "reward": float(s.turn_reward[b, t]), "format_ok": bool(s.format_ok[b, t])})
        out.append({"index": first_index + b, "group": int(s.group_ids[b]), "success": bool(s.success[b]),
                    "episode_reward": float(s.episode_reward[b]),
                    "chat": _decode(tokenizer, s.tokens[b], 0, s.length[b]), "turns": turns})
    return out


def _decode(tokenizer, tokens: np.ndarray, start, length) -> str:
    return tokenizer.decode(tokens[int(start):int(start) + int(length)])


def due(step: int, every: int) -> bool:
    """Whether the loop writes transcripts after `step` updates (`logging.samples_every` = every; 0 = never)."""
    return every > 0 and step % every == 0


def path(directory: str, step: int, batch: str = "val") -> str:
    """`<directory>/samples/step_<step>.jsonl` (batch "val") or `.../train_step_<step>.jsonl` ("train")."""
    return os.path.join(directory, SAMPLES_DIR, f"{BATCHES[batch][0]}{int(step)}.jsonl")


def write(directory: str | None, step: int, rows: Sequence[dict], batch: str = "val") -> str | None:
    """Writes `rows` (each with `"step"` added first) to `path(directory, step, batch)`, replacing a file an
    interrupted run left there; returns its path (None, writing nothing, when `directory` is None or "")."""
    if not directory:
        return None
    out = path(directory, step, batch)
    os.makedirs(os.path.dirname(out), exist_ok=True)
    with open(out, "w", encoding="utf-8") as f:
        f.writelines(json.dumps({"step": int(step), **row}) + "\n" for row in rows)
    return out


def clear(directory: str | None) -> None:
    """Removes `<directory>/samples`, both batches' files (a run that starts over)."""
    if directory:
        shutil.rmtree(os.path.join(directory, SAMPLES_DIR), ignore_errors=True)


def newest(directory: str, batch: str = "val") -> tuple[int, list[dict]] | None:
    """(step, rows) of the newest file of `batch` in `<directory>/samples`, or None when there is none."""
    folder = os.path.join(directory, SAMPLES_DIR)
    pattern = re.compile(re.escape(BATCHES[batch][0]) + r"(\d+)\.jsonl")
    steps = [int(m.group(1)) for m in map(pattern.fullmatch, os.listdir(folder) if os.path.isdir(folder) else [])
             if m]
    if not steps:
        return None
    with open(path(directory, max(steps), batch), encoding="utf-8") as f:
        return max(steps), [json.loads(line) for line in f]


def markdown(step: int, rows: Sequence[dict], count: int = 2, batch: str = "val") -> str:
    """Markdown of the first `count` of a step's transcripts of `batch`: per trajectory a heading (group, success,
    episode reward), a table of its turns (reasoning, answer, actions, reward) and the chat text in a fold."""
    lines = [f"## Transcripts of step {step} ({BATCHES[batch][1]})", ""]
    for row in rows[:count]:
        lines += [f"### trajectory {row['index']}: group {row['group']}, success {row['success']}, "
                  f"episode reward {row['episode_reward']:.3g}", "",
                  "| turn | reasoning | answer | actions | reward | format ok |", "|---|---|---|---|---|---|"]
        lines += [f"| {t['turn']} | {_cell(t['reasoning'])} | {_cell(t['answer'])} | "
                  f"{_cell(' || '.join(t['actions']))} | {t['reward']:.3g} | {t['format_ok']} |"
                  for t in row["turns"]]
        lines += ["", "<details><summary>chat text</summary>", "", "```text", row["chat"], "```", "", "</details>", ""]
    return "\n".join(lines)


def report(directory: str) -> str | None:
    """The markdown of the newest validation transcripts, then of the newest training-batch ones, of the files in
    `directory` (None when it holds neither)."""
    found = [(batch, newest(directory, batch)) for batch in BATCHES]
    parts = [markdown(*step_rows, batch=batch) for batch, step_rows in found if step_rows is not None]
    return "\n".join(parts) if parts else None


def _cell(text: str) -> str:
    """`text` as one markdown table cell (pipes escaped, newlines as <br>)."""
    return text.replace("|", "\\|").replace("\n", "<br>")

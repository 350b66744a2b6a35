"""Transcripts (`train.transcripts`): the scripted template policy's rollout (tests/rollout/helpers.py, always
`<think>I go down first.</think><answer>Down</answer>`) decodes to the chat text of its messages, with each turn's
reasoning, answer, actions and reward; the files of both batches (validation, training) round-trip and
`ragen-report` prints the newest of each."""
from __future__ import annotations

import jax
import numpy as np
import pytest

from ragen_jax.train import transcripts
from tests.rollout.helpers import GROUP_SIZE, REASONING, run, scripted_params, tiny_setup


@pytest.fixture(scope="module")
def scripted():
    setup = tiny_setup()
    tokenizer, _, _, config = setup
    rollout, traj = run(setup, scripted_params(config, tokenizer), max_len=1536, temperature=0.0)
    select = jax.jit(lambda t: transcripts.select(t, rollout, count=3))
    return tokenizer, traj, select, transcripts.records(jax.device_get(select(traj)), tokenizer)


def test_a_transcript_decodes_to_the_text_of_its_messages(scripted):
    tokenizer, traj, _, rows = scripted
    assert [r["index"] for r in rows] == [0, 1, 2] and [r["group"] for r in rows] == [b // GROUP_SIZE for b in range(3)]
    for b, row in enumerate(rows):
        assert row["chat"] == tokenizer.decode(traj.tokens[b, :traj.length[b]])
        assert row["success"] == bool(traj.success[b])
        assert row["episode_reward"] == pytest.approx(traj.episode_reward[b])
        taken = int(traj.turn_taken[b].sum())
        assert [t["turn"] for t in row["turns"]] == list(range(1, taken + 1)) and taken >= 1
        position = 0
        for t, turn in enumerate(row["turns"]):
            assert turn["reasoning"] == REASONING and turn["answer"] == "Down" and turn["actions"] == ["Down"]
            stop = tokenizer.decode([tokenizer.eos_id])
            assert turn["response"] == REASONING + "</think><answer>Down</answer>" + stop
            assert turn["reward"] == pytest.approx(traj.turn_reward[b, t]) and turn["format_ok"]
            # the turns' responses appear in the chat text in order, each after the "<think>" prefill
            position = row["chat"].index("<think>" + turn["response"], position) + 1
    assert rows[0]["chat"] == rows[1]["chat"] != rows[2]["chat"]  # greedy: one group, one trajectory; groups differ


def test_files_round_trip_and_the_report_prints_the_newest(scripted, tmp_path, capsys):
    from experiments import report

    rows = scripted[-1]
    assert transcripts.newest(str(tmp_path)) is None
    transcripts.write(str(tmp_path), 2, rows[:1])
    written = transcripts.write(str(tmp_path), 10, rows)
    assert written == str(tmp_path / "samples" / "step_10.jsonl")
    step, back = transcripts.newest(str(tmp_path))
    assert step == 10 and back == [{"step": 10, **r} for r in rows]
    text = transcripts.markdown(step, back)
    assert text.startswith("## Transcripts of step 10 (validation)") and text.count("### trajectory") == 2
    assert f"| 1 | {REASONING} | Down | Down | " in text and back[0]["chat"] in text
    assert transcripts.write(None, 3, rows) is None and transcripts.write("", 3, rows) is None
    assert transcripts.newest(str(tmp_path), "train") is None
    # the training batch's transcripts: their own files, apart from the validation ones
    assert transcripts.write(str(tmp_path), 9, rows[1:], "train") == str(tmp_path / "samples" / "train_step_9.jsonl")
    assert transcripts.newest(str(tmp_path), "train") == (9, [{"step": 9, **r} for r in rows[1:]])
    assert transcripts.newest(str(tmp_path)) == (10, back)

    (tmp_path / "metrics.jsonl").write_text('{"step": 1, "frozen_lake/success": 0.5}\n')
    report.main(["ragen-report", str(tmp_path)])
    out = capsys.readouterr().out  # the newest of each batch, validation first
    assert 0 <= out.index("## Transcripts of step 10 (validation)") < out.index(
        "## Transcripts of step 9 (training batch)")
    transcripts.clear(str(tmp_path))
    assert transcripts.newest(str(tmp_path)) is None and transcripts.report(str(tmp_path)) is None


def test_nothing_parsed_gives_no_answer_or_actions(scripted):
    """A turn whose response holds no <think>..</think><answer>..</answer>: empty answer and actions, the raw
    response kept."""
    tokenizer, traj, select, _ = scripted
    garbage = tokenizer.encode("no tags at all")
    tokens, response_len = np.array(traj.tokens), np.array(traj.response_len)
    start = int(traj.response_start[0, 0])
    tokens[0, start:start + len(garbage)] = garbage
    response_len[0, 0] = len(garbage)
    rows = transcripts.records(jax.device_get(select(traj.replace(tokens=tokens, response_len=response_len))),
                               tokenizer)
    turn = rows[0]["turns"][0]
    assert turn["response"] == "no tags at all" and turn["answer"] == "" and turn["actions"] == []
    assert rows[1]["turns"][0]["actions"] == ["Down"]

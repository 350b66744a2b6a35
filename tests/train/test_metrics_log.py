"""MetricsWriter: strict-JSON round trip, `every`, resume truncation (byte-identical file), TensorBoard events read
back from their TFRecord framing, console summaries and early errors."""
import json
import math
import struct

import jax.numpy as jnp
import numpy as np
import pytest
from tensorboardX.proto import event_pb2
from tensorboardX.record_writer import masked_crc32c

from ragen_jax.train.metrics_log import METRICS_FILE, MetricsWriter, read_metrics, summary_line


def fake_metrics(step: int) -> dict:
    """Deterministic metrics of a step, in the types a training loop produces."""
    return {"train/success": jnp.float32(step / 8), "actor/pg_loss": np.float32(-0.1 * step),
            "actor/num_updates": jnp.int32(step), "rollout/ok": np.bool_(step % 2), "lr": 1e-3 * step}


def read_events(path) -> list:
    """Events of a TensorBoard file: TFRecord framing (u64 length, masked crc32c, data, masked crc32c)."""
    events = []
    with open(path, "rb") as f:
        while header := f.read(8):
            (length,) = struct.unpack("<Q", header)
            assert struct.unpack("<I", f.read(4))[0] == masked_crc32c(header)
            data = f.read(length)
            assert struct.unpack("<I", f.read(4))[0] == masked_crc32c(data)
            events.append(event_pb2.Event.FromString(data))
    return events


def scalars(directory) -> dict:
    """{(tag, step): value} over every event file of `directory`."""
    found = {}
    for path in sorted(directory.glob("events.out.tfevents.*")):
        for event in read_events(path):
            for value in event.summary.value:
                found[(value.tag, event.step)] = value.simple_value
    return found


def test_round_trip_is_strict_json_with_nan_as_null(tmp_path):
    written = {"a": jnp.float32(0.1), "b": np.float64(math.nan), "c": math.inf, "d": jnp.asarray([2.5]),
               "e": np.int64(-3), "f": True, "g": jnp.bfloat16(1.5)}
    with MetricsWriter(tmp_path, tensorboard=False) as writer:
        assert writer.write(7, written)
    [line] = (tmp_path / METRICS_FILE).read_text().splitlines()
    strict = json.loads(line, parse_constant=lambda name: pytest.fail(f"non-JSON constant {name} in {line}"))
    assert strict == {"step": 7, "a": float(np.float32(0.1)), "b": None, "c": None, "d": 2.5, "e": -3.0, "f": 1.0,
                      "g": 1.5}
    [row] = read_metrics(tmp_path)
    assert math.isnan(row.pop("b")) and math.isnan(row.pop("c"))
    assert row == {"step": 7, "a": float(np.float32(0.1)), "d": 2.5, "e": -3.0, "f": 1.0, "g": 1.5}
    assert type(row["step"]) is int


def test_every_writes_multiples_and_forced_steps(tmp_path):
    with MetricsWriter(tmp_path, tensorboard=False, every=3) as writer:
        logged = [writer.write(s, fake_metrics(s), force=(s == 7)) for s in range(1, 8)]
    assert logged == [False, False, True, False, False, True, True]
    assert [row["step"] for row in read_metrics(tmp_path / METRICS_FILE)] == [3, 6, 7]


def test_resumed_run_leaves_the_same_file_as_an_uninterrupted_one(tmp_path):
    uninterrupted, resumed = tmp_path / "a", tmp_path / "b"
    with MetricsWriter(uninterrupted, tensorboard=False) as writer:
        for s in range(1, 7):
            writer.write(s, fake_metrics(s))
    with MetricsWriter(resumed, tensorboard=False) as writer:  # crashes after step 4, checkpoint at step 2
        for s in range(1, 5):
            writer.write(s, fake_metrics(s))
    with open(resumed / METRICS_FILE, "a") as f:
        f.write('{"step": 5, "train/succ')  # the line being written when it crashed
    with MetricsWriter(resumed, tensorboard=False) as writer:
        assert writer.truncate_after(2) == 3
        assert [row["step"] for row in read_metrics(resumed)] == [1, 2]
        for s in range(3, 7):
            writer.write(s, fake_metrics(s))
    assert (resumed / METRICS_FILE).read_bytes() == (uninterrupted / METRICS_FILE).read_bytes()


def test_unreadable_line_names_file_and_line(tmp_path):
    (tmp_path / METRICS_FILE).write_text('{"step": 1, "x": 1.0}\nnot json\n{"step": 3, "x": 2.0}\n')
    with pytest.raises(ValueError, match=rf"{METRICS_FILE}:2: not a metrics line"):
        read_metrics(tmp_path)
    with pytest.raises(ValueError, match=rf"{METRICS_FILE}:2: not a metrics line"):
        MetricsWriter(tmp_path, tensorboard=False).truncate_after(1)


def test_tensorboard_scalars_and_purge_on_resume(tmp_path):
    with MetricsWriter(tmp_path) as writer:
        for s in (1, 2, 3):
            writer.write(s, fake_metrics(s))
    assert scalars(tmp_path) == {(name, s): pytest.approx(float(np.float32(value)))
                                 for s in (1, 2, 3) for name, value in fake_metrics(s).items()}
    with MetricsWriter(tmp_path) as writer:
        writer.truncate_after(2)
        writer.write(3, {"train/success": 0.75})
    newest = sorted(tmp_path.glob("events.out.tfevents.*"), key=lambda p: p.stat().st_mtime_ns)[-1]
    events = read_events(newest)
    purge = [e for e in events if e.HasField("session_log")]
    assert [(e.step, e.session_log.status) for e in purge] == [(3, event_pb2.SessionLog.START)]
    assert [(v.tag, e.step, v.simple_value) for e in events for v in e.summary.value] == [("train/success", 3, 0.75)]


def test_no_directory_writes_nothing(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for directory in (None, ""):
        with MetricsWriter(directory) as writer:
            assert writer.path is None and writer.write(1, fake_metrics(1)) and writer.truncate_after(0) == 0
            with pytest.raises(ValueError, match="'bad'"):  # input is still checked
                writer.write(2, {"bad": np.zeros(3)})
    assert list(tmp_path.iterdir()) == []


def test_summary_line():
    metrics = {"train/success": jnp.float32(0.5), "actor/pg_loss": np.float32(-0.0123456), "x": 1234567.0}
    assert (summary_line(12, metrics, ["train/success", "critic/vf_loss", "actor/pg_loss", "x"])
            == "step 12 | train/success 0.5 | actor/pg_loss -0.01235 | x 1.235e+06")


def test_bad_input_fails_early(tmp_path):
    with pytest.raises(ValueError, match="every"):
        MetricsWriter(tmp_path, every=0)
    with MetricsWriter(tmp_path, tensorboard=False) as writer:
        with pytest.raises(ValueError, match=r"'actor/entropy' must be a numeric scalar, got float32\[2\]"):
            writer.write(1, {"actor/entropy": jnp.zeros(2)})
        with pytest.raises(ValueError, match='"step" is reserved'):
            writer.write(1, {"step": 1.0})
        with pytest.raises(ValueError, match="'name'"):
            writer.write(1, {"name": "ppo"})
    assert not (tmp_path / METRICS_FILE).exists()


def test_columns_of_a_run_fill_missing_values_with_nan(tmp_path):
    from ragen_jax import metrics as metrics_lib

    with MetricsWriter(str(tmp_path), tensorboard=False) as writer:
        writer.write(0, {"val/success": 0.25})
        writer.write(1, {"train/success": 0.5, "actor/loss": float("inf")})
        writer.write(2, {"train/success": 0.75, "val/success": 0.5})
    history = metrics_lib.load(str(tmp_path))
    assert history["step"].dtype == np.int64 and list(history["step"]) == [0, 1, 2]
    np.testing.assert_array_equal(history["val/success"], [0.25, np.nan, 0.5])
    np.testing.assert_array_equal(history["train/success"], [np.nan, 0.5, 0.75])
    assert np.isnan(history["actor/loss"][1])  # non-finite values are stored as null, read back as NaN
    assert not metrics_lib.is_sweep(str(tmp_path))


def test_gzipped_archives_read_like_the_plain_file(tmp_path):
    import gzip
    import shutil

    with MetricsWriter(str(tmp_path / "run"), tensorboard=False) as writer:
        writer.write(1, {"a": 0.5, "b": float("nan")})
        writer.write(2, {"a": 0.25})
    plain = tmp_path / "run" / METRICS_FILE
    expected = read_metrics(str(tmp_path / "run"))
    archive = tmp_path / "archive"
    archive.mkdir()
    with open(plain, "rb") as src, gzip.open(archive / (METRICS_FILE + ".gz"), "wb") as dst:
        shutil.copyfileobj(src, dst)
    for got in (read_metrics(str(archive)), read_metrics(str(archive / (METRICS_FILE + ".gz")))):
        assert [r["step"] for r in got] == [1, 2] and got[1]["a"] == expected[1]["a"] == 0.25
        assert np.isnan(got[0]["b"])

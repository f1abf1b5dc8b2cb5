"""The on-disk trajectory log: bit-exact round trip, torn writes, corruption."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import warnings

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from provrl.provenance import Identity, SamplingParams, ToolCall, TrajectoryBuilder
from provrl.trajlog import (
    CorruptLogError,
    TornRecordWarning,
    TrajectoryWriter,
    decode_line,
    encode_line,
    read_all,
    read_trajectories,
    trajectory_to_record,
)


@st.composite
def trajectories(draw):
    b = TrajectoryBuilder(
        draw(st.text(min_size=1, max_size=12)),
        draw(st.text(max_size=12)),
        sampling=SamplingParams(
            temperature=draw(st.floats(0, 2)),
            top_p=draw(st.floats(0.01, 1)),
            top_k=draw(st.integers(0, 50)),
            stop=tuple(draw(st.lists(st.text(max_size=5), max_size=2))),
            seed=draw(st.none() | st.integers(0, 2**31)),
        ),
        policy=Identity("m", "sha256:ab", {"dtype": "float32"}),
        tools=Identity("bm25", "", {"k": draw(st.integers(1, 10))}),
        meta={"q": draw(st.text(max_size=20))},
    )
    for turn in range(draw(st.integers(1, 4))):
        b.add_prompt(draw(st.lists(st.integers(0, 2**31 - 1), max_size=20)))
        n = draw(st.integers(0, 30))
        v = draw(st.integers(0, 1000))
        b.add_actions(
            draw(st.lists(st.integers(0, 2**31 - 1), min_size=n, max_size=n)),
            logprob=draw(st.lists(st.floats(-1e6, 0, width=32), min_size=n, max_size=n)),
            kept_mass=draw(
                st.lists(st.integers(1, 2**24).map(lambda k: k / 2**24), min_size=n, max_size=n)
            ),
            version=[v] * n,
            kv_min=[draw(st.integers(0, v))] * n,
            kv_max=[v] * n,
            replica=draw(st.integers(0, 7)),
        )
        b.add_tool_call(
            ToolCall(turn, "search", draw(st.text(max_size=10)), ok=draw(st.booleans()))
        )
        b.next_turn()
    reward = draw(st.none() | st.floats(-1, 1))
    return b.build(reward=reward, metrics={"f1": draw(st.floats(0, 1))})


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(traj=trajectories(), compress=st.booleans())
def test_line_round_trip_is_bit_exact(traj, compress):
    back = decode_line(encode_line(traj, compress))
    assert back.equals(traj)
    for name, arr in traj.columns().items():
        assert getattr(back, name).tobytes() == arr.tobytes(), name


@settings(max_examples=10, deadline=None)
@given(trajs=st.lists(trajectories(), min_size=1, max_size=5))
def test_file_round_trip(tmp_path_factory, trajs):
    path = tmp_path_factory.mktemp("log") / "t.jsonl"
    with TrajectoryWriter(path) as w:
        w.write_many(trajs)
    back = read_all(path)
    assert len(back) == len(trajs)
    assert all(a.equals(b) for a, b in zip(trajs, back, strict=True))


def small(i: int):
    b = TrajectoryBuilder(f"t{i}", "task")
    b.add_prompt([1, 2])
    b.add_actions(
        [3, 4],
        logprob=[-0.5, -0.25],
        kept_mass=[1, 1],
        version=[i, i],
        kv_min=[0, 0],
        kv_max=[i, i],
        replica=0,
    )
    return b.build()


@pytest.mark.parametrize("cut", [1, 10, 50, -2])
def test_torn_last_record_is_skipped_with_warning(tmp_path, cut):
    path = tmp_path / "t.jsonl"
    with TrajectoryWriter(path) as w:
        for i in range(3):
            w.write(small(i))
    data = path.read_bytes()
    last_start = data.rstrip(b"\n").rfind(b"\n") + 1
    path.write_bytes(data[: last_start + cut] if cut > 0 else data[:cut])
    with pytest.warns(TornRecordWarning):
        back = read_all(path)
    assert [t.traj_id for t in back] == ["t0", "t1"]


def test_writer_reopening_a_torn_log_keeps_the_torn_bytes_and_appends_cleanly(tmp_path):
    path = tmp_path / "t.jsonl"
    with TrajectoryWriter(path) as w:
        w.write(small(0))
    with open(path, "ab") as f:
        f.write(encode_line(small(1))[:40])  # a crash mid-record
    with pytest.warns(TornRecordWarning, match="moved to"):
        w = TrajectoryWriter(path)
    w.write(small(2))
    w.close()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert [t.traj_id for t in read_all(path)] == ["t0", "t2"]
    side = list(tmp_path.glob("t.jsonl.torn-*"))
    assert len(side) == 1 and side[0].read_bytes() == encode_line(small(1))[:40]


def test_corrupt_middle_record_names_file_and_line(tmp_path):
    path = tmp_path / "t.jsonl"
    with TrajectoryWriter(path) as w:
        for i in range(3):
            w.write(small(i))
    lines = path.read_bytes().split(b"\n")
    lines[1] = lines[1].replace(b'"t1"', b'"tX"')  # CRC no longer matches
    path.write_bytes(b"\n".join(lines))
    with pytest.raises(CorruptLogError, match=r"t\.jsonl:2: .*CRC mismatch"):
        read_all(path)
    with pytest.warns(UserWarning, match=":2:"):
        assert [t.traj_id for t in read_all(path, strict=False)] == ["t0", "t2"]


def test_killed_writer_process_leaves_earlier_records_readable(tmp_path):
    """A real process killed with SIGKILL while writing big records."""
    path = tmp_path / "t.jsonl"
    script = textwrap.dedent(
        f"""
        import os, signal, numpy as np
        from provrl.provenance import TrajectoryBuilder
        from provrl.trajlog import TrajectoryWriter
        w = TrajectoryWriter({str(path)!r}, compress=False)
        n = 200_000
        for i in range(1000):
            b = TrajectoryBuilder(f"t{{i}}", "x")
            b.add_actions(np.arange(n) % 1000, logprob=np.full(n, -1.0), kept_mass=np.ones(n),
                          version=i, kv_min=0, kv_max=i, replica=0)
            w.write(b.build(validate=False))
            if i == 3:
                # the next write is torn: simulate a kill part-way through it
                line = __import__("provrl.trajlog", fromlist=["x"]).encode_line(b.build(), False)
                os.write(w._log.fileno(), line[: len(line) // 2])
                os.kill(os.getpid(), signal.SIGKILL)
        """
    )
    proc = subprocess.run([sys.executable, "-c", script], env={**os.environ}, timeout=120)
    assert proc.returncode == -9
    with pytest.warns(TornRecordWarning):
        back = list(read_trajectories(path))
    assert [t.traj_id for t in back] == ["t0", "t1", "t2", "t3"]
    assert back[3].version[-1] == 3 and len(back[3]) == 200_000


def test_follow_mode_streams_records_written_later(tmp_path):
    import threading
    import time

    path = tmp_path / "t.jsonl"
    w = TrajectoryWriter(path)

    def produce():
        for i in range(3):
            time.sleep(0.05)
            w.write(small(i))

    th = threading.Thread(target=produce)
    th.start()
    got = [t.traj_id for t in read_trajectories(path, follow=True, idle_timeout_s=0.5)]
    th.join()
    w.close()
    assert got == ["t0", "t1", "t2"]


def test_writer_validates_before_writing(tmp_path):
    t = small(0)
    t.version = t.version.copy()
    t.version[2] = -1
    path = tmp_path / "t.jsonl"
    with TrajectoryWriter(path) as w, pytest.raises(ValueError, match="token 2"):
        w.write(t)
    assert path.read_bytes() == b""
    assert np.isnan(small(0).logprob[0])


# ----------------------------------------------------------------------------- hardening
def test_every_line_is_strict_json_and_old_zero_padded_logs_still_read(tmp_path):
    """The CRC is a plain JSON integer (it used to be written as %010d: a CRC below 1e9
    had leading zeros, which json.loads rejects); logs in the old format still read."""
    import json
    import zlib

    import orjson

    path = tmp_path / "t.jsonl"
    trajs = [small(i) for i in range(64)]
    with TrajectoryWriter(path) as w:
        w.write_many(trajs)
    lines = path.read_bytes().splitlines()
    crcs = [json.loads(line)["crc"] for line in lines]  # every line parses as strict JSON
    assert any(c < 10**9 for c in crcs)  # the case %010d got wrong is covered
    for line, t in zip(lines, trajs, strict=True):
        rec = json.loads(line)["rec"]
        assert rec["traj_id"] == t.traj_id and rec["n"] == len(t)
    old = tmp_path / "old.jsonl"
    with open(old, "wb") as f:
        for t in trajs:
            body = orjson.dumps(trajectory_to_record(t))
            f.write(b'{"crc":%010d,"rec":%s}\n' % (zlib.crc32(body), body))
    assert all(a.equals(b) for a, b in zip(read_all(old), trajs, strict=True))


def _line_with(rec) -> bytes:
    import zlib

    import orjson

    body = orjson.dumps(rec)
    return b'{"crc":%d,"rec":%s}\n' % (zlib.crc32(body), body)


def _bad_records():
    import base64
    import zlib

    good = trajectory_to_record(small(5))

    def edit(**kw):
        return {**good, **kw}

    def col(name, value):
        return edit(tokens={**good["tokens"], name: value})

    bomb = base64.b64encode(zlib.compress(b"\0" * (64 << 20))).decode()  # 64 MiB of zeros
    return {
        "not an object": [1, 2, 3],  # was AttributeError
        "bad zlib": col("token_id", base64.b64encode(b"not zlib").decode()),  # was zlib.error
        "bad base64": col("token_id", "!!!"),
        "zlib bomb": col("logprob", bomb),  # must not expand 64 MiB for a 4-token column
        "short column": col("version", base64.b64encode(zlib.compress(b"\0" * 4)).decode()),
        "string reward": edit(reward="1.0"),  # used to fail 25 s into training
        "bool reward": edit(reward=True),
        "text metric": edit(metrics={"f1": "high"}),
        "huge n": edit(n=10**12),
        "missing field": {k: v for k, v in good.items() if k != "segments"},
        "bad segment": edit(segments=[["prompt", "0", 2, 0]]),
        "bad identity": edit(policy={"nom": "x"}),
    }


@pytest.mark.parametrize("kind", sorted(_bad_records()))
def test_every_kind_of_corrupt_record_names_file_and_line(tmp_path, kind):
    path = tmp_path / "t.jsonl"
    with TrajectoryWriter(path) as w:
        w.write(small(0))
    with open(path, "ab") as f:
        f.write(_line_with(_bad_records()[kind]))
        f.write(encode_line(small(2)))
    with pytest.raises(CorruptLogError, match=r"t\.jsonl:2: unreadable trajectory record"):
        read_all(path)
    with pytest.warns(UserWarning, match=":2:"):
        assert [t.traj_id for t in read_all(path, strict=False)] == ["t0", "t2"]


def test_an_over_long_record_is_corrupt_not_read_into_memory(tmp_path, monkeypatch):
    import provrl.trajlog as tl

    path = tmp_path / "t.jsonl"
    with TrajectoryWriter(path) as w:
        w.write(small(0))
    with open(path, "ab") as f:
        f.write(b"x" * 5000 + b"\n")
    monkeypatch.setattr(tl, "MAX_RECORD_BYTES", 4096)
    with pytest.raises(CorruptLogError, match=r"t\.jsonl:2: record longer than 4096 bytes"):
        read_all(path)

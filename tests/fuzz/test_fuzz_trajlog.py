"""Fuzz: the trajectory log reader on damaged lines and on records with a valid CRC but
hostile content (the CRC only proves the bytes are what was written, not that a writer
was honest)."""

from __future__ import annotations

import json
import warnings
import zlib

from fuzz_json import JSON
from hypothesis import given, settings
from hypothesis import strategies as st

from provrl.provenance import TrajectoryBuilder
from provrl.trajlog import (
    CorruptLogError,
    TrajectoryWriter,
    encode_line,
    read_all,
    trajectory_to_record,
)


def _traj(i: int):
    b = TrajectoryBuilder(f"t{i}", "task")
    b.add_prompt([1, 2, 3])
    b.add_actions([4, 5], logprob=[-0.5, -0.25], kept_mass=[1, 0.9], version=[i, i],
                  kv_min=[0, 0], kv_max=[i, i], replica=0)  # fmt: skip
    return b.build(reward=1.0)


GOOD = trajectory_to_record(_traj(1))
FIELDS = [*GOOD, *(f"tokens.{k}" for k in GOOD["tokens"])]


def _with_crc(rec) -> bytes:
    body = json.dumps(rec, separators=(",", ":")).encode()
    return b'{"crc":%d,"rec":%s}\n' % (zlib.crc32(body), body)


@st.composite
def hostile_records(draw):
    rec = json.loads(json.dumps(GOOD))
    for key in draw(st.lists(st.sampled_from(FIELDS), min_size=1, max_size=3)):
        tokens = rec.get("tokens")
        if key.startswith("tokens.") and not isinstance(tokens, dict):
            continue  # the columns were already replaced whole
        node, leaf = (tokens, key[7:]) if key.startswith("tokens.") else (rec, key)
        if draw(st.booleans()):
            node[leaf] = draw(JSON | st.binary(max_size=40).map(lambda b: b.hex()))
        else:
            node.pop(leaf, None)
    return _with_crc(rec)


@st.composite
def damaged_lines(draw):
    """A written line with 1–4 of its bytes (not its newline) changed to another byte — never
    a newline, never the byte it was: every example is damaged."""
    line = bytearray(encode_line(_traj(2)))
    for i in draw(st.sets(st.integers(0, len(line) - 2), min_size=1, max_size=4)):
        others = [b for b in range(256) if b not in (line[i], ord("\n"))]
        line[i] = draw(st.sampled_from(others))
    assert line != encode_line(_traj(2)) and line.count(b"\n") == 1
    return bytes(line)


def _read(tmp_path_factory, middle: bytes) -> list:
    p = tmp_path_factory.mktemp("log") / "t.jsonl"
    with TrajectoryWriter(p) as w:
        w.write(_traj(0))
    with open(p, "ab") as f:
        f.write(middle)
        f.write(encode_line(_traj(3)))
    try:
        trajs = read_all(p)
    except CorruptLogError as e:
        assert str(e).startswith(f"{p}:2: ") and "\n" not in str(e)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            assert [t.traj_id for t in read_all(p, strict=False)] == ["t0", "t3"]
        return []
    for t in trajs:  # whatever loads is a valid trajectory
        t.validate()
    return trajs


@settings(max_examples=200, deadline=None)
@given(hostile_records())
def test_a_hostile_record_with_a_valid_crc_is_read_or_named(tmp_path_factory, line):
    _read(tmp_path_factory, line)


@settings(max_examples=150, deadline=None)
@given(damaged_lines())
def test_a_damaged_line_is_a_corrupt_record_naming_file_and_line(tmp_path_factory, line):
    assert _read(tmp_path_factory, line) == []  # detected: CorruptLogError naming file:line

"""The crash-consistency rule of every append-only file (provrl.appendlog): a torn tail set
aside before appending, whole lines only — even when the disk fills mid-record — and lines
a resume no longer wants set aside, never deleted."""

from __future__ import annotations

import errno
import os
import warnings

import pytest

from provrl._sys import WriteError
from provrl.appendlog import (
    AppendLog,
    SetAsideWarning,
    TornRecordWarning,
    read_lines,
    set_aside,
)


def test_a_torn_tail_is_set_aside_before_the_next_append(tmp_path):
    p = tmp_path / "steps.jsonl"
    p.write_bytes(b'{"step": 1}\n{"step": 2, "ac')
    with pytest.warns(TornRecordWarning, match="moved to steps.jsonl.torn-"), AppendLog(p) as log:
        log.append(b'{"step": 2}\n')
    assert p.read_bytes() == b'{"step": 1}\n{"step": 2}\n'
    (side,) = tmp_path.glob("steps.jsonl.torn-*")
    assert side.read_bytes() == b'{"step": 2, "ac'


def test_readers_skip_a_torn_last_line_with_a_warning(tmp_path):
    p = tmp_path / "m.jsonl"
    p.write_bytes(b"a\nb\nc")
    with pytest.warns(TornRecordWarning, match=r"m\.jsonl:3: torn last record"):
        assert list(read_lines(p)) == [(1, b"a\n"), (2, b"b\n")]


def test_a_record_is_one_line(tmp_path):
    with AppendLog(tmp_path / "x") as log, pytest.raises(ValueError, match="one line"):
        log.append(b"a\nb\n")


def test_a_disk_full_mid_record_leaves_only_whole_lines(tmp_path, monkeypatch):
    p = tmp_path / "trajectories.jsonl"
    log = AppendLog(p)
    log.append(b"first\n")
    real = os.write

    def half_then_full(fd, data):  # the kernel takes part of the record, then ENOSPC
        if fd == log.fileno() and len(data) > 4:
            return real(fd, bytes(data[:4]))
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "write", half_then_full)
    with pytest.raises(WriteError, match=r"trajectories\.jsonl: cannot write: No space left"):
        log.append(b"second record\n")
    monkeypatch.undo()
    assert p.read_bytes() == b"first\n"  # cut back: the next append starts on its own line
    log.append(b"third\n")
    log.close()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert [x for _, x in read_lines(p)] == [b"first\n", b"third\n"]


def test_a_read_only_log_is_one_line_naming_it(tmp_path, monkeypatch):
    p = tmp_path / "rl" / "steps.jsonl"

    def read_only(*a, **k):
        raise OSError(errno.EROFS, "Read-only file system", str(p))

    monkeypatch.setattr(os, "open", read_only)
    with pytest.raises(WriteError, match=r"rl/steps\.jsonl: cannot write: Read-only file system"):
        AppendLog(p)


def test_set_aside_keeps_every_line_somewhere(tmp_path):
    p = tmp_path / "metrics.jsonl"
    p.write_bytes(b"1\n2\n3\n4\n")
    with pytest.warns(SetAsideWarning, match="2 line"):
        side = set_aside(p, lambda i: i % 2 == 0, "retried")
    assert p.read_bytes() == b"1\n3\n" and side is not None and side.read_bytes() == b"2\n4\n"
    assert set_aside(p, lambda i: True, "retried") is None

"""Append-only, crash-safe trajectory log (one JSON object per line).

Format (``docs/provenance.md`` has the full schema and the measurement behind the choice)::

    {"crc":123456789,"rec":{...trajectory...}}\\n

* ``rec`` holds the per-trajectory metadata as plain JSON and the per-token columns as
  base64 of their little-endian bytes (optionally zlib-compressed), so token ids, versions
  and float32 logprobs round-trip bit-for-bit, NaNs included.
* ``crc`` is the CRC-32 of the exact ``rec`` bytes, a plain JSON integer (so every line is
  strict JSON: ``json.loads``, ``jq`` and ``datasets`` read it). A reader finds the ``rec``
  bytes right after the digits and verifies them without re-serialising. Logs written
  before this change padded the CRC to ten digits (``%010d``: leading zeros, not valid
  JSON); the reader accepts both.
* Every record is one ``write`` of one line, flushed (and ``fsync``-ed when ``durable``):
  the rule of every append-only file of a run, :mod:`provrl.appendlog`. A process killed
  mid-write leaves at most one torn line at the end of the file; readers skip it with a
  warning, and a writer reopening the file moves the torn bytes to a ``.torn`` side file
  (nothing is thrown away) before appending.
* A record in the middle of a file that fails its CRC or does not parse is corruption,
  not a torn write: readers raise :class:`CorruptLogError` naming the file and line
  (or, with ``strict=False``, skip it with a warning). Every way a record can be bad —
  malformed JSON, wrong types, bad base64 or zlib, a column of the wrong length, a
  non-numeric reward, a record over :data:`MAX_RECORD_BYTES` or a trajectory over
  :data:`MAX_TOKENS` tokens — is such an error; decompression never expands a column past
  the size its token count implies.
"""

from __future__ import annotations

import base64
import os
import warnings
import zlib
from collections.abc import Iterable, Iterator
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from provrl.appendlog import AppendLog, read_lines
from provrl.appendlog import TornRecordWarning as TornRecordWarning  # re-exported
from provrl.appendlog import repair_torn_tail as repair_torn_tail  # re-exported
from provrl.provenance import (
    TOKEN_COLUMNS,
    Identity,
    ProvenanceError,
    SamplingParams,
    Segment,
    ToolCall,
    Trajectory,
)

FORMAT_VERSION = 1
_PREFIX = b'{"crc":'
_REC = b',"rec":'
MAX_RECORD_BYTES = 256 << 20
"""Longest line a reader accepts (a trajectory of MAX_TOKENS tokens needs ~10 bytes/token
uncompressed); anything longer is a corrupt record, not a reason to exhaust memory."""
MAX_TOKENS = 1 << 24
"""Most tokens one trajectory may hold (16.7 M; writers refuse more, readers too)."""
_BAD_RECORD = (
    ValueError,  # includes orjson.JSONDecodeError, binascii.Error, ProvenanceError
    KeyError,
    TypeError,
    AttributeError,
    IndexError,
    OverflowError,
    RecursionError,
    zlib.error,
)


class CorruptLogError(ValueError):
    """A trajectory log line in the middle of a file is unreadable."""


# ------------------------------------------------------------------------- encoding
def _encode_column(arr: np.ndarray, compress: bool) -> str:
    raw = arr.tobytes()
    if compress:
        raw = zlib.compress(raw, 1)
    return base64.b64encode(raw).decode("ascii")


def _decode_column(s: str, dtype: np.dtype[Any], n: int, compressed: bool) -> np.ndarray:
    raw = base64.b64decode(s, validate=True)
    if compressed:
        size = n * dtype.itemsize
        d = zlib.decompressobj()
        raw = d.decompress(raw, max(size, 1))  # never more than the column can hold
        if d.unconsumed_tail or not d.eof:
            raise ValueError(f"compressed column does not hold exactly {n} entries")
    if len(raw) != n * dtype.itemsize:
        raise ValueError(f"column has {len(raw)} bytes, expected {n} × {dtype.itemsize}")
    arr = np.frombuffer(raw, dtype=dtype)
    if arr.shape[0] != n:
        raise ValueError(f"column has {arr.shape[0]} entries, expected {n}")
    return arr.copy()  # writable, owns its memory


def trajectory_to_record(traj: Trajectory, compress: bool = True) -> dict[str, Any]:
    """The JSON-able record for one trajectory (columns as base64 bytes)."""
    return {
        "format": FORMAT_VERSION,
        "traj_id": traj.traj_id,
        "task_id": traj.task_id,
        "n": len(traj),
        "z": compress,
        "tokens": {name: _encode_column(getattr(traj, name), compress) for name in TOKEN_COLUMNS},
        "segments": [[s.kind, s.start, s.end, s.turn] for s in traj.segments],
        "tool_calls": [asdict(c) for c in traj.tool_calls],
        "reward": traj.reward,
        "metrics": traj.metrics,
        "timings": traj.timings,
        "sampling": traj.sampling.to_dict(),
        "policy": asdict(traj.policy),
        "tools": asdict(traj.tools),
        "meta": traj.meta,
    }


def record_to_trajectory(rec: dict[str, Any]) -> Trajectory:
    """The trajectory of a decoded record; any malformed part raises ``ValueError`` (or
    :class:`ProvenanceError`) saying what is wrong."""
    if not isinstance(rec, dict):
        raise ValueError(f"record must be a JSON object, got {type(rec).__name__}")
    if rec.get("format") != FORMAT_VERSION:
        raise ValueError(f"unknown record format {rec.get('format')!r}")
    n = rec["n"]
    if not isinstance(n, int) or isinstance(n, bool) or not 0 <= n <= MAX_TOKENS:
        raise ValueError(f"field 'n' must be an integer in [0, {MAX_TOKENS}], got {n!r}")
    cols = {
        name: _decode_column(rec["tokens"][name], dtype, n, bool(rec.get("z", False)))
        for name, dtype in TOKEN_COLUMNS.items()
    }
    traj = Trajectory.from_columns(
        rec["traj_id"],
        rec["task_id"],
        cols,
        segments=[Segment(k, s, e, t) for k, s, e, t in rec["segments"]],
        tool_calls=[ToolCall(**c) for c in rec["tool_calls"]],
        reward=rec["reward"],
        metrics=rec["metrics"],
        timings=rec["timings"],
        sampling=SamplingParams.from_dict(rec["sampling"]),
        policy=Identity(**rec["policy"]),
        tools=Identity(**rec["tools"]),
        meta=rec["meta"],
    )
    traj.validate_metadata()  # a string reward fails here, not 25 s into training
    return traj


def encode_line(traj: Trajectory, compress: bool = True) -> bytes:
    """One complete log line (with trailing newline) for ``traj``: strict JSON."""
    if len(traj) > MAX_TOKENS:
        raise ProvenanceError(
            f"trajectory {traj.traj_id!r}: {len(traj)} tokens, more than a log record "
            f"holds ({MAX_TOKENS})"
        )
    body = orjson.dumps(trajectory_to_record(traj, compress), option=orjson.OPT_SERIALIZE_NUMPY)
    return b"%s%d%s%s}\n" % (_PREFIX, zlib.crc32(body), _REC, body)


def decode_line(line: bytes) -> Trajectory:
    """Parse and CRC-check one line (without or with its newline). Any defect raises
    ``ValueError`` with what is wrong (the reader adds the file and line)."""
    line = line.rstrip(b"\n")
    if not line.startswith(_PREFIX) or not line.endswith(b"}"):
        raise ValueError("not a provrl trajectory record")
    # ≤ 10 digits: CRC-32 < 2^32; old logs zero-padded them to exactly 10
    end = line.find(_REC, len(_PREFIX), len(_PREFIX) + 10 + len(_REC))
    digits = line[len(_PREFIX) : end]
    if end < 0 or not digits.isdigit():
        raise ValueError("record has no CRC prefix")
    body = line[end + len(_REC) : -1]
    if zlib.crc32(body) != int(digits):
        raise ValueError("CRC mismatch")
    try:
        return record_to_trajectory(orjson.loads(body))
    except ValueError:
        raise
    except KeyError as e:
        raise ValueError(f"missing field {e}") from e
    except _BAD_RECORD as e:
        raise ValueError(f"{type(e).__name__}: {e}") from e


# ------------------------------------------------------------------------- writing
class TrajectoryWriter:
    """Append trajectories to a log file; safe to kill at any moment.

    Parameters
    ----------
    path: the ``.jsonl`` file (created with its parent directories).
    durable: ``fsync`` after every record (survives power loss, not just process death).
    compress: zlib-compress the per-token columns (level 1).
    validate: check the provenance invariant before writing (recommended).
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        durable: bool = False,
        compress: bool = True,
        validate: bool = True,
    ) -> None:
        self.path = Path(path)
        self.durable, self.compress, self.validate = durable, compress, validate
        self._log = AppendLog(self.path, durable=durable)  # a torn tail moved aside first
        self.records_written = 0

    def write(self, traj: Trajectory) -> None:
        if self.validate:
            traj.validate()
        self._log.append(encode_line(traj, self.compress))
        self.records_written += 1

    def write_many(self, trajs: Iterable[Trajectory]) -> None:
        for t in trajs:
            self.write(t)

    def close(self) -> None:
        self._log.close()

    def __enter__(self) -> TrajectoryWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# ------------------------------------------------------------------------- reading
def read_trajectories(
    path: str | os.PathLike[str],
    *,
    strict: bool = True,
    follow: bool = False,
    poll_s: float = 0.05,
    idle_timeout_s: float | None = None,
) -> Iterator[Trajectory]:
    """Stream trajectories from a log.

    A torn final line (no newline) is skipped with a :class:`TornRecordWarning`. A bad line
    followed by more data raises :class:`CorruptLogError` with the file and 1-based line
    number (``strict=False``: warn and skip). With ``follow=True`` the reader tails the file
    like ``tail -f`` (a partial last line is waited for) until ``idle_timeout_s`` passes
    without new data (``None``: forever).
    """
    lines = read_lines(
        path,
        error=CorruptLogError,
        max_line_bytes=MAX_RECORD_BYTES,
        follow=follow,
        poll_s=poll_s,
        idle_timeout_s=idle_timeout_s,
    )
    for lineno, line in lines:
        try:
            yield decode_line(line)
        except _BAD_RECORD as e:
            msg = f"{path}:{lineno}: unreadable trajectory record ({e})"
            if strict:
                raise CorruptLogError(msg) from e
            warnings.warn(msg, stacklevel=2)


def read_all(path: str | os.PathLike[str], *, strict: bool = True) -> list[Trajectory]:
    return list(read_trajectories(path, strict=strict))

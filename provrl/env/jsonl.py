"""Reading a user's JSONL file record by record, with errors that name the file and line.

Bounded (a user's file is untrusted input): a line longer than ``max_line_bytes`` is an
error, found without reading the rest of the line into memory, and so is a file with more
than ``max_records`` records; orjson refuses JSON nested deeper than 1024 levels.
"""

from __future__ import annotations

import os
from collections.abc import Generator
from pathlib import Path
from typing import Any

import orjson

MAX_LINE_BYTES = 64 << 20
"""Longest line read by default (a long document fits; a runaway file does not)."""
MAX_RECORDS = 10_000_000
"""Most records read from one file by default."""


def iter_records(
    path: str | os.PathLike[str],
    error: type[Exception],
    what: str = "file",
    *,
    max_line_bytes: int = MAX_LINE_BYTES,
    max_records: int = MAX_RECORDS,
) -> Generator[tuple[int, Any], None, None]:
    """``(line number, decoded JSON)`` for every non-blank line of ``path``. A missing file,
    a line that is not JSON or over ``max_line_bytes``, or more than ``max_records``
    records raise ``error`` naming ``path`` (and ``path:line``)."""
    p = Path(path)
    if not p.is_file():
        raise error(f"{p}: no such {what}")
    with open(p, "rb") as f:
        lineno = records = 0
        while line := f.readline(max_line_bytes + 1):
            lineno += 1
            if len(line) > max_line_bytes:
                raise error(f"{p}:{lineno}: line longer than {max_line_bytes} bytes")
            if not line.strip():
                continue
            records += 1
            if records > max_records:
                raise error(f"{p}:{lineno}: more than {max_records} records in one {what}")
            try:
                yield lineno, orjson.loads(line)
            except orjson.JSONDecodeError as e:
                raise error(f"{p}:{lineno}: invalid JSON ({json_error(e, line)})") from None


def json_error(e: orjson.JSONDecodeError, line: bytes) -> str:
    """The reason of a JSON error in one line, with its column in that line — not the
    decoder's own "line 2 column 1", which counts the line's newline as a second line."""
    text = line.decode("utf-8", "replace").rstrip("\r\n")
    col = min(e.pos, len(text)) + 1
    return f"{e.msg} at column {col}" + (" (end of line)" if e.pos >= len(text) else "")

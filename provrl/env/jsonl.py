"""Reading a user's JSONL file record by record, with errors that name the file and line."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson


def iter_records(
    path: str | os.PathLike[str], error: type[Exception], what: str = "file"
) -> Iterator[tuple[int, Any]]:
    """``(line number, decoded JSON)`` for every non-blank line of ``path``. A missing file
    or a line that is not JSON raises ``error`` naming ``path`` (and ``path:line``)."""
    p = Path(path)
    if not p.is_file():
        raise error(f"{p}: no such {what}")
    with open(p, "rb") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                yield lineno, orjson.loads(line)
            except orjson.JSONDecodeError as e:
                raise error(f"{p}:{lineno}: invalid JSON ({e})") from None

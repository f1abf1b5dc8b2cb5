"""The crash-consistency rule of every append-only file of a run (``trajectories.jsonl``,
``metrics.jsonl``, ``steps.jsonl``, ``resume.log``): one newline-terminated record per line.

* **Writing** (:class:`AppendLog`): each record is one ``write`` of one whole line (flushed,
  ``fsync``-ed when ``durable``). Before the first append, a torn tail — the last line cut
  short by a process killed mid-write — is moved to a ``<name>.torn-<µs>`` side file
  (:func:`repair_torn_tail`; nothing is deleted), so the next record starts on its own line
  instead of being glued onto the fragment. A write that fails (disk full, read-only file
  system, no permission) truncates the file back to its last whole line and raises
  :class:`~provrl._sys.WriteError` naming the file.
* **Reading** (:func:`read_lines`): every complete line with its 1-based number; a torn last
  line (no newline) is skipped with a :class:`TornRecordWarning`. What a line must hold is
  the reader's business (the trajectory log checks a CRC, the step and metrics readers parse
  JSON); a bad line that *is* newline-terminated is corruption, not a torn write.
* **Setting lines aside** (:func:`set_aside`): a log rewritten to keep only some of its lines
  — the rest go to a ``<name>.<reason>-<µs>`` side file, so even a line a resume no longer
  wants is kept.
"""

from __future__ import annotations

import contextlib
import os
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path

from provrl._sys import write_all, write_atomic, writing

MAX_LINE_BYTES = 256 << 20
"""Longest line :func:`read_lines` accepts by default; a longer one is an error, found without
reading it whole."""


class TornRecordWarning(UserWarning):
    """The last line of a log was cut short (a writer died mid-record); it was skipped."""


def repair_torn_tail(path: str | os.PathLike[str]) -> Path | None:
    """If the file ``path`` ends mid-line (a writer died mid-record), move the torn bytes to
    ``<name>.torn-<µs>`` beside it — nothing is deleted — so appends start on a fresh line.
    Warns with :class:`TornRecordWarning`; returns the side file, or None."""
    path = Path(path)
    if not path.exists() or path.stat().st_size == 0:
        return None
    with writing(path), open(path, "rb+") as f:
        size = f.seek(0, os.SEEK_END)
        f.seek(size - 1)
        if f.read(1) == b"\n":
            return None
        start, pos = 0, size  # the start of the last line
        while pos > 0:
            step = min(1 << 16, pos)
            pos -= step
            f.seek(pos)
            k = f.read(step).rfind(b"\n")
            if k >= 0:
                start = pos + k + 1
                break
        f.seek(start)
        torn = f.read()
        side = path.with_name(f"{path.name}.torn-{int(time.time() * 1e6)}")
        side.write_bytes(torn)
        f.truncate(start)
    warnings.warn(
        f"{path}: last record was torn ({len(torn)} bytes); moved to {side.name}",
        TornRecordWarning,
        stacklevel=3,
    )
    return side


class AppendLog:
    """An append-only file of newline-terminated records; safe to kill at any moment (see
    the module docstring).

    >>> with AppendLog("runs/x/steps.jsonl") as log:
    ...     log.append(b'{"step": 1}\\n')
    """

    def __init__(self, path: str | os.PathLike[str], *, durable: bool = False) -> None:
        """Open ``path`` for appending (created with its parent directories) after moving a
        torn tail aside; ``durable``: ``fsync`` after every record (survives power loss, not
        just process death)."""
        self.path, self.durable = Path(path), durable
        with writing(self.path):
            self.path.parent.mkdir(parents=True, exist_ok=True)
            repair_torn_tail(self.path)
            self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)
        self._size = os.fstat(self._fd).st_size

    def append(self, line: bytes) -> None:
        """Write one whole record (``line`` ends with its newline) in one go; on failure the
        file is cut back to its last whole line and :class:`~provrl._sys.WriteError` (or the
        original error) is raised."""
        if not line.endswith(b"\n") or b"\n" in line[:-1]:
            raise ValueError(f"{self.path}: a record is one line ending with a newline")
        with writing(self.path):
            try:
                write_all(self._fd, line)
                if self.durable:
                    os.fsync(self._fd)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.ftruncate(self._fd, self._size)  # never leave half a record behind
                raise
        self._size += len(line)

    def fileno(self) -> int:
        return self._fd

    @property
    def closed(self) -> bool:
        return self._fd < 0

    def close(self) -> None:
        if self._fd >= 0:
            fd, self._fd = self._fd, -1
            os.close(fd)

    def __enter__(self) -> AppendLog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def read_lines(
    path: str | os.PathLike[str],
    *,
    error: type[Exception] = ValueError,
    max_line_bytes: int = MAX_LINE_BYTES,
    follow: bool = False,
    poll_s: float = 0.05,
    idle_timeout_s: float | None = None,
) -> Iterator[tuple[int, bytes]]:
    """``(line number, line with its newline)`` for every complete line of ``path``.

    A torn last line (no newline) is skipped with a :class:`TornRecordWarning`; a line over
    ``max_line_bytes`` raises ``error`` naming the file and line. With ``follow=True`` the
    reader tails the file like ``tail -f`` (a partial last line is waited for) until
    ``idle_timeout_s`` passes without new data (``None``: forever)."""
    path = Path(path)
    lineno = 0
    with open(path, "rb") as f:
        pending = b""
        idle_since = time.monotonic()
        while True:
            line = f.readline(max_line_bytes + 1 - len(pending))
            if line:
                idle_since = time.monotonic()
            if len(pending) + len(line) > max_line_bytes:
                raise error(f"{path}:{lineno + 1}: record longer than {max_line_bytes} bytes")
            if line.endswith(b"\n"):
                line, pending = pending + line, b""
                lineno += 1
                yield lineno, line
                continue
            pending += line
            if not follow:
                if pending:
                    warnings.warn(
                        f"{path}:{lineno + 1}: torn last record ({len(pending)} bytes) skipped",
                        TornRecordWarning,
                        stacklevel=3,
                    )
                return
            if idle_timeout_s is not None and time.monotonic() - idle_since > idle_timeout_s:
                return
            time.sleep(poll_s)


def set_aside(
    path: str | os.PathLike[str], keep: Callable[[int], bool], reason: str
) -> Path | None:
    """Rewrite the log ``path`` (atomically) with only its complete lines whose 0-based index
    ``keep`` accepts; the others go, in order, to ``<name>.<reason>-<µs>`` beside it (written
    first: nothing is deleted). Returns the side file, or None when every line was kept.
    No writer may hold ``path`` open meanwhile."""
    path = Path(path)
    kept: list[bytes] = []
    moved: list[bytes] = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", TornRecordWarning)
        for i, (_, line) in enumerate(read_lines(path)):
            (kept if keep(i) else moved).append(line)
    if not moved:
        return None
    side = path.with_name(f"{path.name}.{reason}-{int(time.time() * 1e6)}")
    write_atomic(side, b"".join(moved))
    write_atomic(path, b"".join(kept))
    warnings.warn(
        f"{path}: {len(moved)} line(s) set aside in {side.name} ({reason})",
        SetAsideWarning,
        stacklevel=2,
    )
    return side


class SetAsideWarning(UserWarning):
    """Lines of a log were moved to a side file (a resume reconciling it with a checkpoint)."""

"""The RL stage's step record, kept crash-consistent with its checkpoints.

``RUN/rl/steps.jsonl`` has one line per step (the batch's statistics and the trainer's
metrics); ``RUN/rl/metrics.jsonl`` the same steps as the metrics sink's rows. Both are
append-only (:mod:`provrl.appendlog`), but a step is *committed* only by its checkpoint:

* **written with its checkpoint** — ``ckpt-vN/steps.jsonl`` holds the lines of steps 1…N and
  is written before the checkpoint's ``COMPLETE`` marker (:func:`keep_in_checkpoint`), so a
  complete checkpoint always carries its own step record;
* **rebuilt from it on resume** (:func:`restore_steps`) — ``RUN/rl/steps.jsonl`` is made to
  hold exactly the checkpoint's lines: a line a kill lost between ``COMPLETE`` and the
  append is written again, a torn tail is moved aside (``.torn-<µs>``); and
  :func:`restore_metrics` sets aside the metrics rows of a step the checkpoint does not hold
  (an attempt a kill interrupted; it is trained again) in ``metrics.jsonl.retried-<µs>``.

So after any kill and resume the step records are contiguous 1…N, N the checkpoint's step
count, and nothing written is deleted.
"""

from __future__ import annotations

import json
import os
import warnings
from pathlib import Path
from typing import Any

from provrl._sys import write_atomic
from provrl.appendlog import AppendLog, TornRecordWarning, read_lines, set_aside
from provrl.report.metrics import read_metrics

STEPS = "steps.jsonl"
"""The step record's name, in ``RUN/rl/`` and in every checkpoint."""


class StepLogError(ValueError):
    """A step record is unreadable; the message names the file and line."""


def step_line(record: dict[str, Any]) -> bytes:
    """One line of ``steps.jsonl`` for ``record``."""
    return (json.dumps(record, default=float) + "\n").encode()


def step_lines(path: str | os.PathLike[str]) -> list[bytes]:
    """The complete lines of a step record (a torn last line is skipped with a warning); a
    bad line in the middle raises :class:`StepLogError` naming the file and line."""
    out = []
    for lineno, line in read_lines(path, error=StepLogError):
        if not line.strip():
            continue
        try:
            json.loads(line)
        except json.JSONDecodeError as e:
            raise StepLogError(f"{path}:{lineno}: unreadable step record ({e.msg})") from None
        out.append(line)
    return out


def read_steps(run_dir: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The per-step records of a run's RL stage (``RUN/rl/steps.jsonl``)."""
    p = Path(run_dir) / "rl" / STEPS
    if not p.is_file():
        return []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", TornRecordWarning)  # a kill's torn last line
        return [json.loads(line) for line in step_lines(p)]


def keep_in_checkpoint(ckpt: Path, lines: list[bytes]) -> None:
    """Write the lines of steps 1…N into checkpoint ``ckpt`` (atomically, before its
    ``COMPLETE``)."""
    write_atomic(ckpt / STEPS, b"".join(lines))


def restore_steps(rl_dir: Path, ckpt: Path | None) -> list[bytes]:
    """Make ``rl_dir/steps.jsonl`` hold exactly the step lines checkpoint ``ckpt`` holds
    (none without a checkpoint) and return them: lines it lacks are appended, lines past them
    (never written by this ordering, but possible in an edited run) set aside. A checkpoint
    written before step records were kept in it leaves the file as it is."""
    path = rl_dir / STEPS
    if ckpt is not None and not (ckpt / STEPS).is_file():
        return step_lines(path) if path.is_file() else []
    want = step_lines(ckpt / STEPS) if ckpt is not None else []
    with AppendLog(path):  # a torn tail moved aside
        pass
    have = step_lines(path)
    common = 0
    while common < min(len(have), len(want)) and have[common] == want[common]:
        common += 1
    if common < len(have):
        set_aside(path, lambda i: i < common, "stale")
    if common < len(want):
        with AppendLog(path) as log:
            for line in want[common:]:
                log.append(line)
    return want


def restore_metrics(path: Path, steps: int) -> set[int]:
    """Set aside the rows of ``metrics.jsonl`` whose step is past ``steps`` (interrupted
    attempts) and return the steps that already have their batch row (``rl_batch/…``)."""
    if not path.is_file():
        return set()
    with AppendLog(path):  # a torn tail moved aside
        pass
    rows = read_metrics(path)
    if any(int(r.get("step", 0)) > steps for r in rows):
        set_aside(path, lambda i: int(rows[i].get("step", 0)) <= steps, "retried")
    return {
        int(r["step"])
        for r in rows
        if int(r.get("step", 0)) <= steps and any(k.startswith("rl_batch/") for k in r)
    }

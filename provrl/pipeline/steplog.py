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

Damage, not only kills (:func:`resume_checkpoint`): every checkpoint carries the CRC-32 of
each of its files (:func:`~provrl.models.checkpoint.write_manifest`) and the newest
``pipeline.loop.save_total_limit`` complete ones are kept. On resume the newest is checked
against its checksums; a damaged ``steps.jsonl`` whose lines ``RUN/rl/steps.jsonl`` still
holds byte for byte (the CRC says so) is written back; any other damage sets the checkpoint
aside (``RUN/rl/damaged-ckpt-vN-<µs>``) and the previous one is used — one warning line
each — and the steps it lacks are *redone exactly*: their records name the trajectories each
trained, in order, and the trajectory log still holds them (:func:`redo_groups`). The count
of step records is checked against the checkpoint's ``state.steps``
(:func:`restore_steps`): a shortfall is filled from the other durable copy or refused, never
resolved by dropping a good line.
"""

from __future__ import annotations

import json
import os
import warnings
import zlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from provrl._sys import write_atomic
from provrl.appendlog import AppendLog, TornRecordWarning, read_lines, set_aside
from provrl.env.tasks import Task
from provrl.models.checkpoint import MANIFEST, CheckpointError, check_checkpoint_dir, damaged_files
from provrl.pipeline.rundir import ResumeWarning, RunDir
from provrl.provenance import Trajectory
from provrl.report.metrics import read_metrics
from provrl.rollout.collector import Group

STEPS = "steps.jsonl"
"""The step record's name, in ``RUN/rl/`` and in every checkpoint."""


class StepLogError(ValueError):
    """A step record is unreadable; the message names the file and line."""


def step_line(record: dict[str, Any]) -> bytes:
    """One line of ``steps.jsonl`` for ``record``: strict JSON, a statistic that does not
    exist (tool calls per solved episode in a batch that solved nothing) as ``null``."""
    from provrl._sys import strict_dumps

    return (strict_dumps(record, default=float) + "\n").encode()


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


def restore_steps(rl_dir: Path, ckpt: Path | None, steps: int | None = None) -> list[bytes]:
    """Make ``rl_dir/steps.jsonl`` hold exactly the step lines checkpoint ``ckpt`` holds
    (none without a checkpoint) and return them: lines it lacks are appended, lines past them
    (never written by this ordering, but possible in an edited run) set aside. A checkpoint
    written before step records were kept in it leaves the file as it is.

    ``steps``: the checkpoint's ``state.steps``. Fewer lines in the checkpoint than that are
    filled from ``rl_dir/steps.jsonl`` where it holds them after the same first lines (and
    written back into the checkpoint), with one warning line; otherwise, or with more lines
    than steps, :class:`StepLogError` — a good line is never dropped to make them agree."""
    path = rl_dir / STEPS
    if ckpt is not None and not (ckpt / STEPS).is_file():
        return step_lines(path) if path.is_file() else []
    with AppendLog(path):  # a torn tail moved aside
        pass
    want = step_lines(ckpt / STEPS) if ckpt is not None else []
    have = step_lines(path) if path.is_file() else []
    if ckpt is not None and steps is not None and len(want) != steps:
        if len(want) < steps <= len(have) and have[: len(want)] == want:
            had, want = len(want), have[:steps]
            keep_in_checkpoint(ckpt, want)
            warnings.warn(
                f"{ckpt / STEPS}: {had} step records for {steps} steps; the missing "
                f"ones restored from {path}",
                ResumeWarning,
                stacklevel=2,
            )
        else:
            raise StepLogError(
                f"{ckpt / STEPS}: {len(want)} step records, but the checkpoint says "
                f"{steps} steps and {path} cannot supply the difference; restore the file "
                "or move the checkpoint aside to resume from the one before"
            )
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


# ---------------------------------------------------------------------- damaged checkpoints
@dataclass
class Resume:
    """Where a resumed RL stage starts (:func:`resume_checkpoint`)."""

    checkpoint: tuple[int, Path] | None
    """(version, dir) of the newest complete checkpoint whose files are intact, or None."""
    lost: list[dict[str, Any]] = field(default_factory=list)
    """The records of the steps a damaged newer checkpoint had committed, in order: to redo
    exactly (:func:`redo_groups`)."""
    notes: list[str] = field(default_factory=list)
    """What was repaired or set aside, one line each (also warned)."""


def checkpoint_problem(ckpt: Path, steps_log: Path) -> str | None:
    """Why checkpoint ``ckpt`` cannot be resumed from, or None. A ``steps.jsonl`` that fails
    its checksum is first written back from the lines ``steps_log`` holds when they match
    the checksum exactly (one warning line)."""
    bad = damaged_files(ckpt)
    if bad is None:  # written before checksums: what can be checked without them
        try:
            check_checkpoint_dir(ckpt)
            json.loads((ckpt / "state.json").read_text())
        except (CheckpointError, OSError, ValueError) as e:
            return str(e).removeprefix(f"{ckpt}/").removeprefix(f"{ckpt}: ")
        return None
    if not bad or (set(bad) == {STEPS} and _repair_steps(ckpt, steps_log)):
        return None
    return "; ".join(f"{name}: {why}" for name, why in bad.items())


def _repair_steps(ckpt: Path, steps_log: Path) -> bool:
    """Write ``ckpt/steps.jsonl`` back from the first lines of ``steps_log`` if they are the
    bytes its manifest describes (size and CRC-32)."""
    want = json.loads((ckpt / MANIFEST).read_text())["files"][STEPS]
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", TornRecordWarning)
            lines = step_lines(steps_log) if steps_log.is_file() else []
    except StepLogError:
        return False
    data = b""
    for line in lines:
        if len(data) >= want["bytes"]:
            break
        data += line
    if len(data) != want["bytes"] or zlib.crc32(data) != want["crc32"]:
        return False
    write_atomic(ckpt / STEPS, data)
    warnings.warn(
        f"{ckpt / STEPS}: damaged; written back from {steps_log} (the same bytes: the "
        "checksum matches)",
        ResumeWarning,
        stacklevel=3,
    )
    return True


def resume_checkpoint(run: RunDir) -> Resume:
    """The checkpoint a resumed RL stage starts from: the newest complete one whose files
    match their checksums (:func:`checkpoint_problem`). Each damaged newer one is set aside
    (``damaged-ckpt-vN-<µs>``, nothing deleted) with one warning line, and the records of
    the steps it had committed are returned to be redone (``lost``), read from its own
    ``steps.jsonl`` if that is intact, else from ``RUN/rl/steps.jsonl``."""
    steps_log = run.root / "rl" / STEPS
    complete = run.checkpoints()
    damaged: list[tuple[int, Path, str]] = []
    out = Resume(None)
    while complete:
        version, ckpt = complete.pop()
        why = checkpoint_problem(ckpt, steps_log)
        if why is None:
            out.checkpoint = (version, ckpt)
            break
        damaged.append((version, ckpt, why))
    if not damaged:
        return out
    base = out.checkpoint[0] if out.checkpoint else 0
    lost = _lost_records(damaged, steps_log, base)
    for version, ckpt, why in damaged:
        moved = run.set_aside(ckpt)
        back = out.checkpoint[1].name if out.checkpoint else "the start policy"
        note = (
            f"{ckpt}: damaged ({why}); set aside as {moved.name}, resuming from {back}: "
            f"step(s) {base + 1}…{version} "
            + (
                "redone exactly from the trajectory log"
                if len(lost) >= version - base
                else "trained again (their records are lost)"
            )
        )
        out.notes.append(note)
        warnings.warn(note, ResumeWarning, stacklevel=2)
    out.lost = lost
    return out


def _lost_records(
    damaged: list[tuple[int, Path, str]], steps_log: Path, base: int
) -> list[dict[str, Any]]:
    """The records of steps ``base + 1``… in order, as long as they run without a gap: from
    the newest damaged checkpoint's ``steps.jsonl`` when it is intact, else the run's."""
    sources = [ckpt / STEPS for _, ckpt, why in damaged if f"{STEPS}:" not in why]
    sources.append(steps_log)
    for src in sources:
        if not src.is_file():
            continue
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", TornRecordWarning)
                records = [json.loads(line) for line in step_lines(src)]
        except StepLogError:
            continue
        out: list[dict[str, Any]] = []
        for r in records:
            if int(r.get("step", 0)) == base + 1 + len(out):
                out.append(r)
        if out:
            return out
    return []


def redo_groups(
    records: list[dict[str, Any]], trajectories: Mapping[str, Trajectory], tasks: Mapping[str, Task]
) -> list[Group]:
    """The groups the steps of ``records`` trained, in the order they trained them (each
    record's ``trained`` ids, cut where the group changes), rebuilt from ``trajectories``
    (by id: the trajectory and probe logs). Stops at the first step one of whose
    trajectories or tasks is gone: that step and the later ones are trained afresh."""
    out: list[Group] = []
    for record in records:
        step: list[Group] = []
        for tid in record.get("trained", []):
            t = trajectories.get(tid)
            if t is None or t.task_id not in tasks:
                return out
            key = str(t.meta.get("group") or "")
            r = int(key.rsplit("#r", 1)[1]) if "#r" in key else 0  # the probe's: round 0
            if not step or (step[-1].task.task_id, step[-1].round) != (t.task_id, r):
                step.append(Group(tasks[t.task_id], r, []))
            step[-1].trajectories.append(t)
        out += step
    return out

"""The RL stage's durable state — checkpoints, step record, what a resume reads back — kept
crash-consistent (:class:`StepLog`: the loop's one handle on ``RUN/rl``).

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
import time
import warnings
import zlib
from collections import defaultdict
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from provrl._sys import write_atomic, write_json, writing
from provrl.appendlog import AppendLog, TornRecordWarning, read_lines, set_aside
from provrl.env.tasks import Task
from provrl.failpoints import failpoint
from provrl.models.checkpoint import (
    MANIFEST,
    CheckpointError,
    check_checkpoint_dir,
    damaged_files,
    removed_unless_complete,
    write_manifest,
)
from provrl.pipeline.probe import probe_groups
from provrl.pipeline.rl_stats import SignalCount, batch_row
from provrl.pipeline.rundir import COMPLETE, ResumeWarning, RunDir
from provrl.provenance import Trajectory
from provrl.report.metrics import MetricsWriter, read_metrics
from provrl.rollout.collector import Group
from provrl.train.learner import Learner, NonFiniteGuard
from provrl.trajlog import read_trajectories

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


# ---------------------------------------------------------------------- the stage's durable state
@dataclass
class RLState:
    """What a checkpoint stores besides weights and optimizer (``state.json``)."""

    version: int = 0
    steps: int = 0
    trained: list[str] = field(default_factory=list)
    dropped: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    """Trajectories of groups without signal (all rewards equal): never trained."""
    nonfinite: list[str] = field(default_factory=list)
    """Trajectories of batches whose update was not finite (refused): never trained."""
    nonfinite_steps: int = 0
    """Refused (non-finite) step attempts so far (:class:`~provrl.train.learner.NonFiniteGuard`)."""
    wall_s: float = 0.0
    trainer_busy_s: float = 0.0
    signal: dict[str, Any] = field(default_factory=dict)
    """The finished groups' signal count as the last step left it
    (:meth:`~provrl.pipeline.rl_stats.SignalCount.durable`)."""

    def done(self) -> set[str]:
        """Trajectories settled for good: trained, dropped, skipped or refused."""
        return {*self.trained, *self.dropped, *self.skipped, *self.nonfinite}


class StepLog:
    """``RUN/rl`` as the RL loop reads it back and commits to it, step by step::

        log = StepLog(run, start_policy)   # the newest intact checkpoint (damaged ones set
                                           # aside), its state, steps.jsonl restored to it
        log.policy, log.state.version      # what to load: the checkpoint, or the start policy
        log.restore(tasks, k, metrics)     # the probe's groups and the log read back: its
                                           # untrained groups, a lost step's batch
        log.counters(limit)                # non-finite guard and signal count, as kept
        log.commit(version, record, ...)   # checkpoint u+1 with its record, then steps.jsonl

    Between two durable writes of :meth:`commit` there is a failpoint (``PROVRL_FAILPOINT``;
    the crash tests kill at each)::

        weights + optimizer ─ rl.ckpt.weights ─ state.json + step record in the checkpoint ─
        rl.ckpt.state ─ COMPLETE ─ rl.ckpt.complete ─ older checkpoint pruned ─
        rl.ckpt.pruned ─ steps.jsonl ─ rl.recorded ─ metrics row
    """

    def __init__(self, run: RunDir, start_policy: str) -> None:
        self.run, self.rl_dir, self.start_policy = run, run.stage("rl"), start_policy
        self.resume = resume_checkpoint(run)  # a damaged newest: the one before
        latest = self.resume.checkpoint
        self.checkpoint = None if latest is None else latest[1]
        """The checkpoint the stage resumes from (None: it starts from ``start_policy``)."""
        self.state = RLState()
        if self.checkpoint is not None:
            self.state = RLState(**json.loads((self.checkpoint / "state.json").read_text()))
        self.policy = start_policy if self.checkpoint is None else str(self.checkpoint)
        """The weights to load: the checkpoint's, or the start policy's."""
        self.lines = restore_steps(self.rl_dir, self.checkpoint, self.state.steps)
        """The lines of steps 1…N, as the newest checkpoint holds them (``steps.jsonl``)."""
        self.rows = restore_metrics(self.rl_dir / "metrics.jsonl", self.state.steps)
        """The committed steps whose metrics row exists."""
        self.dropped_before = len(set(self.state.dropped))  # trajectories, earlier sessions
        self.groups_dropped = 0
        """Groups this session dropped as too stale (async)."""
        self.resumed: dict[str, int] = {}
        """What :meth:`read_back` found: trajectories in the log, untrained groups."""
        self.redo: list[Group] = []
        """The groups of the steps a damaged checkpoint lost, in order: the first batches."""
        self.untrained: dict[str, list[Trajectory]] = {}
        """The trajectory log's samples not yet trained, dropped or redone, by group key."""

    @property
    def trajectories(self) -> Path:
        """The stage's trajectory log."""
        return self.rl_dir / "trajectories.jsonl"

    def done(self) -> set[str]:
        """Trajectories never to train again: settled, or in a lost step's batch."""
        return self.state.done() | {t.traj_id for g in self.redo for t in g.trajectories}

    def restore(self, tasks: Mapping[str, Task], k: int, metrics: MetricsWriter) -> tuple[dict[str, Group], list[Trajectory]]:  # fmt: skip
        """What a (resumed) stage starts from: the metrics rows re-sent to ``metrics``
        (:meth:`rebuild_rows`), the probe's complete groups of ``tasks`` (``k`` samples, by
        key) and the trajectory log, read back (:meth:`read_back`)."""
        self.rebuild_rows(metrics)
        probe = probe_groups(self.run.root / "probe", tasks, k)
        return probe, self.read_back(probe.values(), tasks)

    def counters(self, nonfinite_limit: int) -> tuple[NonFiniteGuard, SignalCount]:
        """The run's counters as the checkpoint kept them: non-finite steps skipped (the
        guard raises past ``nonfinite_limit``) and finished groups with and without
        signal."""
        return NonFiniteGuard(nonfinite_limit, self.state.nonfinite_steps), SignalCount.restored(self.state.signal)  # fmt: skip

    def read_back(self, probe: Iterable[Group], tasks: Mapping[str, Task]) -> list[Trajectory]:
        """The trajectory log, read back (returned) with the probe's groups: the batches of
        the steps a damaged checkpoint lost (:attr:`redo`), and the samples of RL groups
        (``task#rN``, a task of ``tasks``) the checkpoint does not account for
        (:attr:`untrained`)."""
        path = self.trajectories
        logged = list(read_trajectories(path)) if path.is_file() else []
        known = {t.traj_id: t for t in logged}
        known |= {t.traj_id: t for g in probe for t in g.trajectories}
        self.redo = redo_groups(self.resume.lost, known, tasks)
        done = self.done()
        untrained: dict[str, list[Trajectory]] = defaultdict(list)
        for t in logged:
            key = str(t.meta.get("group", ""))
            if "#r" in key and t.task_id in tasks and t.traj_id not in done:
                untrained[key].append(t)
        self.untrained = dict(untrained)
        self.resumed = {"trajectories_in_log": len(logged), "untrained_groups": len(untrained)}
        return logged

    def resumable(self, *, sync: bool) -> list[tuple[str, int, list[Trajectory]]]:
        """``(task id, round, samples)`` of the untrained groups to finish; the others are
        dropped: all of them in sync mode (strict on-policy never trains what an earlier
        version sampled), and any holding a version past the checkpoint's (one a damaged
        checkpoint lost)."""
        out = []
        for key, trajs in self.untrained.items():
            task_id, r = key.split("#r")
            ahead = any(t.num_actions and t.version[t.is_action].max() > self.state.version for t in trajs)  # fmt: skip
            if sync or ahead:
                self.state.dropped.extend(t.traj_id for t in trajs)
            else:
                out.append((task_id, int(r), trajs))
        return out

    def drop(self, groups: Sequence[Group]) -> None:
        """Drop ``groups`` as too stale to train (async): never trained, counted."""
        self.state.dropped.extend(t.traj_id for g in groups for t in g.trajectories)
        self.groups_dropped += len(groups)

    def summary(self) -> dict[str, Any]:
        """The stage summary's account of ``RUN/rl``: steps, version, newest checkpoint (or
        the start policy), trajectories trained, groups dropped as stale, what the resume
        read back and repaired."""
        latest = self.run.latest_checkpoint()
        return {
            "steps": self.state.steps,
            "final_version": self.state.version,
            "checkpoint": str(latest[1]) if latest else self.start_policy,
            "trajectories_trained": len(self.state.trained),
            "groups_dropped_stale": self.groups_dropped + self.dropped_before,
            "resumed": self.resumed,
            "resume_notes": self.resume.notes,
        }

    def rebuild_rows(self, metrics: MetricsWriter) -> None:
        """Write the metrics sink's ``rl_batch`` row of every committed step that lacks it (a
        kill between the step's record and its row)."""
        for line in self.lines:
            record = json.loads(line)
            if int(record["step"]) not in self.rows:
                metrics.log(int(record["step"]), batch_row(record), prefix="rl_batch")

    def commit(
        self,
        version: int,
        record: dict[str, Any],
        learner: Learner,
        metrics: MetricsWriter,
        *,
        t_start: float,
        keep: int,
        keep_versions: Collection[int] = (),
    ) -> None:
        """Step N (version u+1, its ``record``): checkpoint ``ckpt-v{u+1}`` — weights,
        optimizer, RNG, :class:`RLState` (``wall_s`` counted from ``t_start``), the records
        of steps 1…N, checksums, ``COMPLETE`` last — then the older checkpoints beyond
        ``keep`` (but ``keep_versions``) pruned, the record appended to ``steps.jsonl`` and its row to ``metrics``."""
        final = self.rl_dir / f"ckpt-v{version}"
        # disk full: one line naming the checkpoint, and the incomplete directory removed
        with writing(final), removed_unless_complete(final):
            learner.save(final, kind="rl", version=version, start_policy=self.start_policy)
            failpoint("rl.ckpt.weights")
            self.state.version = version
            self.state.wall_s = time.perf_counter() - t_start
            write_json(final / "state.json", self.state.__dict__)
            keep_in_checkpoint(final, [*self.lines, step_line(record)])
            failpoint("rl.ckpt.state")
            write_manifest(final)  # the CRC-32 of every file: a resume checks them
            write_atomic(final / COMPLETE, b"")
        self.lines.append(step_line(record))
        failpoint("rl.ckpt.complete")  # committed; the step's record is in the checkpoint only
        self.run.prune_checkpoints(keep=keep, also=keep_versions)
        failpoint("rl.ckpt.pruned")
        with AppendLog(self.rl_dir / STEPS) as log:
            log.append(self.lines[-1])
        failpoint("rl.recorded")
        metrics.log(self.state.steps, batch_row(record), prefix="rl_batch")

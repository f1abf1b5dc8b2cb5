"""The run directory: one folder per stage, a ``done.json`` per finished stage, and the RL
stage's resumable checkpoints.

::

    RUN/config.yaml                   the resolved config, with its sha256 (pinned once a stage
                                      has started: an edit or a changed key is refused)
    RUN/.config.yaml                  the run's own copy of it (names the keys of an edit)
    RUN/resume.log                    execution-only knobs a resume changed (RESUMABLE)
    RUN/sessions.jsonl                one line per start or resume: commit, date, machine,
                                      command (the report's header)
    RUN/warmstart/                    oracle traces, SFT metrics, ckpt/ (safetensors)
    RUN/probe/  RUN/filter/           probe log + manifest; pools kept/unsolved/solved
    RUN/selfsft/                      optional SFT on the policy's own shortest successes
    RUN/rl/trajectories.jsonl         every RL trajectory, appended as it finishes
    RUN/rl/steps.jsonl                one record per step, 1…N (rebuilt from the checkpoint)
    RUN/rl/ckpt-v{N}/                 weights (safetensors) + optimizer.pt + state.json +
                                      steps.jsonl (the records of steps 1…N) +
                                      checksums.json (size, CRC-32 of each), COMPLETE last;
                                      the newest pipeline.loop.save_total_limit are kept
    RUN/rl/damaged-ckpt-v{N}-<µs>/    a checkpoint a resume found damaged, set aside
    RUN/eval/{policy}/                eval.json + trajectories.jsonl per evaluated policy
    RUN/report/                       report.md + PNGs
    RUN/{stage}/done.json             written last: the stage is skipped when it exists

Every JSON file is written to a temporary name and renamed (atomic on POSIX), so a
``kill -9`` leaves either the old or the new file, never half of one; every append-only
file follows :mod:`provrl.appendlog` (a torn tail is moved aside before the next append).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import time
import warnings
from collections.abc import Collection
from pathlib import Path
from typing import Any

from provrl._sys import session_record, strict_dumps, write_json
from provrl.appendlog import AppendLog, TornRecordWarning, read_lines, repair_torn_tail

SESSIONS = "sessions.jsonl"
"""One line per session that ran the run (:meth:`RunDir.record_session`)."""
STAGES = ("world", "warmstart", "probe", "filter", "selfsft", "rl", "eval", "report")
COMPLETE = "COMPLETE"
REDONE_WHEN_TORN = ("probe", "rl")
"""Finished stages redone when one of their logs has a torn record: each resumes from its
own files, reusing every intact record — the probe reruns only the lost episode, with its
own seed (the same K as before); the RL stage rebuilds its step record and metrics rows
from the checkpoint and trains nothing. Other finished stages' torn records are moved
aside."""


class ResumeWarning(UserWarning):
    """A resume repaired a file, redid a stage or fell back to an older checkpoint (one
    line: what and why)."""


class RunDir:
    """Paths and stage bookkeeping of one run."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)

    def stage(self, name: str) -> Path:
        if name not in STAGES:
            raise ValueError(f"unknown stage {name!r} (stages: {', '.join(STAGES)})")
        p = self.root / name
        p.mkdir(parents=True, exist_ok=True)
        return p

    def started(self) -> bool:
        """Whether any stage has begun writing here (a stage's directory exists): from then
        on the run's config is pinned (:mod:`provrl.pipeline.pin`)."""
        return any((self.root / name).is_dir() for name in STAGES)

    def done(self, name: str) -> dict[str, Any] | None:
        """The stage's summary if it finished, else None."""
        p = self.root / name / "done.json"
        if not p.is_file():
            return None
        try:
            out: dict[str, Any] = json.loads(p.read_text())
        except json.JSONDecodeError as e:
            raise ValueError(f"{p}: corrupt stage marker ({e}); delete it to redo the stage") from e
        return out

    def check_finished_logs(self, name: str) -> bool:
        """Whether the finished stage ``name`` must be redone: every append-only log of it
        (``*.jsonl``, outside checkpoints) is checked for a torn last record — a stage of
        :data:`REDONE_WHEN_TORN` is then redone, any other has the torn bytes moved aside
        (``<log>.torn-<µs>``, nothing deleted). One warning line per log says which."""
        redo = False
        root = self.root / name
        for log in sorted(root.rglob("*.jsonl")) if root.is_dir() else ():
            if any(p.startswith(("ckpt", "damaged-")) for p in log.relative_to(root).parts):
                continue  # a checkpoint's files are checked against its checksums
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", TornRecordWarning)
                side = repair_torn_tail(log)
            if side is None:
                continue
            what = "the stage is redone (each intact record reused, the lost one rerun)"
            if name not in REDONE_WHEN_TORN:
                what = "the stage is kept"
            warnings.warn(
                f"{log}: the finished {name} stage's last record was torn (moved to "
                f"{side.name}); {what}",
                ResumeWarning,
                stacklevel=2,
            )
            redo |= name in REDONE_WHEN_TORN
        return redo

    def record_session(self, command: list[str] | None = None) -> None:
        """Append who runs it now — commit, date, machine, command — to ``sessions.jsonl``
        (a resume on another machine or commit is a second line)."""
        with AppendLog(self.root / SESSIONS) as log:
            log.append((strict_dumps(session_record(command)) + "\n").encode())

    def sessions(self) -> list[dict[str, Any]]:
        """The sessions that ran the run, oldest first (none before they were recorded; a
        torn last line is skipped)."""
        path = self.root / SESSIONS
        if not path.is_file():
            return []
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", TornRecordWarning)
            out = []
            for _, line in read_lines(path):
                with contextlib.suppress(ValueError):  # a hand-edited line: not a session
                    out.append(json.loads(line))
            return [d for d in out if isinstance(d, dict)]

    def mark_done(self, name: str, summary: dict[str, Any]) -> dict[str, Any]:
        write_json(self.stage(name) / "done.json", summary)
        return summary

    # ------------------------------------------------------------------ RL checkpoints
    def checkpoints(self) -> list[tuple[int, Path]]:
        """Complete RL checkpoints as (version, dir), oldest first."""
        rl = self.root / "rl"
        out = []
        for p in rl.glob("ckpt-v*") if rl.is_dir() else ():
            if (p / COMPLETE).is_file():
                out.append((int(p.name.removeprefix("ckpt-v")), p))
        return sorted(out)

    def latest_checkpoint(self) -> tuple[int, Path] | None:
        ck = self.checkpoints()
        return ck[-1] if ck else None

    def set_aside(self, ckpt: Path) -> Path:
        """Rename a damaged checkpoint out of the way (``damaged-ckpt-vN-<µs>``: no longer a
        checkpoint, nothing deleted) and return its new path."""
        to = ckpt.with_name(f"damaged-{ckpt.name}-{time.time_ns() // 1000}")
        ckpt.rename(to)
        return to

    def prune_checkpoints(self, keep: int = 1, also: Collection[int] = ()) -> None:
        """Delete all but the newest ``keep`` complete checkpoints and those of the versions
        in ``also``, and incomplete ones."""
        complete = self.checkpoints()
        keep_dirs = {p for _, p in complete[-keep:]} | {p for v, p in complete if v in also}
        rl = self.root / "rl"
        for p in rl.glob("ckpt-v*") if rl.is_dir() else ():
            if p not in keep_dirs and p.is_dir():
                shutil.rmtree(p, ignore_errors=True)

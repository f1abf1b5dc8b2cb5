"""Helpers of the crash tests: ``provrl run`` as its own process in a directory (the run is
``DIR/run``, a relative path, so a copied run directory is a run of its own), killed at a
failpoint or run to the end, and a torn tail cut into a log."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from runcheck import check_run

RUN = "run"
STEPS = 7
FAST = [
    f"pipeline.rl.steps={STEPS}",
    "pipeline.eval.policies=[rl]",
    "pipeline.tasks.eval=4",
    "pipeline.eval.k=1",
]


def provrl_run(
    cwd: Path, failpoint: str | None, *, resume: bool, prelude: str = ""
) -> subprocess.CompletedProcess[str]:
    """``provrl run`` in ``cwd``, killed at the first ``failpoint`` it reaches (None: to the
    end); ``prelude``: Python run in the process first (a fault injected at a write)."""
    env = {k: v for k, v in os.environ.items() if k != "PROVRL_FAILPOINT"}
    if failpoint:
        env["PROVRL_FAILPOINT"] = failpoint
    args = ["run", "--no-progress"]
    if resume:
        args += ["--resume", RUN]
    else:
        args += ["--preset", "quick", "--set", f"logging.run_dir={RUN}"]
        args += [x for kv in FAST for x in ("--set", kv)]
    code = f"{prelude}\nimport sys\nfrom provrl.cli.entry import main\nsys.exit(main({args!r}))"
    return subprocess.run(
        [sys.executable, "-c", code], cwd=cwd, env=env, capture_output=True, text=True, timeout=900
    )


def killed(cwd: Path, failpoint: str, *, resume: bool = True) -> None:
    p = provrl_run(cwd, failpoint, resume=resume)
    assert p.returncode == -9, (
        f"{failpoint} did not fire (exit {p.returncode}):\n{p.stderr[-3000:]}"
    )


def finish(cwd: Path) -> dict:
    p = provrl_run(cwd, None, resume=True)
    assert p.returncode == 0, p.stderr[-3000:]
    return check_run(cwd / RUN, finished=True, steps=STEPS, max_lag=1)


def copy_of(base: Path, to: Path) -> Path:
    shutil.copytree(base / RUN, to / RUN)
    return to


def tear(path: Path) -> None:
    """Leave ``path`` with a torn last line, as a kill mid-write does. ``steps.jsonl``: its
    last record cut short (issue 28's ``truncate -s -40``; the checkpoint holds it); any other
    log: the first half of a record appended (a line being written when the kill came — a
    trajectory or row still being written can never have been trained or be a committed
    step's)."""
    data = path.read_bytes()
    if path.name == "steps.jsonl":
        path.write_bytes(data[:-40])
        return
    last = data[:-1].rsplit(b"\n", 1)[-1]
    with open(path, "ab") as f:
        f.write(last[: len(last) // 2])

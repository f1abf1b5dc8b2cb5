"""An independent checker of a run directory's crash-consistency invariants.

It reads every file itself — ``json``, ``zlib``, ``base64`` and numpy, none of provrl's
readers — so a bug in provrl's readers cannot hide one in its writers. :func:`check_run`
after any history of kills and resumes; ``finished=True`` once the run has completed:

* every line of every append-only log parses (a torn *last* line only while killed), the
  trajectory log's CRCs match, and no trajectory id is in it twice;
* the newest complete checkpoint ``ckpt-vN`` says version N after N steps; its trained ids
  are unique, in the log and not among the dropped;
* no action token carries a version the run has not committed (> N), and within a
  trajectory versions never go back; with ``max_lag`` every trained token is within it;
* the step records are 1…N (killed: 1…N or 1…N−1, the last one then in the checkpoint),
  step s has version s, and their trained ids — every id trained by some step — are each
  trained once and are exactly the checkpoint's;
* finished: the metrics sink has exactly one ``rl/`` row (the update's) and one
  ``rl_batch/`` row per step 1…N, the RL stage's summary says N steps, and the report has a
  row for every step.
"""

from __future__ import annotations

import base64
import json
import zlib
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

_REC = b',"rec":'


def lines(path: Path, *, torn_ok: bool) -> list[bytes]:
    """The complete lines of a log; its last line may be torn (no newline) only if
    ``torn_ok``."""
    data = path.read_bytes() if path.is_file() else b""
    parts = data.split(b"\n")
    if parts[-1]:
        assert torn_ok, f"{path}: ends with a torn line after a resume: {parts[-1][:60]!r}"
    return [p + b"\n" for p in parts[:-1]]


def trajectory(line: bytes) -> dict[str, Any]:
    """One trajectory record, its CRC checked, with its ``version`` and ``is_action``
    columns decoded."""
    assert line.startswith(b'{"crc":') and line.endswith(b"}\n"), line[:80]
    crc = int(line[len(b'{"crc":') : line.index(_REC)])
    body = line[line.index(_REC) + len(_REC) : -2]
    assert zlib.crc32(body) == crc, f"CRC mismatch: {line[:80]!r}"
    rec = json.loads(body)
    cols = {}
    for name, dtype in (("version", "<i4"), ("is_action", "bool")):
        raw = base64.b64decode(rec["tokens"][name])
        cols[name] = np.frombuffer(zlib.decompress(raw) if rec["z"] else raw, dtype=dtype)
        assert len(cols[name]) == rec["n"]
    return {"id": rec["traj_id"], "actions": cols["version"][cols["is_action"]]}


def checkpoints(rl: Path) -> list[tuple[int, Path]]:
    out = [
        (int(p.name.removeprefix("ckpt-v")), p)
        for p in rl.glob("ckpt-v*")
        if p.is_dir() and (p / "COMPLETE").is_file()
    ]
    return sorted(out)


def check_run(
    run: Path, *, finished: bool, steps: int | None = None, max_lag: int | None = None
) -> dict[str, Any]:
    """Check ``run`` (see the module docstring); returns what it read (N, ids, steps)."""
    torn_ok = not finished
    rl = run / "rl"
    # the trajectory log ---------------------------------------------------------------
    log = [trajectory(x) for x in lines(rl / "trajectories.jsonl", torn_ok=torn_ok)]
    ids = [t["id"] for t in log]
    twice = [i for i, n in Counter(ids).items() if n > 1]
    assert not twice, f"trajectories written twice: {twice[:5]}"
    # the checkpoint ---------------------------------------------------------------------
    ck = checkpoints(rl)
    n, ckpt = ck[-1] if ck else (0, None)
    state = json.loads((ckpt / "state.json").read_text()) if ckpt else {}
    assert state.get("version", 0) == n and state.get("steps", 0) == n, (n, state)
    trained = state.get("trained", [])
    assert len(trained) == len(set(trained)), "a trajectory was trained twice"
    assert set(trained) <= set(ids), "a trained trajectory is missing from the log"
    assert not set(trained) & set(state.get("dropped", [])), "trained and dropped"
    # versions -----------------------------------------------------------------------------
    for t in log:
        v = t["actions"]
        assert (v <= n).all(), f"{t['id']}: sampled under version {v.max()} > committed {n}"
        assert (np.diff(v) >= 0).all(), f"{t['id']}: versions go back"
    # the step records ------------------------------------------------------------------------
    raw = lines(rl / "steps.jsonl", torn_ok=torn_ok)
    kept_raw = lines(ckpt / "steps.jsonl", torn_ok=False) if ckpt else []
    recs, kept = [json.loads(x) for x in raw], [json.loads(x) for x in kept_raw]
    assert [r["step"] for r in kept] == list(range(1, n + 1)), "checkpoint's step records"
    got = [r["step"] for r in recs]
    assert got in (list(range(1, n + 1)), list(range(1, n)) if not finished else None), (
        f"step records {got}, checkpoint at {n}"
    )
    assert raw == kept_raw[: len(raw)], "steps.jsonl differs from the checkpoint's records"
    assert [int(r["version"]) for r in kept] == list(range(1, n + 1)), "versions reused"
    fed = [i for r in kept for i in r["trained"]]
    assert len(fed) == len(set(fed)), "a trajectory trained by two steps"
    assert sorted(fed) == sorted(trained), "step records and checkpoint disagree on trained"
    if max_lag is not None:
        by_id = {t["id"]: t for t in log}
        for r in kept:
            for i in r["trained"]:
                assert (r["version"] - 1 - by_id[i]["actions"] <= max_lag).all(), i
    if not finished:
        return {"n": n, "ids": ids, "steps": got}
    # finished: the metrics sink, the stage summary, the report ------------------------------
    assert steps is None or n == steps, f"{n} steps, expected {steps}"
    rows = [json.loads(x) for x in lines(rl / "metrics.jsonl", torn_ok=False)]
    for prefix in ("rl/", "rl_batch/"):
        at = Counter(r["step"] for r in rows if any(k.startswith(prefix) for k in r))
        assert at == Counter(range(1, n + 1)), f"{prefix} rows by step: {sorted(at.items())}"
    done = json.loads((rl / "done.json").read_text())
    assert done["steps"] == done["final_version"] == n
    report = (run / "report" / "report.md").read_text()
    assert f"{n} steps" in report
    for s in range(1, n + 1):
        assert f"\n| {s} | " in report, f"the report has no row for step {s}"
    return {"n": n, "ids": ids, "steps": got}

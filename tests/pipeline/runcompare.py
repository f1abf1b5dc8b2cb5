"""Compare a finished run with a reference run of the same configuration that was never
killed (issue 38's exact resume). Reads the run's files itself (``json`` only), like
:mod:`runcheck`, so a bug in provrl's readers cannot hide one in its writers.

:func:`differences` lists, one line each, where run and reference disagree on

* **the step records** (``RUN/rl/steps.jsonl``), every field but the clock's (:data:`CLOCK`):
  what each step trained (its trajectory ids), the batch's counts and outcomes, the groups
  finished and without signal since the previous step, the pools after it. Within a step
  the order of the trained ids and of ``groups_K`` is the order the groups *completed*
  in, which two uninterrupted runs do not share: compared as sets. Floats are compared to
  :data:`RTOL` / :data:`ATOL`: a sample's log-probability under the trainer comes out a
  few ulps apart depending on which rows share its batch (the importance-ratio statistics
  — ``tv``, ``kl_q_pi_*``, ``log_w_*`` — are such noise around 0 when π = q);
* **the curriculum** (``RUN/rl/done.json``): pools, transitions (as a multiset: the same
  version's moves come in completion order), groups started, and every task's pool,
  posterior (α, β), groups started and groups of evidence;
* **the whole run's counts** (``done.json``): steps, trajectories trained, stale groups
  dropped, rollouts (episodes), and the finished groups with and without signal — and the
  report's lines that quote them (``- rollouts: N episodes``, ``- groups without
  signal``): a report after a resume covers every session, not the last.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

CLOCK = {"step_s", "wall_s", "rss_mb", "tokens_per_s", "action_tokens_per_s"}
"""The step record's fields that read a clock or the process: never compared."""
AS_SETS = {"trained", "groups_K"}
"""Fields in the order the batch's groups completed: compared sorted."""
RTOL, ATOL = 1e-4, 1e-4
DONE = ("steps", "final_version", "trajectories_trained", "groups_dropped_stale", "episodes")
SIGNAL = ("groups", "zero_signal_groups", "tokens", "zero_signal_tokens", "trajectories_skipped")


def same(a: Any, b: Any) -> bool:
    """``a`` and ``b`` equal, floats (anywhere inside) to :data:`RTOL` / :data:`ATOL`."""
    if isinstance(a, float) or isinstance(b, float):
        if a is None or b is None or isinstance(a, bool) or isinstance(b, bool):
            return a == b
        return math.isclose(a, b, rel_tol=RTOL, abs_tol=ATOL)
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)


def read(run: Path) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """(the step records, the RL stage's summary) of a finished ``run``."""
    rl = run / "rl"
    steps = [json.loads(x) for x in (rl / "steps.jsonl").read_text().splitlines()]
    return steps, json.loads((rl / "done.json").read_text())


def differences(run: Path, ref: Path) -> list[str]:
    """Where finished ``run`` and reference ``ref`` disagree (the module docstring)."""
    (steps, done), (ref_steps, ref_done) = read(run), read(ref)
    out = []
    if len(steps) != len(ref_steps):
        out.append(f"{len(steps)} step records, the reference {len(ref_steps)}")
    for got, want in zip(steps, ref_steps, strict=False):
        for k in sorted((got.keys() | want.keys()) - CLOCK):
            a, b = got.get(k), want.get(k)
            if k in AS_SETS and isinstance(a, list) and isinstance(b, list):
                a, b = sorted(a), sorted(b)
            if not same(a, b):
                out.append(f"step {want.get('step')} {k}: {a} != {b}")
    for k in DONE:
        if not same(done.get(k), ref_done.get(k)):
            out.append(f"{k}: {done.get(k)} != {ref_done.get(k)}")
    zs, ref_zs = done["zero_signal"], ref_done["zero_signal"]
    for k in SIGNAL:
        if zs.get(k) != ref_zs.get(k):
            out.append(f"zero_signal {k}: {zs.get(k)} != {ref_zs.get(k)}")
    cur, ref_cur = done["curriculum"], ref_done["curriculum"]
    for k in ("pools", "transitions", "groups_started", "version"):
        if cur.get(k) != ref_cur.get(k):
            out.append(f"curriculum {k}: {cur.get(k)} != {ref_cur.get(k)}")
    moves, ref_moves = (
        sorted(json.dumps(m, sort_keys=True) for m in c["transition_log"]) for c in (cur, ref_cur)
    )
    if moves != ref_moves:
        out.append(f"curriculum transition_log: {moves} != {ref_moves}")
    tasks, ref_tasks = cur["tasks"], ref_cur["tasks"]
    for tid in sorted(tasks.keys() | ref_tasks.keys()):
        if not same(tasks.get(tid), ref_tasks.get(tid)):
            out.append(f"curriculum task {tid}: {tasks.get(tid)} != {ref_tasks.get(tid)}")
    report, ref_report = (report_counts(r) for r in (run, ref))
    if report != ref_report:
        out.append(f"report: {report} != {ref_report}")
    return out


def report_counts(run: Path) -> list[str]:
    """The report's whole-run counts: its rollouts' episodes and its groups without
    signal (the rates beside them are the last session's)."""
    text = (run / "report" / "report.md").read_text()
    out = re.findall(r"^- rollouts: (\d+ episodes)", text, re.M)
    return out + re.findall(r"^- groups without signal .*$", text, re.M)

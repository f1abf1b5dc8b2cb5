"""``provrl bench dev``: one dev-split run of a preset with overrides, summarised as the record
that chose (or rejected) a knob — what docs/pipeline.md's knob table links to.

A run is ``provrl run`` with ``pipeline.eval.split=dev`` and the warm start and RL policies
evaluated on the same dev tasks and sampling seeds. Its summary holds, besides the run's
wall time and peak RSS:

* ``teacher``: the warm start's traces per tier — tool calls, the minimal searches of the
  task's plan and the ratio (what the policy imitates: something to cut or not);
* ``eval``: RL against the warm start on dev (:func:`provrl.bench.learning.compare`: paired
  gain in points and its SE, the cut in tool calls per solved task, per tier), with both
  policies' raw per-task accuracies;
* ``rl``: per step and over the run, the share of trained trajectories spanning ≥ 2
  versions, the zero-signal share of finished groups, the distinct-sample share of the
  batch, the KV-staleness share; the raw step records' scalars;
* ``plans`` (reasoning runs): the plan each episode's first thought states, per tier, in the
  probe, in RL per version block and in both evals, with its accuracy (:func:`plan_split`).

Several runs may share their world, warm start, probe and filter (``shared``): only the RL
stage and the eval run again, as in ``provrl bench learning``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from provrl.bench.learning import (
    SHARED_STAGES,
    _eval_summary,
    _link_shared,
    _run,
    compare,
    eval_args,
    repeated_call,
    time_split,
)
from provrl.config import load_yaml
from provrl.env.oracle import stated_plan
from provrl.models.loading import load_tokenizer
from provrl.pipeline.rundir import RunDir
from provrl.pipeline.steplog import read_steps
from provrl.trajlog import read_all

STEP_KEYS = (
    "step",
    "version",
    "accuracy",
    "tool_calls",
    "mixed_version_trajectories",
    "zero_signal_share",
    "finished_groups",
    "distinct_share",
    "kv_stale_share",
    "max_lag",
    "entropy",
    "step_s",
)
"""Scalars of each step record kept in the summary (those a step record has)."""


def teacher_calls(teacher_file: Path) -> dict[str, Any]:
    """Per tier: the warm start's traces, their tool calls (mean, quartiles, max), the
    plan's minimal searches and the mean ratio calls / minimum."""
    by_tier: dict[int, list[tuple[float, float, float]]] = {}
    for t in read_all(teacher_file):
        m = t.metrics
        by_tier.setdefault(int(m.get("tier", 0)), []).append(
            (
                float(m.get("num_tool_calls", 0.0)),
                float(m.get("min_searches", math.nan)),
                float(m.get("exact_match", 0.0)),
            )
        )
    out: dict[str, Any] = {}
    for tier, rows in sorted(by_tier.items()):
        calls = np.array([r[0] for r in rows])
        mins = np.array([r[1] for r in rows])
        ratio = calls / np.where(mins > 0, mins, np.nan)
        out[str(tier)] = {
            "traces": len(rows),
            "correct_frac": float(np.mean([r[2] for r in rows])),
            "tool_calls_mean": float(calls.mean()),
            "tool_calls_quartiles": [float(q) for q in np.percentile(calls, [25, 50, 75])],
            "tool_calls_max": float(calls.max()),
            "min_searches_mean": float(np.nanmean(mins)) if np.isfinite(mins).any() else math.nan,
            "calls_over_min": float(np.nanmean(ratio)) if np.isfinite(ratio).any() else math.nan,
        }
    return out


def rl_summary(rl_dir: Path) -> dict[str, Any]:
    """Over the run and per step: mixed-version, zero-signal, distinct and KV-stale shares."""
    recs = read_steps(rl_dir.parent)
    trained = sum(len(r.get("trained", [])) for r in recs)
    mixed = sum(int(r.get("mixed_version_trajectories", 0)) for r in recs)
    finished = sum(int(r.get("finished_groups", 0)) for r in recs)
    zero = sum(int(r.get("zero_signal_groups", 0)) for r in recs)

    def mean(key: str) -> float:
        xs = [float(r[key]) for r in recs if key in r]
        return float(np.mean(xs)) if xs else math.nan

    return {
        "steps": len(recs),
        "trained_trajectories": trained,
        "mixed_version_frac": mixed / trained if trained else 0.0,
        "steps_with_mixed": sum(int(r.get("mixed_version_trajectories", 0)) > 0 for r in recs),
        "zero_signal_share": zero / finished if finished else math.nan,
        "distinct_share_mean": mean("distinct_share"),
        "kv_stale_share_mean": mean("kv_stale_share"),
        "per_step": [{k: r[k] for k in STEP_KEYS if k in r} for r in recs],
        "by_version": tier_blocks(rl_dir / "trajectories.jsonl"),
        "time": time_split(rl_dir),
    }


def tier_blocks(log: Path, block: int = 4) -> dict[str, dict[str, dict[str, Any]]]:
    """The RL groups of the trajectory log by the block of ``block`` versions their oldest
    action token was sampled under, and by tier — when in a run a tier learned, or collapsed
    (``{"0-3": {"1": {...}}}``). Per cell: groups, accuracy and tool calls per episode, the
    share of groups whose rewards are all equal (``zero_signal_share``: no gradient), and per
    number of tool calls n the episodes that made n (``calls_hist``) and their accuracy
    (``accuracy_by_calls``): whether a one-hop task is answered after one search, and whether a
    two-hop task answered after one is ever right; and the share of episodes that repeated a
    call they had already made (``repeat_share``, :func:`provrl.bench.learning.repeated_call`)
    and the calls made after a result had shown the answer, per episode (``calls_after_answer``;
    None on logs written before the metric)."""
    groups: dict[str, list[Any]] = {}
    for t in read_all(log) if log.is_file() else []:
        groups.setdefault(str(t.meta.get("group", t.traj_id)), []).append(t)
    cells: dict[tuple[int, str], list[list[Any]]] = {}
    for trajs in groups.values():
        acted = [t for t in trajs if t.num_actions]
        if not acted:
            continue
        v = min(int(t.version[t.is_action].min()) for t in acted) // block
        cells.setdefault((v, str(trajs[0].meta.get("tier", 0))), []).append(trajs)
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for (v, tier), cell in sorted(cells.items()):
        eps = [
            (float(t.metrics.get("exact_match", 0.0)), int(t.metrics.get("num_tool_calls", 0)))
            for trajs in cell
            for t in trajs
        ]
        by_calls: dict[int, list[float]] = {}
        for em, n in eps:
            by_calls.setdefault(n, []).append(em)
        equal = [len({t.reward for t in trajs}) <= 1 for trajs in cell]
        after = [t.metrics["calls_after_answer"] for g in cell for t in g if "calls_after_answer" in t.metrics]  # fmt: skip
        out.setdefault(f"{v * block}-{v * block + block - 1}", {})[tier] = {
            "groups": len(cell),
            "accuracy": _group_mean(cell, "exact_match"),
            "tool_calls": _group_mean(cell, "num_tool_calls"),
            "zero_signal_share": float(np.mean(equal)),
            "calls_hist": {str(n): len(x) for n, x in sorted(by_calls.items())},
            "accuracy_by_calls": {str(n): float(np.mean(x)) for n, x in sorted(by_calls.items())},
            "repeat_share": float(np.mean([repeated_call(t) for trajs in cell for t in trajs])),
            "calls_after_answer": float(np.mean(after)) if after else None,
        }
    return out


def plan_split(
    log: Path, decode: Callable[[list[int]], str], block: int = 4
) -> dict[str, dict[str, dict[str, dict[str, float]]]]:
    """The plan each episode's first action states (:func:`provrl.env.oracle.stated_plan`:
    ``"1"``, ``"2"``, … searches, or ``"none"``), by the block of ``block`` versions its oldest
    action token was sampled under, by tier: episodes and accuracy per plan
    (``{"0-3": {"1": {"2": {"episodes": 115, "accuracy": 0.46}}}}``). With a reasoning warm
    start the plan sentence decides an episode before any result is read; this shows whether
    the warm start says the right one per tier and which way RL moved it. ``decode`` turns
    token ids into text (the run's tokenizer)."""
    cells: dict[tuple[int, str, str], list[float]] = {}
    for t in read_all(log) if log.is_file() else []:
        first = next((s for s in t.segments if s.kind == "action"), None)
        if first is None:
            continue
        n = stated_plan(decode(t.token_id[first.start : first.end].tolist()))
        v = int(t.version[t.is_action].min()) // block
        key = (v, str(int(t.metrics.get("tier", 0))), "none" if n is None else str(n))
        cells.setdefault(key, []).append(float(t.metrics.get("exact_match", 0.0)))
    out: dict[str, dict[str, dict[str, dict[str, float]]]] = {}
    for (v, tier, plan), ems in sorted(cells.items()):
        span = f"{v * block}-{v * block + block - 1}"
        out.setdefault(span, {}).setdefault(tier, {})[plan] = {
            "episodes": len(ems),
            "accuracy": float(np.mean(ems)),
        }
    return out


def plan_splits(run_dir: Path) -> dict[str, Any] | None:
    """:func:`plan_split` of the probe (the warm start, version 0), RL's trajectories and the
    two dev evals of a reasoning run; None when the run's agent does not reason (or the
    directory holds no config.yaml to say)."""
    f = run_dir / "config.yaml"
    cfg = load_yaml(f) if f.is_file() else {}
    if not cfg.get("env", {}).get("agent", {}).get("reasoning", False):
        return None
    tok = load_tokenizer(str(cfg.get("model", {}).get("name", "smollm2-135m")))

    def decode(ids: list[int]) -> str:
        return str(tok.decode(ids))

    logs = {
        "probe": run_dir / "probe" / "trajectories.jsonl",
        "rl": run_dir / "rl" / "trajectories.jsonl",
        "eval_warmstart": run_dir / "eval" / "warmstart" / "trajectories.jsonl",
        "eval_rl": run_dir / "eval" / "rl" / "trajectories.jsonl",
    }
    return {k: plan_split(f, decode) for k, f in logs.items() if f.is_file()}


def _group_mean(cell: list[list[Any]], metric: str) -> float:
    """A metric averaged over each group's episodes, then over the groups."""
    return float(np.mean([np.mean([float(t.metrics.get(metric, 0.0)) for t in g]) for g in cell]))


def summarize_run(run_dir: str | Path) -> dict[str, Any]:
    """The dev record of a finished run directory (eval of warmstart and rl on dev)."""
    d = Path(run_dir)
    warm = _eval_summary(d / "eval" / "warmstart")
    rl = _eval_summary(d / "eval" / "rl")
    out: dict[str, Any] = {
        "run_dir": str(d),
        "teacher": teacher_calls(d / "warmstart" / "teacher.jsonl"),
        "eval": {
            **compare(warm, rl),
            "warmstart_accuracy": warm["accuracy"],
            "rl_accuracy": rl["accuracy"],
            "warmstart_tool_calls_solved": warm["tool_calls_solved"],
            "rl_tool_calls_solved": rl["tool_calls_solved"],
            "warmstart_task_accuracy": warm["task_accuracy"],
            "rl_task_accuracy": rl["task_accuracy"],
        },
        "rl": rl_summary(d / "rl"),
    }
    plans = plan_splits(d)
    if plans is not None:
        out["plans"] = plans
    filt = d / "filter" / "done.json"
    if filt.is_file():
        out["filter"] = json.loads(filt.read_text()) | {"per_tier": pool_tiers(d / "filter")}
    return out


def pool_tiers(filter_dir: Path) -> dict[str, dict[str, int]]:
    """The filter's pools counted per tier: ``{tier: {kept, solved, unsolved}}`` — how many
    tasks of each tier RL can start (the curriculum's ``balance_tiers`` evens them out)."""
    out: dict[str, dict[str, int]] = {}
    for pool in ("kept", "solved", "unsolved"):
        f = filter_dir / f"{pool}.jsonl"
        for line in f.read_text().splitlines() if f.is_file() else ():
            if line.strip():
                tier = str(json.loads(line).get("tier", 0))
                row = out.setdefault(tier, {"kept": 0, "solved": 0, "unsolved": 0})
                row[pool] += 1
    return dict(sorted(out.items()))


def run_dev(
    name: str,
    preset: str = "default",
    overrides: Sequence[str] = (),
    *,
    runs: str | Path = "runs/dev",
    shared: str | Path | None = None,
    eval_n: int = 0,
    eval_k: int = 2,
    eval_versions: Sequence[int] = (),
) -> dict[str, Any]:
    """Run (or resume) ``RUNS/NAME``: the preset with ``overrides`` on the dev split, then
    :func:`summarize_run`. ``shared``: a finished run whose world, warm start, probe and
    filter are reused (linked) — only RL and eval run again. ``eval_versions``: RL versions
    whose checkpoints the run keeps and evaluates on the same dev tasks (``eval_at``); once
    every one is evaluated, only the newest checkpoint stays (each is ~1.6 GB for SmolLM2,
    and a dev round fills a disk)."""
    d = Path(runs).resolve() / name
    d.mkdir(parents=True, exist_ok=True)
    if shared is not None:
        _link_shared(Path(shared).resolve(), d)
    args = ["run", "--preset", preset, "--no-progress"]
    args += [a for o in overrides for a in ("--set", o)]
    for o in (
        f"logging.run_dir={d}",
        "pipeline.eval.split=dev",
        "pipeline.eval.policies=[warmstart,rl]",
        f"pipeline.tasks.eval={eval_n}",
        f"pipeline.eval.k={eval_k}",
        f"pipeline.loop.keep_versions={json.dumps(sorted(eval_versions))}",
    ):
        args += ["--set", o]
    usage = _run(args, d.parent / f"{name}.log")
    eval_at = {}
    for v in eval_versions:
        ev = d / "eval" / f"rl-v{v}"
        if not (ev / "eval.json").is_file():
            cmd = eval_args(d, "dev", n=eval_n, k=eval_k)
            cmd += ["--json", "--run-dir", str(ev), "--policy", str(d / "rl" / f"ckpt-v{v}")]
            _run(cmd, d.parent / f"{name}.log")
        eval_at[str(v)] = version_eval(d, ev)
    RunDir(d).prune_checkpoints(keep=1)
    sessions = run_sessions(d)
    covers = "the whole run" if sessions <= 1 else f"the last of {sessions} sessions (resumed)"
    return {
        "benchmark": "dev",
        "name": name,
        "sessions": sessions,
        "preset": preset,
        "overrides": list(overrides),
        "shared": str(shared) if shared is not None else None,
        "shared_stages": list(SHARED_STAGES) if shared is not None else [],
        **usage,
        "usage_covers": covers,  # wall_s and peak_rss_gb: this invocation's only
        **summarize_run(d),
        **({"eval_at": eval_at} if eval_at else {}),
    }


def run_sessions(run_dir: Path) -> int:
    """How many times the run was started or resumed (:meth:`RunDir.sessions`)."""
    return len(RunDir(run_dir).sessions())


def version_eval(run_dir: Path, eval_dir: Path) -> dict[str, Any]:
    """An intermediate RL version's dev eval against the run's warm-start eval (paired by
    task, as ``eval``)."""
    warm, rl = _eval_summary(run_dir / "eval" / "warmstart"), _eval_summary(eval_dir)
    return {
        **compare(warm, rl),
        "rl_accuracy": rl["accuracy"],
        "rl_tool_calls_solved": rl["tool_calls_solved"],
    }

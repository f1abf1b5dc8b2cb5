"""The main job, measured end to end: ``benchmarks/demo.sh`` runs ``make demo`` under
``/usr/bin/time -v`` on this checkout and then this module turns that run into
``results/demo.json``::

    python -m provrl.bench.demo --time-log T --run runs/default --out results/demo.json

What it records, each from the file that measured it:

* ``wall_s`` and ``peak_rss_mib``: ``/usr/bin/time -v``'s "Elapsed (wall clock)" and
  "Maximum resident set size" of the whole ``make demo`` (setup included on a fresh clone);
* ``stages``: each stage's ``stage_wall_s`` from its ``RUN/{stage}/done.json``, and
  ``setup_s`` = wall − the stages (venv, installs, the model's conversion);
* ``rl``: the step records (``RUN/rl/steps.jsonl``): ``step_s`` per step (raw) and its
  median, ``rss_mb`` per step, mixed-version trajectories;
* ``eval``: per policy accuracy, its SEs and tool calls per solved task; ``delta``: RL − warm
  start, paired over tasks (mean and SE, ``stages.paired_difference``).

One run is one draw: the learning figures of one demo say what one seed did, not what the
preset does on average (``provrl bench learning`` runs several seeds).
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
from pathlib import Path
from typing import Any

from provrl.bench.results import run_record, write_result

EVAL_KEYS = (
    "accuracy",
    "accuracy_se",
    "accuracy_se_tasks",
    "mean_tool_calls",
    "mean_tool_calls_solved",
    "oracle_min_tool_calls_solved",
    "excess_tool_calls_solved",
)
"""What ``results/demo.json`` keeps of each policy's evaluation."""


def parse_time_log(text: str) -> dict[str, float]:
    """``wall_s`` and ``peak_rss_mib`` from ``/usr/bin/time -v`` output (``h:mm:ss`` or
    ``m:ss.ss`` wall clock; the resident set in kbytes)."""
    wall = re.search(r"Elapsed \(wall clock\) time .*: ([\d:.]+)", text)
    rss = re.search(r"Maximum resident set size \(kbytes\): (\d+)", text)
    if wall is None or rss is None:
        raise ValueError("not /usr/bin/time -v output (no wall clock or maximum resident set)")
    secs = 0.0
    for part in wall.group(1).split(":"):
        secs = secs * 60 + float(part)
    return {"wall_s": secs, "peak_rss_mib": int(rss.group(1)) / 1024}


def summarise(run_dir: Path, timing: dict[str, float]) -> dict[str, Any]:
    """The run's figures (module docstring) from its stage markers and step records."""
    from provrl.pipeline.run import load_summary
    from provrl.pipeline.stages import paired_difference
    from provrl.pipeline.steplog import read_steps

    done = load_summary(run_dir)
    stages = {k: float(d.get("stage_wall_s", d.get("wall_s", 0.0))) for k, d in done.items()}
    if "eval" not in done:
        raise ValueError(f"{run_dir}: no eval/done.json — the run did not finish")
    steps = read_steps(run_dir)
    step_s = [float(r["step_s"]) for r in steps]
    ev = done["eval"]
    evals = {
        name: {k: ev[name][k] for k in EVAL_KEYS if k in ev[name]}
        for name in ("base", "warmstart", "rl")
        if name in ev
    }
    delta: dict[str, Any] = {}
    if "warmstart" in ev and "rl" in ev:
        pd = paired_difference(ev["warmstart"]["task_accuracy"], ev["rl"]["task_accuracy"])
        delta = {
            "accuracy": pd["diff"],
            "accuracy_se": pd["se"],
            "tasks": pd["tasks"],
            "tool_calls_ratio": _ratio(evals, "mean_tool_calls"),
            "tool_calls_solved_ratio": _ratio(evals, "mean_tool_calls_solved"),
        }
    return {
        **timing,
        "wall_min": timing["wall_s"] / 60,
        "stages": {**stages, "setup_s": timing["wall_s"] - sum(stages.values())},
        "rl": {
            "steps": len(steps),
            "step_s": step_s,
            "step_s_median": statistics.median(step_s) if step_s else None,
            "rss_mb": [float(r.get("rss_mb", 0.0)) for r in steps],
            "mixed_version_trajectories": sum(
                int(r.get("mixed_version_trajectories", 0)) for r in steps
            ),
        },
        "eval": evals,
        "delta": delta,
        "probe": {
            "kept": done.get("filter", {}).get("sizes", {}),
            "K_histogram": done.get("probe", {}).get("K_histogram"),
        },
    }


def _ratio(evals: dict[str, dict[str, Any]], key: str) -> float | None:
    """RL's ``key`` over the warm start's (None when either lacks it)."""
    a, b = evals["rl"].get(key), evals["warmstart"].get(key)
    return float(a) / float(b) if a is not None and b else None


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--time-log", type=Path, required=True, help="/usr/bin/time -v output")
    ap.add_argument("--run", type=Path, default=Path("runs/default"), help="the run directory")
    ap.add_argument("--out", type=Path, required=True, help="the results file to write")
    ap.add_argument("--command", default="make demo", help="what /usr/bin/time ran")
    args = ap.parse_args(argv)
    try:
        timing = parse_time_log(args.time_log.read_text())
        result = summarise(args.run, timing)
        cfg = _config(args.run)
    except (OSError, ValueError, KeyError) as e:
        raise SystemExit(f"provrl.bench.demo: {args.time_log} / {args.run}: {e}") from e
    record = run_record(
        "demo",
        result,
        config=cfg,
        seeds={"seed": cfg.get("seed", 0), "draws": 1},
        command=[args.command],
    )
    write_result(args.out, record)
    print(json.dumps({k: result[k] for k in ("wall_min", "peak_rss_mib")} | {"rl_step_s_median": result["rl"]["step_s_median"], "delta": result["delta"]}))  # fmt: skip


def _config(run_dir: Path) -> dict[str, Any]:
    """The run's whole config (every setting, defaults included), as ``provrl run`` read it."""
    from provrl.config import load_config
    from provrl.run_config import RunConfig

    return load_config(RunConfig, run_dir / "config.yaml").model_dump(mode="json")


if __name__ == "__main__":
    main()

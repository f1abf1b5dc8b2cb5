"""Asynchronous (hot-load) vs synchronous (strict on-policy) RL, side by side in one run.

Same preset, same warm start, same kept pool, same number of trained samples
(``steps × groups_per_step × k``), the heavy-tailed search-latency model on (log-normal body,
Pareto tail): only ``pipeline.loop.mode`` differs. For each mode and seed the RL stage runs from
a copy of one shared warm-started run directory; then the final policy is evaluated on dev.

Reported per mode (medians over seeds): wall time of the RL stage, trajectories/s, engine and
trainer idle fractions, final dev accuracy; the wall ratio async / sync
(``wall_ratio_async_over_sync``; ``speed_ratio`` is its inverse). "Equal final accuracy" is an
**equivalence test** (``equivalent``, :func:`provrl.bench.stats.tost_paired`): per dev task,
the accuracy of its k samples averaged over seeds, paired sync / async on the same tasks;
TOST with the margin ``--margin`` (default ±0.05 accuracy, 5 points) at α = 0.05. The JSON
also gives the test's power at this many tasks and the tasks it would need for 80 % power
(``accuracy_equivalence``) — with 16 dev tasks and per-task differences of σ ≈ 0.3 it needs
a few hundred, so a small run says "not shown equivalent", never "equal".

    python benchmarks/async_vs_sync.py --json                       # tiny model, quick preset
    python benchmarks/async_vs_sync.py --model smollm2-135m --preset default --steps 6 --json
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
from pathlib import Path
from typing import Any

from provrl.bench.stats import equivalence_report
from provrl.config import load_config
from provrl.env.build import ensure_world
from provrl.pipeline.rl_loop import run_rl
from provrl.pipeline.run import run_pipeline
from provrl.pipeline.rundir import RunDir
from provrl.pipeline.stages import load_pool
from provrl.rollout.evaluate import evaluate
from provrl.run_config.run import RunConfig
from provrl.trajlog import read_all


def per_task_accuracy(log: Path) -> dict[str, float]:
    """Mean exact match of each task's samples in an evaluation's trajectory log."""
    hits: dict[str, list[float]] = {}
    for t in read_all(log):
        hits.setdefault(t.task_id, []).append(float(t.metrics["exact_match"]))
    return {task: sum(v) / len(v) for task, v in hits.items()}


def paired_task_accuracy(
    runs: dict[str, list[dict[str, float]]],
) -> tuple[list[str], list[float], list[float]]:
    """(tasks, sync, async): each task's accuracy averaged over seeds, per mode, on the
    tasks both modes evaluated."""
    mean = {m: _mean_over_seeds(r) for m, r in runs.items()}
    tasks = sorted(set(mean["sync"]) & set(mean["async"]))
    return tasks, [mean["sync"][t] for t in tasks], [mean["async"][t] for t in tasks]


def _mean_over_seeds(per_seed: list[dict[str, float]]) -> dict[str, float]:
    tasks = set.intersection(*(set(r) for r in per_seed))
    return {t: sum(r[t] for r in per_seed) / len(per_seed) for t in tasks}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--preset", default="quick")
    ap.add_argument("--model", default=None, help="override model.name (default: the preset's)")
    ap.add_argument("--steps", type=int, default=6, help="RL steps per run")
    ap.add_argument("--seeds", type=int, default=2, help="seeds per mode")
    ap.add_argument("--latency", default="pareto", choices=["none", "lognormal", "pareto"])
    ap.add_argument("--median-latency", type=float, default=0.3, help="seconds")
    ap.add_argument("--dev-tasks", type=int, default=16)
    ap.add_argument("--margin", type=float, default=0.05, help="equivalence margin (accuracy)")
    ap.add_argument("--out", type=Path, default=Path("runs/async_vs_sync"))
    ap.add_argument("--set", dest="overrides", action="append", default=[])
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)

    sets = [*args.overrides, f"pipeline.loop.steps={args.steps}", "pipeline.eval.policies=[]"]
    if args.model:
        sets.append(f"model.name={args.model}")
    base_dir = args.out / "shared"
    # 1. one shared warm start, probe and filter (RL with 0 steps, no eval)
    cfg0 = load_config(RunConfig, args.preset, [*sets, "pipeline.loop.steps=0"])
    run_pipeline(cfg0, base_dir, progress=False)
    world = ensure_world(cfg0.env.world)
    start = json.loads((base_dir / "warmstart" / "done.json").read_text())["checkpoint"]

    rows: dict[str, list[dict[str, Any]]] = {"sync": [], "async": []}
    task_acc: dict[str, list[dict[str, float]]] = {"sync": [], "async": []}
    for seed in range(args.seeds):
        for mode in ("sync", "async"):  # interleaved, so machine load hits both alike
            d = args.out / f"{mode}-s{seed}"
            shutil.rmtree(d, ignore_errors=True)
            shutil.copytree(base_dir, d, ignore=shutil.ignore_patterns("rl", "eval", "report"))
            cfg = load_config(
                RunConfig,
                args.preset,
                [
                    *sets,
                    f"pipeline.loop.mode={mode}",
                    f"seed={seed}",
                    f"env.search.latency.kind={args.latency}",
                    f"env.search.latency.median_s={args.median_latency}",
                    f"env.search.latency.seed={seed}",
                ],
            )
            run = RunDir(d)
            pool = [t for p in cfg.pipeline.rl_pools for t in load_pool(run, p)]
            s = run_rl(cfg, run, world, pool, start, progress=False)
            ev_cfg = cfg.env.model_copy(deep=True)
            ev_cfg.search.latency.kind = "none"
            ev_cfg.eval.split, ev_cfg.eval.n, ev_cfg.eval.k = "dev", args.dev_tasks, 2
            ev_cfg.eval.tiers = tuple(cfg.pipeline.tasks.tiers)
            ev = evaluate(
                s["checkpoint"],
                world,
                ev_cfg,
                d / "dev-eval",
                progress=False,
                dtype=cfg.model.dtype,
            )
            task_acc[mode].append(per_task_accuracy(d / "dev-eval" / "trajectories.jsonl"))
            rows[mode].append(
                {
                    "seed": seed,
                    "wall_s": round(s["wall_s"], 2),
                    "trajectories_trained": s["trajectories_trained"],
                    "trajectories_per_s": round(s["trajectories_trained"] / s["wall_s"], 3),
                    "engine_idle_frac": round(1 - s["engine_busy_frac"], 3),
                    "trainer_idle_frac": round(s["trainer_idle_frac"], 3),
                    "dev_accuracy": round(ev["accuracy"], 4),
                    "groups_dropped_stale": s["groups_dropped_stale"],
                }
            )

    def med(mode: str, key: str) -> float:
        return float(statistics.median(r[key] for r in rows[mode]))

    def spread(mode: str) -> float:
        accs = [r["dev_accuracy"] for r in rows[mode]]
        return float(max(accs) - min(accs))

    result: dict[str, Any] = {
        "preset": args.preset,
        "model": cfg0.model.name,
        "steps": args.steps,
        "samples_per_run": args.steps * cfg0.pipeline.loop.groups_per_step * cfg0.pipeline.loop.k,
        "latency": {"kind": args.latency, "median_s": args.median_latency},
        "seeds": args.seeds,
        "modes": {
            m: {
                k: med(m, k)
                for k in (
                    "wall_s",
                    "trajectories_per_s",
                    "engine_idle_frac",
                    "trainer_idle_frac",
                    "dev_accuracy",
                )
            }
            | {"dev_accuracy_seed_spread": spread(m), "runs": rows[m]}
            for m in rows
        },
    }
    ratio = med("sync", "wall_s") / med("async", "wall_s")
    tasks, acc_sync, acc_async = paired_task_accuracy(task_acc)
    eq = equivalence_report(acc_sync, acc_async, args.margin)
    result |= {
        "wall_ratio_async_over_sync": round(1 / ratio, 3),
        "speed_ratio": round(ratio, 3),
        "equivalent": eq["equivalent"],
        "accuracy_equivalence": eq | {"tasks": len(tasks), "unit": "dev task, mean over seeds"},
        "target_met": ratio >= 2.0 and eq["equivalent"],
    }
    print(json.dumps(result, indent=None if args.json else 2))
    return result


if __name__ == "__main__":
    main()

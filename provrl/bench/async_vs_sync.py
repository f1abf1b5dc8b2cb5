"""Asynchronous (hot-load) vs synchronous (strict on-policy) RL, side by side in one run.

Same preset, same warm start, same kept pool, same number of trained samples
(``steps × groups_per_step × k``, checked: ``samples_equal``), the same search-latency model
(``env.search.latency``: by default the ``web-ai`` preset, a log-normal body with a Pareto
tail fitted to a web-search API's published p50 / p95, docs/env.md §3): only
``pipeline.loop.mode`` differs. For each seed and mode (interleaved, so machine load hits
both alike) the RL stage runs from a copy of one shared warm-started run directory
(:func:`provrl.bench.agent_runs.run_measured`: the engine's counters, save and load times,
the curve's steps' weights kept); afterwards the final policy is evaluated on ``--dev-tasks`` dev
tasks × ``--dev-k`` samples, and every ``--curve-every``-th step's weights on the curve's
smaller dev set (``--curve-dev-tasks`` × ``--curve-k``), which gives the wall-clock
accuracy curve and the **time to a dev-accuracy threshold**.

Reported per mode (medians over seeds; every run's figures under ``runs``): wall time of
the RL stage, trajectories/s, engine and trainer idle fractions, final dev accuracy, time to
the threshold, the lag histogram (action tokens by ``trainer version − sampling version``,
summed over steps and seeds), the engine's counters (``drains``, ``cache_resets``,
``drain_evictions``, ``drain_wait_s``, ``hotloads``: strict on-policy drains and resets at
every step, hot-load does neither) and the measured inputs of the simulator
(``measured``: episodes' tokens per turn, tool-call latencies, trainer step, save and load
seconds, engine seconds per step) and, under ``simulator_check``, the simulator's prediction
of this point from them (:func:`provrl.bench.sim_check.check_against_simulator`).

Top level: ``wall_ratio_async_over_sync`` (median wall over seeds, async / sync;
``speed_ratio`` is its inverse) and ``equivalent``, the **equivalence test** of final dev
accuracy (:func:`provrl.bench.stats.tost_paired`): per dev task, the accuracy of its samples
averaged over seeds, paired sync / async on the same tasks; TOST at ±``--margin`` (default
0.05: 5 points), α = 0.05, with its power at this many tasks and the tasks 80 % power needs
(``accuracy_equivalence``). ``target_met``: wall ratio ≤ 0.5 and equivalent (issue 35).

Latency: ``--latency-preset`` (default ``web-ai``; ``''`` = the preset file's
``env.search.latency`` as it is) sets ``env.search.latency.preset``; ``--latency`` and
``--median-latency`` override its kind and median when given. Each seed draws its own
latencies (``env.search.latency.seed``); evaluation runs without latency. On a CPU that
generates a turn far slower than the deployment the preset describes, dilate the latency (and
the call's deadline) by that factor: ``--time-scale N`` (``env.search.latency.time_scale``,
docs/env.md §3; set on the RL runs only, so the shared stages stay the default preset's), or
``--time-scale auto``: N measured by one strict on-policy RL step (this engine's seconds per
sampling step over a GPU deployment's time per output token, :mod:`provrl.bench.time_scale`),
kept with the runs. The JSON's ``time_scale`` has N, its calibration and each mode's realised
slowdown (the runs' own engine seconds per step over the deployment's).

``--keep DIR`` (a folder under ``results/``, committed) keeps each finished run (a mode and a
seed: its row, its dev tasks' accuracies and the simulator's inputs) and the warm start's curve
point as small JSON pieces, and the probe and filter as an archive (:mod:`provrl.bench.kept`).
The benchmark takes longer than one session of a 2-core machine, and a machine may come back
without ``runs/``: a rerun rebuilds the world and the warm start, puts the probe and filter
back, checks that the pieces were measured from the same build and the same benchmark
settings (``settings``: every flag that changes a run), and runs only what is missing. Copy a
learning benchmark's ``shared-probe.*`` into DIR to skip the probe when the warm start is the
same (the identity check refuses it otherwise).

    python benchmarks/async_vs_sync.py --json                      # tiny model, quick preset
    python benchmarks/async_vs_sync.py --preset default --seeds 3 --steps 6 --time-scale auto \\
        --keep results/async-vs-sync-parts \\
        --results results/async_vs_sync.json --plot docs/img/async_vs_sync.png --json
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
from pathlib import Path
from typing import Any

from provrl.bench.agent_runs import (
    Measured,
    SharedStart,
    episode_inputs,
    evaluate_policy,
    kept_shared_start,
    resolve_time_scale,
    rl_from_shared,
)
from provrl.bench.results import write_script_result
from provrl.bench.sim_check import check_against_simulator
from provrl.bench.stats import equivalence_report
from provrl.bench.time_scale import parse_time_scale, time_scale_record
from provrl.config import load_config
from provrl.run_config.run import RunConfig

MODES = ("sync", "async")

SETTINGS = ("preset", "model", "steps", "latency_preset", "latency", "median_latency",
            "time_scale", "dev_tasks", "dev_k", "curve_every", "curve_dev_tasks", "curve_k",
            "overrides")  # fmt: skip
"""The flags that change a run's figures, whose digest is in a kept piece's identity (not
``--seeds``: more seeds add pieces; not the threshold or margin: they only change the summary)."""


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


def time_to_threshold(curve: list[tuple[float, float]], threshold: float) -> float | None:
    """The first wall second at which the curve ``[(wall_s, accuracy), …]`` (in time order)
    reaches ``threshold``; None if it never does."""
    for t, acc in curve:
        if acc >= threshold:
            return t
    return None


def lag_histogram(steps: list[dict[str, Any]]) -> dict[str, int]:
    """Action tokens by lag (trainer version − sampling version), summed over step records."""
    out: dict[int, int] = {}
    for s in steps:
        for k, v in s.get("lag_histogram", {}).items():
            out[int(k)] = out.get(int(k), 0) + int(v)
    return {str(k): out[k] for k in sorted(out)}


def add_histograms(hs: list[dict[str, int]]) -> dict[str, int]:
    out: dict[int, int] = {}
    for h in hs:
        for k, v in h.items():
            out[int(k)] = out.get(int(k), 0) + v
    return {str(k): out[k] for k in sorted(out)}


def latency_sets(
    preset: str,
    kind: str | None,
    median_s: float | None,
    seed: int,
    time_scale: float | None = None,
) -> list[str]:
    """The ``--set`` overrides of the latency model: the preset, then explicit fields (which
    win over the preset's, as ``LatencyConfig`` reads them), the time scale, then the seed."""
    sets = [f"env.search.latency.preset={preset}"] if preset else []
    if kind is not None:
        sets.append(f"env.search.latency.kind={kind}")
    if median_s is not None:
        sets.append(f"env.search.latency.median_s={median_s}")
    if time_scale is not None:
        sets.append(f"env.search.latency.time_scale={time_scale}")
    return [*sets, f"env.search.latency.seed={seed}"]


def run_inputs(m: Measured, log: Path) -> dict[str, Any]:
    """One run's inputs of the simulator (JSON, kept with the run's piece): its episodes
    (:func:`~provrl.bench.agent_runs.episode_inputs`), trainer steps, saves, loads and engine
    counters."""
    return {
        "episodes": episode_inputs(log),
        "wall_s": float(m.summary["wall_s"]),
        "trainer_step_s": [float(s["step_s"]) for s in m.steps if "step_s" in s],
        "save_s": list(m.save_s),
        "load_s": list(m.load_s),
        "engine": dict(m.engine),
    }


def measured_inputs(cfg: RunConfig, runs: list[dict[str, Any]]) -> dict[str, Any]:
    """One mode's measured inputs of the simulator, pooled over its seeds' :func:`run_inputs`
    (module docstring)."""
    eps: dict[str, list[Any]] = {"turn_tokens": [], "waits": [], "tool_latency_s": [], "episode_s": []}  # fmt: skip
    for r in runs:
        for k in eps:
            eps[k].extend(r["episodes"][k])
    busy = sum(r["engine"].get("busy_s", 0.0) for r in runs)
    n_steps = sum(r["engine"].get("steps", 0.0) for r in runs)
    tokens = sum(r["engine"].get("tokens_generated", 0.0) for r in runs)
    loop = cfg.pipeline.loop
    return {
        "concurrency": loop.concurrency,
        "batch": loop.groups_per_step * loop.k,
        "steps": loop.steps,
        "max_lag": loop.max_lag,
        "replicas": int(runs[0]["engine"].get("replicas", 1.0)),
        "wall_s": [r["wall_s"] for r in runs],
        "trainer_step_s": [x for r in runs for x in r["trainer_step_s"]],
        "save_s": [x for r in runs for x in r["save_s"]],
        "load_s": [x for r in runs for x in r["load_s"]],
        "engine_step_s": busy / n_steps if n_steps else None,
        "engine_rows_per_step": tokens / n_steps if n_steps else None,
        "episodes": len(eps["turn_tokens"]),
        **eps,
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--preset", default="quick")
    ap.add_argument("--model", default=None, help="override model.name (default: the preset's)")
    ap.add_argument("--steps", type=int, default=6, help="RL steps per run")
    ap.add_argument("--seeds", type=int, default=3, help="seeds per mode")
    ap.add_argument("--latency-preset", default="web-ai",
                    choices=["", "web-fast", "web-ai", "web-serp"],
                    help="env.search.latency.preset ('' = the config's latency as it is)")  # fmt: skip
    ap.add_argument("--latency", default=None, choices=["none", "lognormal", "pareto"],
                    help="override the latency kind")  # fmt: skip
    ap.add_argument("--time-scale", type=parse_time_scale, default=None,
                    help="env.search.latency.time_scale of the RL runs (docs/env.md §3), or "
                    "'auto': calibrated by one RL step (provrl.bench.time_scale)")  # fmt: skip
    ap.add_argument("--median-latency", type=float, default=None, help="override the median (s)")  # fmt: skip
    ap.add_argument("--dev-tasks", type=int, default=64, help="dev tasks of the final evaluation")  # fmt: skip
    ap.add_argument("--dev-k", type=int, default=4, help="samples per dev task (final)")
    ap.add_argument("--curve-every", type=int, default=1,
                    help="evaluate every n-th step's weights for the curve (0: none)")  # fmt: skip
    ap.add_argument("--curve-dev-tasks", type=int, default=16)
    ap.add_argument("--curve-k", type=int, default=2)
    ap.add_argument("--threshold", type=float, default=None,
                    help="dev accuracy (curve set) for the time-to-threshold; default: the "
                    "lower of the two modes' median final curve accuracy")  # fmt: skip
    ap.add_argument("--margin", type=float, default=0.05, help="equivalence margin (accuracy)")
    ap.add_argument("--shared", type=Path, default=None,
                    help="an existing run directory (warm start, probe, filter) to start "
                    "from instead of running them")  # fmt: skip
    ap.add_argument("--out", type=Path, default=Path("runs/async_vs_sync"))
    ap.add_argument("--keep", type=Path, default=None,
                    help="a folder (under results/) keeping each finished run (module docstring)")  # fmt: skip
    ap.add_argument("--results", type=Path, default=None, help="also write the JSON here")
    ap.add_argument("--plot", type=Path, default=None, help="the accuracy-vs-wall-clock PNG")
    ap.add_argument("--set", dest="overrides", action="append", default=[])
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)

    sets = [*args.overrides, f"pipeline.loop.steps={args.steps}", "pipeline.eval.policies=[]"]
    if args.model:
        sets.append(f"model.name={args.model}")
    # 1. one shared warm start, probe and filter (RL with 0 steps, no eval), with the pieces
    # kept in --keep (on a machine that lost its runs: the probe put back, finished runs read)
    shared, kept = kept_shared_start(args.preset, sets, args.shared or args.out / "shared",
                                     reuse=args.shared is not None, keep=args.keep,
                                     settings={k: getattr(args, k) for k in SETTINGS})  # fmt: skip
    cfg0, world, start = shared.cfg, shared.world, shared.start
    lat0 = latency_sets(args.latency_preset, args.latency, args.median_latency, 0)
    scale, calibration = resolve_time_scale(args.time_scale, shared, args.preset, [*sets, *lat0],
                                            args.out / "time-scale", kept)  # fmt: skip
    curve0 = None
    if args.curve_every:
        curve0 = kept.get("curve-v0")
        if curve0 is None:
            curve0 = evaluate_policy(start, world, cfg0, args.out / "curve-v0",
                                     n=args.curve_dev_tasks, k=args.curve_k)["accuracy"]  # fmt: skip
            kept.put("curve-v0", curve0)

    rows: dict[str, list[dict[str, Any]]] = {m: [] for m in MODES}
    task_acc: dict[str, list[dict[str, float]]] = {m: [] for m in MODES}
    inputs: dict[str, list[dict[str, Any]]] = {m: [] for m in MODES}
    cfgs: dict[str, RunConfig] = {}
    for seed in range(args.seeds):
        for mode in MODES:  # interleaved, so machine load hits both alike
            lat = latency_sets(args.latency_preset, args.latency, args.median_latency, seed,
                               scale)  # fmt: skip
            run_sets = [*sets, f"pipeline.loop.mode={mode}", f"seed={seed}", *lat]
            cfgs[mode] = load_config(RunConfig, args.preset, run_sets)
            piece = kept.get(f"{mode}-s{seed}")
            if piece is None:
                piece = one_run(args, shared, run_sets, mode, seed, curve0)
                kept.put(f"{mode}-s{seed}", piece)
            else:
                print(f"[async_vs_sync] {mode} seed {seed}: kept in {kept.path(f'{mode}-s{seed}')}",
                      flush=True)  # fmt: skip
            rows[mode].append(piece["row"])
            task_acc[mode].append(piece["per_task"])
            inputs[mode].append(piece["inputs"])

    result = summarise(args, cfg0, rows, task_acc, curve0)
    result["measured"] = {mode: measured_inputs(cfgs[mode], inputs[mode]) for mode in MODES}
    result["kept"] = kept.summary()
    result["latency"] = cfgs["sync"].env.search.latency.model_dump(mode="json") | {
        "preset_flag": args.latency_preset
    }
    result["time_scale"] = time_scale_record(
        args.time_scale, scale, calibration, result["measured"]
    )
    result["simulator_check"] = check_against_simulator(result)
    if args.plot is not None and args.curve_every:
        plot(result, args.plot)
    if args.results is not None:  # with commit, config, machine, date and seeds
        write_script_result(args.results, "async_vs_sync", result, args)
    print(json.dumps(result, indent=None if args.json else 2))
    return result


def one_run(
    args: argparse.Namespace,
    shared: SharedStart,
    run_sets: list[str],
    mode: str,
    seed: int,
    curve0: float | None,
) -> dict[str, Any]:
    """One mode and seed: its RL stage from a copy of the shared start, the final policy's dev
    evaluation and the curve's evaluations. Its piece: the row, each dev task's accuracy and
    the simulator's inputs (:func:`run_inputs`)."""
    d = args.out / f"{mode}-s{seed}"
    every = args.curve_every
    versions = {v for v in range(1, args.steps + 1) if every and (v % every == 0 or v == args.steps)}  # fmt: skip
    cfg, m = rl_from_shared(shared, args.preset, run_sets, d, keep_dir=d / "kept", keep=versions)
    s = m.summary
    ev = evaluate_policy(s["checkpoint"], shared.world, cfg, d / "dev-eval",
                         n=args.dev_tasks, k=args.dev_k)  # fmt: skip
    curve: list[list[float]] = []
    if every and curve0 is not None:
        curve.append([0.0, 0.0, curve0])
        wall = {int(r["version"]): float(r["wall_s"]) for r in m.steps}
        for v, path in sorted(m.checkpoints.items()):
            e = evaluate_policy(str(path), shared.world, cfg, d / f"curve-v{v}",
                                n=args.curve_dev_tasks, k=args.curve_k)  # fmt: skip
            curve.append([wall.get(v, float(s["wall_s"])), float(v), e["accuracy"]])
    shutil.rmtree(d / "kept", ignore_errors=True)  # a model's size per version
    row = {
        "seed": seed,
        "wall_s": round(s["wall_s"], 2),
        "trajectories_trained": s["trajectories_trained"],
        "trajectories_generated": int(s.get("collector", {}).get("episodes", 0)),
        "trajectories_per_s": round(s["trajectories_trained"] / s["wall_s"], 3),
        "engine_idle_frac": round(1 - s["engine_busy_frac"], 3),
        "trainer_idle_frac": round(s["trainer_idle_frac"], 3),
        "dev_accuracy": round(ev["accuracy"], 4),
        "dev_mean_reward": round(ev["mean_reward"], 4),
        "groups_dropped_stale": s["groups_dropped_stale"],
        "lag_histogram": lag_histogram(m.steps),
        "engine": m.engine,
        "save_s": [round(x, 3) for x in m.save_s],
        "load_s": [round(x, 3) for x in m.load_s],
        "curve": curve,
    }
    return {"row": row, "per_task": ev["per_task"], "inputs": run_inputs(m, d / "rl" / "trajectories.jsonl")}  # fmt: skip


def summarise(
    args: argparse.Namespace,
    cfg0: RunConfig,
    rows: dict[str, list[dict[str, Any]]],
    task_acc: dict[str, list[dict[str, float]]],
    curve0: float | None,
) -> dict[str, Any]:
    """The JSON's figures from every run's row (module docstring)."""

    def med(mode: str, key: str) -> float:
        return float(statistics.median(r[key] for r in rows[mode]))

    def spread(mode: str) -> float:
        accs = [r["dev_accuracy"] for r in rows[mode]]
        return float(max(accs) - min(accs))

    threshold = args.threshold
    if threshold is None and curve0 is not None:
        finals = {m: statistics.median(r["curve"][-1][2] for r in rows[m]) for m in MODES}
        threshold = float(min(finals.values()))
    for m in MODES:
        for r in rows[m]:
            pts = [(p[0], p[2]) for p in r["curve"]]
            r["time_to_threshold_s"] = time_to_threshold(pts, threshold) if pts and threshold is not None else None  # fmt: skip

    def med_time(mode: str) -> float | None:
        ts = [r["time_to_threshold_s"] for r in rows[mode]]
        if not ts or any(t is None for t in ts):
            return None
        return float(statistics.median(ts))

    samples = {r["trajectories_trained"] for m in MODES for r in rows[m]}
    keys = ("wall_s", "trajectories_per_s", "engine_idle_frac", "trainer_idle_frac",
            "dev_accuracy", "dev_mean_reward")  # fmt: skip
    counters = ("hotloads", "drains", "cache_resets", "drain_evictions", "drain_wait_s")
    result: dict[str, Any] = {
        "preset": args.preset,
        "model": cfg0.model.name,
        "steps": args.steps,
        "samples_per_run": args.steps * cfg0.pipeline.loop.groups_per_step * cfg0.pipeline.loop.k,
        "samples_equal": len(samples) == 1,
        "seeds": args.seeds,
        "dev": {"tasks": args.dev_tasks, "k": args.dev_k},
        "curve": {
            "tasks": args.curve_dev_tasks,
            "k": args.curve_k,
            "every": args.curve_every,
            "warm_start_accuracy": curve0,
            "threshold": threshold,
        },
        "modes": {
            m: {k: med(m, k) for k in keys}
            | {
                "time_to_threshold_s": med_time(m),
                "dev_accuracy_seed_spread": spread(m),
                "lag_histogram": add_histograms([r["lag_histogram"] for r in rows[m]]),
                "engine": {c: sum(r["engine"].get(c, 0.0) for r in rows[m]) for c in counters},
                "runs": rows[m],
            }
            for m in MODES
        },
    }
    ratio = med("sync", "wall_s") / med("async", "wall_s")
    tasks, acc_sync, acc_async = paired_task_accuracy(task_acc)
    eq = equivalence_report(acc_sync, acc_async, args.margin)
    t_sync, t_async = med_time("sync"), med_time("async")
    result |= {
        "wall_ratio_async_over_sync": round(1 / ratio, 3),
        "wall_ratio_per_seed": [
            round(a["wall_s"] / s["wall_s"], 3)
            for s, a in zip(rows["sync"], rows["async"], strict=True)
        ],
        "speed_ratio": round(ratio, 3),
        "time_to_threshold_ratio_async_over_sync": round(t_async / t_sync, 3)
        if t_sync and t_async is not None
        else None,
        "equivalent": eq["equivalent"],
        "accuracy_equivalence": eq | {"tasks": len(tasks), "unit": "dev task, mean over seeds"},
        "target_met": 1 / ratio <= 0.5 and eq["equivalent"],
    }
    return result


def plot(result: dict[str, Any], path: Path) -> None:
    """Dev accuracy (the curve's set) against wall seconds of the RL stage: one thin line per
    seed, one colour per mode, the threshold dotted."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 4))
    for mode, colour in zip(MODES, ("tab:blue", "tab:orange"), strict=True):
        for i, r in enumerate(result["modes"][mode]["runs"]):
            xs, ys = [p[0] for p in r["curve"]], [p[2] for p in r["curve"]]
            label = f"{mode} ({'strict on-policy' if mode == 'sync' else 'hot-load'})"
            ax.plot(xs, ys, "o-" if mode == "async" else "s--", color=colour, alpha=0.8,
                    lw=1, ms=3, label=label if i == 0 else None)  # fmt: skip
    thr = result["curve"]["threshold"]
    if thr is not None:
        ax.axhline(thr, color="grey", ls=":", lw=0.8, label=f"threshold {thr:.2f}")
    c = result["curve"]
    ax.set_xlabel("wall seconds of the RL stage")
    ax.set_ylabel(f"dev accuracy ({c['tasks']} tasks × {c['k']})")
    ax.set_title(f"{result['model']}: async / sync wall {result['wall_ratio_async_over_sync']}")
    ax.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    main()

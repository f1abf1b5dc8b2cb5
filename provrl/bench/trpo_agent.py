"""TRPO vs clipped GRPO on the asynchronous agent, as staleness grows (issue 35 item 5).

The seed's other half: a surrogate built from old data predicts improvement only near the
old policy, which is why TRPO bounds the step. A mixed-version batch is that situation. For
each optimizer (``rl.optimizer``: ``trpo``, or ``adamw`` = clipped GRPO), each staleness
bound ``pipeline.loop.max_lag`` ∈ ``--max-lags`` and each seed, the async RL stage runs from
one shared warm start (:func:`provrl.bench.agent_runs.run_measured`, every step's weights
kept) with the search latency on (``--latency-preset``); afterwards every kept version is
evaluated on the same ``--fresh-tasks`` dev tasks × ``--fresh-k`` samples with the same
sampling seed (fresh rollouts, paired across versions). Per step (``runs[].steps``)::

    predicted      trpo_expected_improvement: the line search's α^j β gᵀs, the first-order
                   gain of the surrogate L(θ) = Σ_t ω_t (π_θ/q_{v_t}) A_t  (TRPO only)
    surrogate      trpo_improvement: L(θ_new) − L(θ_old) on the same (stale) batch (TRPO)
    realised       mean reward on the fresh rollouts at version u+1 minus at version u
    kl_behaviour   KL(q‖π_θ) before the step, k3 estimator over the batch's action tokens
                   (kl_q_pi_k3): how far the batch's behaviour policies are from the learner
    kl_step        trpo_kl: mean KL(π_old‖π_new) of the accepted step (TRPO)
    step_frac      the line search's accepted α^j (0: rejected; TRPO)
    lag_mean       the batch's mean version lag (action tokens)
    dev_accuracy   accuracy on the fresh rollouts at version u+1, and wall_s of the step

Per configuration (``configs["trpo-L2"]`` …): Pearson and Spearman correlation of predicted
and realised over all its steps and seeds, their mean ratio, mean KLs, final dev accuracy
and accuracy gained per wall-second. The step records come from ``rl/steps.jsonl``; the loop
itself is not changed.

``--time-scale N`` dilates the RL runs' search latency (``env.search.latency.time_scale``,
docs/env.md §3); ``auto`` measures N by one RL step and keeps it (:mod:`provrl.bench.time_scale`). ``--keep DIR`` (under ``results/``, committed) keeps each finished run and the
warm start's fresh evaluation as small pieces, and the probe + filter as an archive, so the
benchmark (12 RL stages at its defaults) can be spread over sessions of a machine that may come
back without ``runs/`` (:func:`provrl.bench.agent_runs.kept_shared_start`; async_vs_sync's
docstring says how a rerun reads them back).

    python benchmarks/trpo_agent.py --json                    # tiny model, quick preset
    python benchmarks/trpo_agent.py --preset default --steps 8 --seeds 2 --time-scale auto \\
        --keep results/trpo-agent-parts \\
        --results results/trpo_agent.json --plot docs/img/trpo_agent.png --json
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
from pathlib import Path
from typing import Any

import numpy as np

from provrl.bench.agent_runs import (
    SharedStart,
    evaluate_policy,
    kept_shared_start,
    resolve_time_scale,
    rl_from_shared,
)
from provrl.bench.async_vs_sync import latency_sets
from provrl.bench.results import write_script_result
from provrl.bench.time_scale import parse_time_scale, time_scale_record

OPTIMIZERS = {"trpo": "trpo", "grpo": "adamw"}
"""Benchmark name → ``rl.optimizer``."""

SETTINGS = ("preset", "model", "steps", "latency_preset", "time_scale", "fresh_tasks",
            "fresh_k", "overrides")  # fmt: skip
"""The flags that change a run's figures (their digest is in a kept piece's identity; not
``--seeds``, ``--max-lags``, ``--optimizers``: they choose which pieces exist)."""


def _num(x: Any) -> float | None:
    return float(x) if isinstance(x, int | float) and math.isfinite(float(x)) else None


def step_rows(steps: list[dict[str, Any]], fresh: dict[int, dict[str, float]]) -> list[dict[str, Any]]:  # fmt: skip
    """One row per step record (module docstring), joined with the fresh evaluations
    ``fresh[version] = {"accuracy", "mean_reward"}`` of versions u and u+1."""
    rows = []
    for s in steps:
        v = int(s["version"])
        before, after = fresh.get(v - 1), fresh.get(v)
        realised = after["mean_reward"] - before["mean_reward"] if before and after else None
        rows.append(
            {
                "step": int(s["step"]),
                "version": v,
                "wall_s": _num(s.get("wall_s")),
                "predicted": _num(s.get("trpo_expected_improvement")),
                "surrogate": _num(s.get("trpo_improvement")),
                "realised": realised,
                "kl_behaviour": _num(s.get("kl_q_pi_k3")),
                "kl_step": _num(s.get("trpo_kl")),
                "step_frac": _num(s.get("trpo_step_frac")),
                "accepted": _num(s.get("trpo_accepted")),
                "lag_mean": _num(s.get("lag_mean")),
                "max_lag": _num(s.get("max_lag")),
                "clip_frac": _num(s.get("clip_frac")),
                "dev_accuracy": after["accuracy"] if after else None,
            }
        )
    return rows


def correlations(xs: list[float], ys: list[float]) -> dict[str, float | None]:
    """Pearson and Spearman correlation of paired values (None below 3 pairs or without
    spread) and the mean of y / x over pairs with x ≠ 0."""
    from scipy import stats

    ratio = [y / x for x, y in zip(xs, ys, strict=True) if x != 0]
    out: dict[str, float | None] = {"pairs": float(len(xs)), "pearson": None, "spearman": None,
                                    "mean_ratio": float(np.mean(ratio)) if ratio else None}  # fmt: skip
    if len(xs) >= 3 and np.std(xs) > 0 and np.std(ys) > 0:
        out["pearson"] = float(stats.pearsonr(xs, ys).statistic)
        out["spearman"] = float(stats.spearmanr(xs, ys).statistic)
    return out


def summarise_config(runs: list[dict[str, Any]], acc0: float) -> dict[str, Any]:
    """One configuration's figures over its seeds (module docstring)."""
    steps = [s for r in runs for s in r["steps"]]
    pairs = [(s["predicted"], s["realised"]) for s in steps
             if s["predicted"] is not None and s["realised"] is not None]  # fmt: skip

    def mean(key: str) -> float | None:
        xs = [s[key] for s in steps if s[key] is not None]
        return float(np.mean(xs)) if xs else None

    finals = [r["final_dev_accuracy"] for r in runs]
    walls = [r["wall_s"] for r in runs]
    gains = [(f - acc0) / w for f, w in zip(finals, walls, strict=True)]
    return {
        "predicted_vs_realised": correlations([p for p, _ in pairs], [q for _, q in pairs]),
        "kl_behaviour_mean": mean("kl_behaviour"),
        "kl_step_mean": mean("kl_step"),
        "step_frac_mean": mean("step_frac"),
        "lag_mean": mean("lag_mean"),
        "final_dev_accuracy": float(np.mean(finals)),
        "wall_s": float(np.mean(walls)),
        "accuracy_gain_per_wall_s": float(np.mean(gains)),
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--preset", default="quick")
    ap.add_argument("--model", default=None, help="override model.name (default: the preset's)")
    ap.add_argument("--steps", type=int, default=4, help="RL steps per run")
    ap.add_argument("--seeds", type=int, default=2, help="seeds per configuration")
    ap.add_argument("--max-lags", default="1,2,4", help="pipeline.loop.max_lag values")
    ap.add_argument("--optimizers", default="trpo,grpo", help="of: trpo, grpo (clipped, AdamW)")
    ap.add_argument("--latency-preset", default="web-ai",
                    choices=["", "web-fast", "web-ai", "web-serp"])  # fmt: skip
    ap.add_argument("--time-scale", type=parse_time_scale, default=None,
                    help="env.search.latency.time_scale of the RL runs (docs/env.md §3), or "
                    "'auto': calibrated by one RL step (provrl.bench.time_scale)")  # fmt: skip
    ap.add_argument("--fresh-tasks", type=int, default=32, help="dev tasks of each evaluation")
    ap.add_argument("--fresh-k", type=int, default=4, help="samples per task")
    ap.add_argument("--shared", type=Path, default=None,
                    help="an existing run directory (warm start, probe, filter) to start from")  # fmt: skip
    ap.add_argument("--out", type=Path, default=Path("runs/trpo_agent"))
    ap.add_argument("--keep", type=Path, default=None,
                    help="a folder (under results/) keeping each finished run (module docstring)")  # fmt: skip
    ap.add_argument("--results", type=Path, default=None, help="also write the JSON here")
    ap.add_argument("--plot", type=Path, default=None, help="the PNG")
    ap.add_argument("--set", dest="overrides", action="append", default=[])
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    lags = [int(x) for x in args.max_lags.split(",")]
    opts = args.optimizers.split(",")
    if unknown := set(opts) - set(OPTIMIZERS):
        raise SystemExit(f"--optimizers: unknown {sorted(unknown)} (of: trpo, grpo)")

    sets = [*args.overrides, f"pipeline.loop.steps={args.steps}", "pipeline.eval.policies=[]"]
    if args.model:
        sets.append(f"model.name={args.model}")
    shared, kept = kept_shared_start(args.preset, sets, args.shared or args.out / "shared",
                                     reuse=args.shared is not None, keep=args.keep,
                                     settings={k: getattr(args, k) for k in SETTINGS})  # fmt: skip
    lat0 = latency_sets(args.latency_preset, None, None, 0)
    scale, calibration = resolve_time_scale(args.time_scale, shared, args.preset, [*sets, *lat0],
                                            args.out / "time-scale", kept)  # fmt: skip
    n, k = args.fresh_tasks, args.fresh_k
    ev0 = kept.get("fresh-v0")
    if ev0 is None:
        ev0 = evaluate_policy(shared.start, shared.world, shared.cfg, args.out / "fresh-v0", n=n, k=k)  # fmt: skip
        kept.put("fresh-v0", ev0)
    configs: dict[str, dict[str, Any]] = {}
    for opt in opts:
        for lag in lags:
            runs = []
            for seed in range(args.seeds):
                name = f"{opt}-L{lag}-s{seed}"
                run = kept.get(name)
                if run is None:
                    run = one_run(args, shared, sets, opt, lag, seed, ev0, scale)
                    kept.put(name, run)
                runs.append(run)
            configs[f"{opt}-L{lag}"] = {"optimizer": opt, "max_lag": lag,
                                        **summarise_config(runs, ev0["accuracy"]), "runs": runs}  # fmt: skip
    result: dict[str, Any] = {
        "preset": args.preset,
        "model": shared.cfg.model.name,
        "steps": args.steps,
        "seeds": args.seeds,
        "max_lags": lags,
        "fresh": {
            "tasks": n,
            "k": k,
            "warm_start_accuracy": ev0["accuracy"],
            "warm_start_mean_reward": ev0["mean_reward"],
        },
        "latency_preset": args.latency_preset,
        "configs": configs,
        "time_scale": time_scale_record(args.time_scale, scale, calibration),
        "kept": kept.summary(),
    }
    if args.plot is not None:
        plot(result, args.plot)
    if args.results is not None:  # with commit, config, machine, date and seeds
        write_script_result(args.results, "trpo_agent", result, args)
    print(json.dumps(result, indent=None if args.json else 2))
    return result


def one_run(
    args: argparse.Namespace,
    shared: SharedStart,
    sets: list[str],
    opt: str,
    lag: int,
    seed: int,
    ev0: dict[str, Any],
    scale: float | None,
) -> dict[str, Any]:
    """One optimizer, staleness bound and seed: the async RL stage from a copy of the shared
    start (latency dilated by ``scale``), then every kept version's fresh evaluation; the
    run's row (module docstring)."""
    d = args.out / f"{opt}-L{lag}-s{seed}"
    lat = latency_sets(args.latency_preset, None, None, seed, scale)
    cfg, m = rl_from_shared(shared, args.preset, [
        *sets, "pipeline.loop.mode=async", f"pipeline.loop.max_lag={lag}",
        f"rl.optimizer={OPTIMIZERS[opt]}", f"seed={seed}", *lat], d, keep_dir=d / "kept")  # fmt: skip
    n, k = args.fresh_tasks, args.fresh_k
    fresh = {0: ev0}
    for v, path in sorted(m.checkpoints.items()):
        fresh[v] = evaluate_policy(str(path), shared.world, cfg, d / f"fresh-v{v}", n=n, k=k)
    shutil.rmtree(d / "kept", ignore_errors=True)  # a model's size per version
    return {
        "seed": seed,
        "wall_s": float(m.summary["wall_s"]),
        "final_dev_accuracy": fresh[max(fresh)]["accuracy"],
        "groups_dropped_stale": m.summary["groups_dropped_stale"],
        "steps": step_rows(m.steps, fresh),
    }


def plot(result: dict[str, Any], path: Path) -> None:
    """Three panels: TRPO's predicted vs realised improvement per step (one colour per
    max_lag); KL(q‖π_θ) to the behaviour policy per step; dev accuracy against wall
    seconds (TRPO solid, GRPO dashed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b, c) = plt.subplots(1, 3, figsize=(14, 4))
    colours = dict(zip(result["max_lags"], ("tab:blue", "tab:orange", "tab:green", "tab:red"), strict=False))  # fmt: skip
    for name, cf in result["configs"].items():
        col = colours.get(cf["max_lag"], "grey")
        style = "-" if cf["optimizer"] == "trpo" else "--"
        for i, r in enumerate(cf["runs"]):
            st = r["steps"]
            label = name if i == 0 else None
            if cf["optimizer"] == "trpo":
                pts = [(s["predicted"], s["realised"]) for s in st
                       if s["predicted"] is not None and s["realised"] is not None]  # fmt: skip
                a.scatter([p for p, _ in pts], [q for _, q in pts], color=col, s=14, label=label)
            b.plot([s["step"] for s in st], [s["kl_behaviour"] for s in st], style, color=col,
                   lw=1, label=label)  # fmt: skip
            xs = [0.0] + [s["wall_s"] or 0.0 for s in st]
            ys = [result["fresh"]["warm_start_accuracy"]] + [s["dev_accuracy"] for s in st]
            c.plot(xs, ys, style, color=col, lw=1, marker="o", ms=2, label=label)
    a.axhline(0, color="grey", lw=0.6)
    a.set_xlabel("predicted surrogate improvement (TRPO)")
    a.set_ylabel("realised reward change, fresh rollouts")
    b.set_xlabel("step")
    b.set_ylabel("KL(q‖π_θ) to the behaviour policy (k3)")
    c.set_xlabel("wall seconds")
    c.set_ylabel("dev accuracy (fresh rollouts)")
    for ax in (a, b, c):
        ax.legend(fontsize=7)
    fig.suptitle(f"{result['model']}: TRPO (solid) vs clipped GRPO (dashed) as max_lag grows")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    main()

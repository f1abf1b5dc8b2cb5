"""Warm-start spread: does SFT on oracle traces give tier 1 a spread of K, and keep the
hard tiers hard? (issue 4's open question, measured).

Pipeline, on the default world (``ensure_world(EnvConfig().world)``):

1. **teacher traces** — the oracle on every train task, zero-shot prompt (``shots = 0``):
   ``evaluate("oracle", split="train")`` writes ``oracle-train/trajectories.jsonl``;
   the same on the dev probe tasks gives held-out traces for the NLL check;
2. **SFT** — SmolLM2-135M-Instruct on them (:func:`provrl.train.sft.run_sft`), timed;
3. **probe** — k samples per task (temperature 1, zero-shot) on ``--tasks-per-tier`` dev
   tasks of each tier with :func:`provrl.rollout.evaluate.evaluate`, for the SFT checkpoint and
   for the base model on the same tasks (same seeds).

Per tier it reports accuracy, the histogram of K (0..k), the fraction of tasks with
0 < K < k (what the probe-and-filter step keeps), pass@k, mean tool calls against the
oracle minimum, answered / searched / malformed rates. Every figure is measured in this
run; stages are cached under ``--out`` and reused with ``--resume``.

    python benchmarks/warmstart_spread.py --json                 # the full measurement
    python benchmarks/warmstart_spread.py --max-traces 64 --tasks-per-tier 4 --k 4 --json
    python benchmarks/warmstart_spread.py --plot-from A/result.json B/result.json --png k.png

Each run also writes ``<out>/k_histograms.png``: per tier, the K histogram of every probed
policy side by side.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from provrl.env.build import ensure_world, load_split
from provrl.env.config import EnvConfig
from provrl.rollout.evaluate import evaluate, select_tasks
from provrl.train.config import SFTConfig
from provrl.train.sft import load_traces, run_sft, select_traces

TIERS = (1, 2, 3, 4)


def tier_row(block: dict[str, Any], k: int) -> dict[str, Any]:
    """The per-tier figures we publish, from an ``evaluate`` summary block."""
    if not block.get("tasks"):
        return {"tasks": 0}
    hist = {int(j): int(v) for j, v in block["K_histogram"].items()}
    n = block["tasks"]
    spread = sum(v for j, v in hist.items() if 0 < j < k)
    return {
        "tasks": n,
        "accuracy": round(block["accuracy"], 4),
        f"pass@{k}": round(block[f"pass@{k}"], 4),
        "K_histogram": [hist.get(j, 0) for j in range(k + 1)],
        "spread_frac": round(spread / n, 4),
        "all_fail_frac": round(hist.get(0, 0) / n, 4),
        "all_pass_frac": round(hist.get(k, 0) / n, 4),
        "mean_tool_calls": round(block["mean_tool_calls"], 3),
        "oracle_min_tool_calls": round(block["mean_min_searches"], 3),
        "answered_rate": round(block["answered_rate"], 4),
        "searched_rate": round(block["searched_rate"], 4),
        "mean_malformed_calls": round(block["mean_malformed_calls"], 3),
        "mean_tokens": round(block["mean_tokens"], 1),
        "mean_action_tokens": round(block["mean_action_tokens"], 1),
    }


def probe(
    policy: str, world: Path, out: Path, args: argparse.Namespace, resume: bool
) -> dict[str, Any]:
    """k samples per task on ``tasks_per_tier`` dev tasks of each tier (one evaluate call
    per tier, so each tier gets its own n)."""
    rows: dict[str, Any] = {}
    wall = 0.0
    for tier in args.tiers:
        run = out / f"tier{tier}"
        if resume and (run / "eval.json").is_file():
            s = json.loads((run / "eval.json").read_text())
        else:
            cfg = EnvConfig()
            cfg.agent.shots, cfg.agent.temperature = 0, args.temperature
            cfg.eval.split, cfg.eval.tiers, cfg.eval.n = "dev", (tier,), args.tasks_per_tier
            cfg.eval.k, cfg.eval.concurrency, cfg.eval.seed = args.k, args.concurrency, args.seed
            if run.exists():  # a stale partial run: start its log afresh
                (run / "trajectories.jsonl").unlink(missing_ok=True)
            s = evaluate(policy, world, cfg, run, progress=not args.quiet)
        wall += s["wall_s"]
        rows[str(tier)] = tier_row(s, args.k) | {"wall_s": s["wall_s"]}
    return {"per_tier": rows, "wall_s": round(wall, 1)}


def plot_k_histograms(curves: dict[str, dict[str, Any]], k: int, path: Path) -> Path:
    """One panel per tier: the fraction of tasks at each K ∈ {0..k} for every policy
    (``curves``: label → ``per_tier`` block), the kept band 0 < K < k shaded."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    tiers = sorted({t for block in curves.values() for t in block})
    fig, axes = plt.subplots(1, len(tiers), figsize=(3.4 * len(tiers), 3.2), sharey=True)
    axes = np.atleast_1d(axes)
    width = 0.8 / max(1, len(curves))
    for ax, tier in zip(axes, tiers, strict=True):
        ax.axvspan(0.5, k - 0.5, color="0.92", zorder=0)
        for i, (label, block) in enumerate(curves.items()):
            row = block.get(tier)
            if not row or not row.get("tasks"):
                continue
            frac = np.asarray(row["K_histogram"], dtype=float) / row["tasks"]
            x = np.arange(k + 1) - 0.4 + width * (i + 0.5)
            ax.bar(x, frac, width, label=f"{label} (kept {row['spread_frac']:.2f})")
        ax.set_title(f"tier {tier}")
        ax.set_xlabel(f"K (successes of {k})")
        ax.set_xticks(range(k + 1))
        ax.legend(fontsize=7)
    axes[0].set_ylabel("fraction of tasks")
    fig.suptitle("K per task after the warm start (shaded: 0 < K < k, what the filter keeps)")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _curves(result: dict[str, Any], name: str) -> dict[str, dict[str, Any]]:
    """label → per_tier block of one result (the SFT probe, and the base probe if run)."""
    out = {f"{name}SFT ({result['sft']['traces']} traces)": result["probe"]["sft"]["per_tier"]}
    if result["probe"].get("base"):
        out["base (zero-shot)"] = result["probe"]["base"]["per_tier"]
    return out


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=Path("runs/warmstart"), help="run directory")
    ap.add_argument("--model", default="smollm2-135m", help="base model")
    ap.add_argument("--max-traces", type=int, default=0, help="SFT traces (0 = all train)")
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--lr", type=float, default=1e-4)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--warmup-steps", type=int, default=10)
    ap.add_argument("--micro-batch-tokens", type=int, default=2048)
    ap.add_argument("--autocast", default="bfloat16", choices=["float32", "bfloat16"])
    ap.add_argument("--tasks-per-tier", type=int, default=16)
    ap.add_argument("--tiers", type=lambda s: tuple(int(x) for x in s.split(",")), default=TIERS)
    ap.add_argument("--k", type=int, default=8)
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--skip-base", action="store_true", help="do not probe the base model")
    ap.add_argument("--resume", action="store_true", help="reuse finished stages in --out")
    ap.add_argument("--json", action="store_true", help="print the result as JSON")
    ap.add_argument("--quiet", action="store_true", help="no progress bars")
    ap.add_argument(
        "--plot-from", type=Path, nargs="+", help="only plot these result.json files together"
    )
    ap.add_argument("--png", type=Path, default=Path("k_histograms.png"), help="with --plot-from")
    args = ap.parse_args(argv)
    if args.plot_from:
        curves: dict[str, dict[str, Any]] = {}
        results = [json.loads(p.read_text()) for p in args.plot_from]
        for r in results:
            curves |= _curves(r, "")
        print(plot_k_histograms(curves, results[0]["probe"]["k"], args.png))
        return {"png": str(args.png)}

    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    world = ensure_world(EnvConfig().world)

    # 1. teacher traces: the oracle on every train task, zero-shot prompt -----------------
    teacher = out / "oracle-train"
    if not (args.resume and (teacher / "eval.json").is_file()):
        cfg = EnvConfig()
        cfg.agent.shots, cfg.eval.split, cfg.eval.n = 0, "train", 0
        (teacher / "trajectories.jsonl").unlink(missing_ok=True)
        evaluate("oracle", world, cfg, teacher, progress=False)
    oracle_train = json.loads((teacher / "eval.json").read_text())
    # held-out teacher traces on the very dev tasks the probe uses (NLL before/after)
    heldout = out / "oracle-dev-probe"
    if not (args.resume and (heldout / "eval.json").is_file()):
        (heldout / "trajectories.jsonl").unlink(missing_ok=True)
        for tier in args.tiers:
            cfg = EnvConfig()
            cfg.agent.shots, cfg.eval.split, cfg.eval.tiers = 0, "dev", (tier,)
            cfg.eval.n, cfg.eval.seed = args.tasks_per_tier, args.seed
            evaluate("oracle", world, cfg, heldout, progress=False)
    dev_traces = load_traces([heldout])
    probe_ids = {
        t.task_id
        for tier in args.tiers
        for t in select_tasks(
            [x for x in load_split(world, "dev") if x.tier == tier], args.tasks_per_tier, args.seed
        )
    }
    assert {t.task_id for t in dev_traces} == probe_ids, "held-out traces ≠ probe tasks"

    # 2. SFT -------------------------------------------------------------------------------
    ckpt = out / "sft-checkpoint"
    sft_cfg = SFTConfig(
        selection="fewest_tool_calls",
        max_per_task=1,
        max_traces=args.max_traces,
        epochs=args.epochs,
        lr=args.lr,
        batch_size=args.batch_size,
        warmup_steps=args.warmup_steps,
        micro_batch_tokens=args.micro_batch_tokens,
        autocast=args.autocast,
        seed=args.seed,
        progress=not args.quiet,
    )
    sft_json = out / "sft-run" / "sft.json"
    if args.resume and sft_json.is_file() and (ckpt / "config.json").is_file():
        sft = json.loads(sft_json.read_text())
    else:
        sft = run_sft(
            [teacher],
            args.model,
            ckpt,
            sft_cfg,
            run_dir=out / "sft-run",
            eval_traces=dev_traces,
        )
    trained_traces = load_traces([teacher])
    per_tier_traces: dict[str, int] = {}
    tier_of = {t.task_id: t.tier for t in load_split(world, "train")}
    for t in select_traces(trained_traces, sft_cfg):
        key = str(tier_of[t.task_id])
        per_tier_traces[key] = per_tier_traces.get(key, 0) + 1

    # 3. probe: SFT checkpoint and base model on the same dev tasks ------------------------
    t0 = time.perf_counter()
    sft_probe = probe(str(ckpt), world, out / "probe-sft", args, args.resume)
    base_probe = None
    if not args.skip_base:
        base_probe = probe(args.model, world, out / "probe-base", args, args.resume)
    probe_wall = time.perf_counter() - t0

    result: dict[str, Any] = {
        "benchmark": "warmstart_spread",
        "world": str(world),
        "base_model": args.model,
        "teacher": {
            "policy": "oracle",
            "split": "train",
            "shots": 0,
            "tasks": oracle_train["n"],
            "accuracy": oracle_train["accuracy"],
            "mean_tool_calls_per_tier": {
                k: round(v["mean_tool_calls"], 3) for k, v in oracle_train["per_tier"].items()
            },
            "mean_tokens_per_tier": {
                k: round(v["mean_tokens"], 1) for k, v in oracle_train["per_tier"].items()
            },
            "mean_action_tokens_per_tier": {
                k: round(v["mean_action_tokens"], 1) for k, v in oracle_train["per_tier"].items()
            },
        },
        "sft": {
            "traces": sft["traces_selected"],
            "traces_per_tier": dict(sorted(per_tier_traces.items())),
            "epochs": sft["epochs"],
            "steps": sft["steps"],
            "skipped_steps": sft["skipped_steps"],
            "lr": sft["config"]["lr"],
            "schedule": sft["config"]["schedule"],
            "batch_size": sft["config"]["batch_size"],
            "autocast": sft["config"]["autocast"],
            "tokens": sft["tokens"],
            "action_tokens": sft["action_tokens"],
            "wall_s": round(sft["wall_s"], 1),
            "tokens_per_s": round(sft["tokens_per_s"], 1),
            "first_loss": round(sft["first_loss"], 4),
            "last_loss": round(sft["last_loss"], 4),
            "heldout_nll_before": round(sft["eval_nll_before"], 4),
            "heldout_nll_after": round(sft["eval_nll_after"], 4),
            "checkpoint": str(ckpt),
        },
        "probe": {
            "split": "dev",
            "tasks_per_tier": args.tasks_per_tier,
            "k": args.k,
            "temperature": args.temperature,
            "shots": 0,
            "seed": args.seed,
            "sft": sft_probe,
            "base": base_probe,
            "wall_s": round(probe_wall, 1),
        },
    }
    (out / "result.json").write_text(json.dumps(result, indent=2))
    plot_k_histograms(_curves(result, ""), args.k, out / "k_histograms.png")
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        _print_table(result)
    return result


def _print_table(result: dict[str, Any]) -> None:
    k = result["probe"]["k"]
    s = result["sft"]
    print(
        f"SFT: {s['traces']} traces, {s['steps']} steps, {s['wall_s']} s "
        f"({s['tokens_per_s']} tok/s), loss {s['first_loss']} → {s['last_loss']}, "
        f"held-out NLL {s['heldout_nll_before']} → {s['heldout_nll_after']}"
    )
    for name in ("sft", "base"):
        block = result["probe"][name]
        if block is None:
            continue
        print(f"\n{name}: tier  acc    K histogram (0..{k})            0<K<{k}  tools/oracle")
        for tier, r in block["per_tier"].items():
            print(
                f"        {tier}   {r['accuracy']:.3f}  {r['K_histogram']!s:32} "
                f"{r['spread_frac']:.2f}   {r['mean_tool_calls']:.2f}/{r['oracle_min_tool_calls']:.2f}"
            )


if __name__ == "__main__":
    main(sys.argv[1:])

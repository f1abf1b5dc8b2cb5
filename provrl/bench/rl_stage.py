"""The RL stage's wall time under settings that change how fast it runs, side by side.

Speed knobs (``pipeline.loop.lend_cores``, ``split_cores``, ``engine.*`` sizes, the trainer's
micro-batches) must be chosen by measurement, and one RL run per setting is one draw on a
machine whose speed drifts. This benchmark runs the RL stage of one preset from one shared
warm start (an existing run directory with world, warm start, probe and filter:
``--shared``; without it they run first into ``OUT/shared``) once per arm and repeat, arms interleaved and their order alternating from one
repeat to the next, so machine load hits every arm alike; repeat ``r`` of every arm uses the
same seeds (``pipeline.loop.seed = rl.seed = r``). No evaluation: only the stage's time.

Per run (``arms[name].runs``): the stage's wall seconds, trajectories trained per second,
generated tokens per second (the engine's counter over the stage's wall time), the trainer's
idle share and the engine's busy share, the median trainer step, the share of trained
trajectories whose action tokens span two versions, the training batches' accuracy
(a sanity check that the arms learn alike, not an evaluation) and the stage's ``threads``
(the split, the lent count, the learner's micro-batches on its own or borrowed threads). Per arm: medians over
repeats. Top level: ``wall_ratio`` of every arm's median wall time over the first arm's, and
``wall_ratio_per_repeat`` (each repeat's paired ratio).

``--keep DIR`` (under ``results/``, committed) keeps each finished run as a small piece with the
identity of the shared stages, a digest of the preset, steps and common overrides, and the
arm's own overrides (:func:`provrl.bench.agent_runs.kept_shared_start`), so a whole-stage
comparison longer than one session goes on after a machine lost ``runs/``: the rerun
rebuilds the warm start, puts the probe back and runs only the missing arms and repeats. Keep
both arms of a repeat in one session: a repeat's paired ratio is only fair when machine load
hits both alike (every piece records its machine, load average and date).

    python benchmarks/rl_stage.py --json                       # tiny model, quick preset
    python benchmarks/rl_stage.py --preset default --shared runs/devR4g --steps 4 \\
        --repeats 2 --arm base= --arm lend=pipeline.loop.lend_cores=true \\
        --arm both=pipeline.loop.lend_cores=true,pipeline.loop.borrow_cores=true \\
        --results results/rl_stage_lend_cores.json --json
    python benchmarks/rl_stage.py --preset default --steps 20 --repeats 2 --arm base= \\
        --arm both=pipeline.loop.lend_cores=true,pipeline.loop.borrow_cores=true \\
        --keep results/rl-stage-parts --results results/rl_stage_whole.json --json
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from typing import Any

from provrl.bench.agent_runs import kept_shared_start, rl_from_shared
from provrl.bench.results import write_script_result

DEFAULT_ARMS = ("base=", "lend=pipeline.loop.split_cores=true,pipeline.loop.lend_cores=true")
"""The arms without ``--arm``: the preset, and the engine lent the learner's core while it
waits (``lend_cores``, which needs ``split_cores``)."""


def parse_arm(spec: str) -> tuple[str, list[str]]:
    """``NAME=k=v,k=v`` (or ``NAME=`` for the preset as it is) → (name, overrides)."""
    name, sep, rest = spec.partition("=")
    if not sep or not name:
        raise argparse.ArgumentTypeError(f"--arm {spec!r}: expected NAME=key=value,... or NAME=")
    sets = [s for s in rest.split(",") if s]
    bad = [s for s in sets if "=" not in s]
    if bad:
        raise argparse.ArgumentTypeError(f"--arm {spec!r}: {bad[0]!r} is not key=value")
    return name, sets


def run_row(summary: dict[str, Any], steps: list[dict[str, Any]], repeat: int) -> dict[str, Any]:
    """One RL stage's figures (module docstring) from its summary and step records."""
    wall = float(summary["wall_s"])
    trained = int(summary["trajectories_trained"])
    step_s = [float(s["step_s"]) for s in steps if "step_s" in s]
    mixed = sum(int(s.get("mixed_version_trajectories", 0)) for s in steps)
    acc = [float(s["accuracy"]) for s in steps if "accuracy" in s]
    return {
        "repeat": repeat,
        "wall_s": round(wall, 2),
        "trajectories_trained": trained,
        "trajectories_per_s": round(trained / wall, 4),
        "generated_tokens_per_s": round(summary["engine"].get("tokens_generated", 0.0) / wall, 2),
        "trainer_idle_frac": round(float(summary["trainer_idle_frac"]), 3),
        "engine_busy_frac": round(float(summary["engine_busy_frac"]), 3),
        "trainer_step_s_median": round(statistics.median(step_s), 2) if step_s else None,
        "mixed_version_frac": round(mixed / trained, 3) if trained else 0.0,
        "batch_accuracy_mean": round(statistics.fmean(acc), 3) if acc else None,
        "threads": summary.get("threads", {}),  # the split, lending, borrowed micro-batches
    }


def _median(xs: list[float | None]) -> float | None:
    vals = [x for x in xs if x is not None]
    return float(statistics.median(vals)) if vals else None


def summarise(rows: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """Per arm the medians over repeats; the wall ratios against the first arm."""
    keys = ("wall_s", "trajectories_per_s", "generated_tokens_per_s", "trainer_idle_frac",
            "engine_busy_frac", "mixed_version_frac", "batch_accuracy_mean")  # fmt: skip
    medians = {a: {k: _median([r[k] for r in rs]) for k in keys} for a, rs in rows.items()}
    base = next(iter(rows))
    wall = {a: m["wall_s"] or 0.0 for a, m in medians.items()}
    return {
        "arms": {a: {**m, "runs": rows[a]} for a, m in medians.items()},
        "baseline": base,
        "wall_ratio": {a: round(wall[a] / wall[base], 3) for a in rows},
        "wall_ratio_per_repeat": {
            a: [round(r["wall_s"] / b["wall_s"], 3) for r, b in zip(rs, rows[base], strict=True)]
            for a, rs in rows.items()
        },
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--preset", default="quick")
    ap.add_argument("--shared", type=Path, default=None,
                    help="a run directory holding world, warm start, probe and filter "
                    "(default: run them into OUT/shared)")  # fmt: skip
    ap.add_argument("--steps", type=int, default=4, help="RL steps per run")
    ap.add_argument("--repeats", type=int, default=2, help="runs per arm (seeds 0..n-1)")
    ap.add_argument("--arm", dest="arms", type=parse_arm, action="append", default=None,
                    help="NAME=key=value,... (repeat; the first arm is the baseline; default: "
                    f"{' and '.join(DEFAULT_ARMS)})")  # fmt: skip
    ap.add_argument("--set", dest="overrides", action="append", default=[],
                    help="overrides of every arm (key=value)")  # fmt: skip
    ap.add_argument("--out", type=Path, default=Path("runs/rl_stage"))
    ap.add_argument("--keep", type=Path, default=None,
                    help="a folder (under results/) keeping each finished run (module docstring)")  # fmt: skip
    ap.add_argument("--results", type=Path, default=None, help="also write the JSON here")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    args.arms = args.arms or [parse_arm(a) for a in DEFAULT_ARMS]
    if len({a for a, _ in args.arms}) != len(args.arms):
        ap.error("--arm names must differ")

    sets = [*args.overrides, f"pipeline.loop.steps={args.steps}", "pipeline.eval.policies=[]"]
    shared, kept = kept_shared_start(
        args.preset, sets, args.shared or args.out / "shared", reuse=args.shared is not None,
        keep=args.keep, settings={"preset": args.preset, "steps": args.steps, "overrides": args.overrides},
    )  # fmt: skip
    rows: dict[str, list[dict[str, Any]]] = {a: [] for a, _ in args.arms}
    for r in range(args.repeats):
        order = args.arms if r % 2 == 0 else list(reversed(args.arms))
        for name, arm_sets in order:
            piece = kept.get(f"{name}-r{r}")
            if piece is not None and piece["arm"] != arm_sets:
                raise ValueError(f"{kept.path(f'{name}-r{r}')}: arm {name} was {piece['arm']}, "
                                 f"here {arm_sets}; name the arm otherwise")  # fmt: skip
            if piece is None:
                arm = [*sets, *arm_sets, f"pipeline.loop.seed={r}", f"rl.seed={r}"]
                _, m = rl_from_shared(shared, args.preset, arm, args.out / f"{name}-r{r}")
                piece = {"arm": arm_sets, "row": run_row(m.summary, m.steps, r)}
                kept.put(f"{name}-r{r}", piece)
            rows[name].append(piece["row"])
            print(json.dumps({"arm": name, **rows[name][-1]}), flush=True)
    result = {
        "preset": args.preset,
        "shared": str(args.shared),
        "steps": args.steps,
        "repeats": args.repeats,
        "arm_overrides": dict(args.arms),
        "overrides": args.overrides,
        **summarise({a: rows[a] for a, _ in args.arms}),
        "kept": kept.summary(),
    }
    if args.results is not None:
        write_script_result(args.results, "rl_stage", result, args)
    print(json.dumps(result, indent=None if args.json else 2))
    return result


if __name__ == "__main__":
    main()

"""``provrl bench learning``: the seed's result, reproducibly — the default preset with several
RL seeds from one warm start, evaluated on the whole test split and on a second world.

::

    shared/         world → warm start → probe → filter → eval of the warm start   (once)
    seed-S/         RL with pipeline.loop.seed = S and rl.seed = S (the shared stages linked
                    in), eval of the RL policy on the same test tasks and sampling seeds
    seed-S/world2/  warm start and RL policy on the test split of a second world (another
                    generator seed: its own corpus, entities and tasks)

Each run is a subprocess (its peak RSS is ``os.wait4``'s for that child alone). Per seed:
the paired accuracy gain RL − warm start over test tasks (points, SE = sd(dᵢ)/√n), the cut
in tool calls per solved task (overall and per tier), per tier where the warm start's and
the RL policy's failures happened (``warmstart_failure_modes`` / ``rl_failure_modes``,
:mod:`provrl.rollout.failures`), the share of trained trajectories whose action tokens span
≥ 2 policy versions, the same gain on the second world, wall time and peak RSS. Across
seeds: the mean and a 95 % t-interval.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from scipy import stats

from provrl.bench.kept import Kept, pools_digest, restore_dirs, shared_identity
from provrl.config import load_config
from provrl.pipeline.stages import paired_difference
from provrl.pipeline.steplog import read_steps
from provrl.rollout.agent import repeat_count
from provrl.rollout.failures import failure_table
from provrl.run_config.run import RunConfig
from provrl.trajlog import read_all

SHARED_STAGES = ("world", "warmstart", "probe", "filter")


Watch = Callable[[], tuple[str, int, int | None]]
"""What a running subprocess has done: ``(what, done, total)`` (total None: unknown)."""


def _lines(path: Path) -> int:
    """Complete lines of a JSONL file that may be growing (0 if it does not exist yet)."""
    try:
        with open(path, "rb") as f:
            return sum(1 for line in f if line.endswith(b"\n"))
    except FileNotFoundError:
        return 0


def watch_run(run_dir: Path, steps: int, eval_episodes: int | None) -> Watch:
    """A ``provrl run`` of RL then eval in ``run_dir``: its RL steps (``rl/steps.jsonl``)
    until they are all done, then its evaluation episodes (every policy's under ``eval/``)."""

    def now() -> tuple[str, int, int | None]:
        done = _lines(run_dir / "rl" / "steps.jsonl")
        if done < steps or not (run_dir / "eval").is_dir():
            return "rl steps", done, steps
        ev = sum(_lines(p) for p in (run_dir / "eval").glob("*/trajectories.jsonl"))
        return "eval episodes", ev, eval_episodes

    return now


def watch_shared(run_dir: Path, probe_episodes: int | None, eval_episodes: int | None) -> Watch:
    """A ``provrl run`` of the shared stages in ``run_dir``: the warm start's SFT steps
    (``warmstart/metrics.jsonl``, whose lines carry the planned total), then the probe's
    episodes, then the evaluation episodes."""

    def now() -> tuple[str, int, int | None]:
        if not (run_dir / "warmstart" / "done.json").exists():
            done, total = 0, None
            with contextlib.suppress(FileNotFoundError):
                for line in (run_dir / "warmstart" / "metrics.jsonl").read_text().splitlines():
                    with contextlib.suppress(ValueError):  # a line being written
                        rec = json.loads(line)
                        done, total = int(rec["step"]), rec.get("sft/total_steps", total)
            return "sft steps", done, int(total) if total is not None else None
        if not (run_dir / "probe" / "done.json").exists():
            return (
                "probe episodes",
                _lines(run_dir / "probe" / "trajectories.jsonl"),
                probe_episodes,
            )
        ev = sum(_lines(p) for p in (run_dir / "eval").glob("*/trajectories.jsonl"))
        return "eval episodes", ev, eval_episodes

    return now


def watch_eval(run_dir: Path, episodes: int | None) -> Watch:
    """A ``provrl eval`` into ``run_dir``: its episodes so far."""
    return lambda: ("eval episodes", _lines(run_dir / "trajectories.jsonl"), episodes)


def _run(
    args: Sequence[str], log: Path, watch: Watch | None = None, label: str = ""
) -> dict[str, float]:
    """Run ``python -m provrl.cli *args`` to completion; its wall time and peak RSS (GiB).
    ``watch``: a progress bar (tqdm, on stderr) over what the run has done, polled every few
    seconds; its output goes to ``log`` as before."""
    t0 = time.perf_counter()
    bar = None
    if watch is not None:
        from tqdm import tqdm

        bar = tqdm(desc=label, dynamic_ncols=True, mininterval=REFRESH_S)
    shown = None  # what the bar counts now (RL steps, then eval episodes)
    with open(log, "ab") as f:
        proc = subprocess.Popen([sys.executable, "-m", "provrl.cli", *args], stdout=f, stderr=f)
        while True:
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG if bar is not None else 0)
            if pid:
                break
            if bar is not None and watch is not None:
                what, done, total = watch()
                if what != shown:  # a new count: its rate and ETA start from what is done
                    bar.reset(total=total)
                    bar.set_description(f"{label}: {what}", refresh=False)
                    bar.initial = bar.n = done
                    shown = what
                bar.total = total
                bar.update(done - bar.n)  # tqdm prints at most every REFRESH_S
            time.sleep(POLL_S)
    if bar is not None:
        bar.close()
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        tail = log.read_text(errors="replace").strip().splitlines()[-5:]
        raise RuntimeError(f"{' '.join(args[:2])} failed ({proc.returncode}): {tail}")
    return {"wall_s": time.perf_counter() - t0, "peak_rss_gb": usage.ru_maxrss / 2**20}


POLL_S = 5.0
"""Seconds between two looks at a watched subprocess."""
REFRESH_S = 10.0
"""Least seconds between two prints of its bar (a log file gets a line per change at most)."""


def _eval_summary(eval_dir: Path) -> dict[str, Any]:
    """Per-task accuracy and per-tier accuracy / tool calls of solved episodes of one eval
    (their histogram, the share that repeated a call, and the calls made after a result had
    shown the answer, :func:`provrl.rollout.agent.calls_after_answer`), and where the
    failures happened (:func:`provrl.rollout.failures.failure_table`; ``{}`` for logs from
    before the hop metrics)."""
    trajs = read_all(eval_dir / "trajectories.jsonl")
    by_task: dict[str, list[float]] = {}
    tier_of: dict[str, int] = {}
    calls: dict[int, list[float]] = {}
    repeats: dict[int, list[bool]] = {}
    after: dict[int, list[float]] = {}  # calls_after_answer (logs before the metric: None)
    for t in trajs:
        em = float(t.metrics.get("exact_match", 0.0))
        by_task.setdefault(t.task_id, []).append(em)
        tier = int(t.metrics.get("tier", 0))
        tier_of[t.task_id] = tier
        if em > 0:
            calls.setdefault(tier, []).append(float(t.metrics.get("num_tool_calls", 0.0)))
            repeats.setdefault(tier, []).append(repeated_call(t))
            if "calls_after_answer" in t.metrics:
                after.setdefault(tier, []).append(float(t.metrics["calls_after_answer"]))
    acc = {k: float(np.mean(v)) for k, v in by_task.items()}
    tiers = sorted(set(tier_of.values()))
    return {
        "task_accuracy": acc,
        "accuracy": float(np.mean(list(acc.values()))) if acc else math.nan,
        "tool_calls_solved": float(np.mean([c for v in calls.values() for c in v]))
        if calls
        else math.nan,
        "per_tier": {
            str(k): {
                "accuracy": float(np.mean([a for t, a in acc.items() if tier_of[t] == k])),
                "tool_calls_solved": float(np.mean(calls[k])) if k in calls else math.nan,
                "tool_calls_solved_hist": calls_histogram(calls.get(k, [])),
                "repeat_share_solved": float(np.mean(repeats[k])) if k in repeats else math.nan,
                "calls_after_answer_solved": float(np.mean(after[k])) if k in after else None,
                "tasks": sum(tier_of[t] == k for t in acc),
                "failure_modes": failure_table(
                    x.metrics for x in trajs if int(x.metrics.get("tier", 0)) == k
                ),
            }
            for k in tiers
        },
    }


def repeated_call(t: Any) -> bool:
    """Whether the episode repeated a search or open it had already run successfully
    (:func:`provrl.rollout.agent.repeat_count`, the rule of its ``num_repeat_calls``), read
    from its calls, so logs from before that metric count too. Records written before
    2026-12-06 counted any repeated search/open key, failed or limit-refused calls included:
    the two rules differ on a few episodes."""
    return repeat_count(t.tool_calls) > 0


def calls_histogram(calls: Sequence[float]) -> dict[str, int]:
    """How many solved episodes used each number of tool calls: ``{"1": n1, "2": n2, …}``
    (whether a policy answers a one-hop question after one search or always searches twice)."""
    c = Counter(int(x) for x in calls)
    return {str(n): c[n] for n in sorted(c)}


def compare(warm: dict[str, Any], rl: dict[str, Any]) -> dict[str, Any]:
    """RL against the warm start on one eval: paired gain (points), its SE, the relative cut
    in tool calls per solved task, and the same per tier."""
    pd = paired_difference(warm["task_accuracy"], rl["task_accuracy"])
    cut = 1 - rl["tool_calls_solved"] / warm["tool_calls_solved"]
    per_tier = {}
    for k, w in warm["per_tier"].items():
        r = rl["per_tier"].get(k, {})
        per_tier[k] = {
            "warmstart_accuracy": w["accuracy"],
            "rl_accuracy": r.get("accuracy", math.nan),
            "gain_points": 100 * (r.get("accuracy", math.nan) - w["accuracy"]),
            "warmstart_tool_calls_solved": w["tool_calls_solved"],
            "rl_tool_calls_solved": r.get("tool_calls_solved", math.nan),
            "tool_calls_solved_cut_frac": 1
            - r.get("tool_calls_solved", math.nan) / w["tool_calls_solved"],
            "warmstart_tool_calls_solved_hist": w.get("tool_calls_solved_hist", {}),
            "rl_tool_calls_solved_hist": r.get("tool_calls_solved_hist", {}),
            "warmstart_repeat_share_solved": w.get("repeat_share_solved", math.nan),
            "rl_repeat_share_solved": r.get("repeat_share_solved", math.nan),
            "warmstart_calls_after_answer_solved": w.get("calls_after_answer_solved"),
            "rl_calls_after_answer_solved": r.get("calls_after_answer_solved"),
            "warmstart_failure_modes": w.get("failure_modes", {}),
            "rl_failure_modes": r.get("failure_modes", {}),
            "tasks": w["tasks"],
        }
    return {
        "accuracy_gain_points": 100 * pd["diff"],
        "accuracy_gain_se": 100 * pd["se"],
        "tool_calls_solved_cut_frac": cut,
        "per_tier": per_tier,
        "tasks": pd["tasks"],
    }


def mixed_version_frac(rl_dir: Path) -> float:
    """Trained trajectories whose action tokens span ≥ 2 versions, over all trained."""
    recs = read_steps(rl_dir.parent)
    mixed = sum(int(r.get("mixed_version_trajectories", 0)) for r in recs)
    trained = sum(len(r.get("trained", [])) for r in recs)
    return mixed / trained if trained else 0.0


def _mean(values: Sequence[float | None]) -> float | None:
    """Mean of the finite values; None when there are none (strict JSON has no NaN)."""
    x = [v for v in values if v is not None and math.isfinite(v)]
    return float(np.mean(x)) if x else None


def ci95(values: Sequence[float | None]) -> list[float] | None:
    """95 % t-interval of the mean of the finite values (None for fewer than two)."""
    x = np.asarray([v for v in values if v is not None and math.isfinite(v)], dtype=float)
    if len(x) < 2:
        return None
    h = stats.t.ppf(0.975, len(x) - 1) * x.std(ddof=1) / math.sqrt(len(x))
    return [float(x.mean() - h), float(x.mean() + h)]


def _link_shared(shared: Path, dest: Path) -> None:
    dest.mkdir(parents=True, exist_ok=True)
    for stage in SHARED_STAGES:
        link = dest / stage
        if not link.exists():
            link.symlink_to((shared / stage).resolve(), target_is_directory=True)


def second_world_seed(root: Path, given: int | None) -> int:
    """The second world's generator seed, kept in ``root/world2_seed.json`` so that a resumed
    benchmark evaluates every policy on the world its earlier runs used: the kept seed, else
    ``given``, else one drawn now (and kept). A ``given`` seed that differs from the kept
    one is refused in one line."""
    path = root / "world2_seed.json"
    if path.exists():
        kept = int(json.loads(path.read_text())["world2_seed"])
        if given is not None and given != kept:
            raise ValueError(f"{path}: this benchmark's second world is seed {kept}, not {given}")
        return kept
    seed = given if given is not None else int(np.random.default_rng().integers(1_000, 1_000_000))
    path.write_text(json.dumps({"world2_seed": seed}) + "\n")
    return seed


def run_learning_benchmark(
    preset: str = "default",
    seeds: int = 3,
    out: str | os.PathLike[str] = "runs/bench-learning",
    *,
    overrides: Sequence[str] = (),
    eval_k: int = 4,
    world2_seed: int | None = None,
    shared_from: str | os.PathLike[str] | None = None,
    keep: str | os.PathLike[str] | None = None,
    progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """The benchmark of the module docstring; resumable (each run resumes in its directory).
    ``world2_seed``: the second world's generator seed (None: drawn, and recorded; a resumed
    run keeps the first run's, :func:`second_world_seed`).
    ``shared_from``: a finished run of the same preset whose world, warm start, probe and filter
    are linked in instead of built (its warm start is still evaluated here, on test).
    ``keep``: a folder where each finished piece is kept (:mod:`provrl.bench.kept`) and read
    back on a machine that lost ``out``."""
    say = progress or (lambda _m: None)
    bars = progress is not None  # a bar per subprocess where stage lines are shown
    root = Path(out).resolve()
    root.mkdir(parents=True, exist_ok=True)
    cfg = load_config(RunConfig, preset, list(overrides))
    steps = cfg.pipeline.loop.steps
    probe_episodes = cfg.pipeline.tasks.probe * cfg.pipeline.loop.k
    common = ["--preset", preset, "--no-progress", *[a for o in overrides for a in ("--set", o)]]
    common += ["--set", "pipeline.tasks.eval=0", "--set", f"pipeline.eval.k={eval_k}"]
    source = Path(shared_from).resolve() if shared_from is not None else None
    shared = root / "shared"
    if source is not None:
        _link_shared(source, shared)

    def shared_run(policies: str) -> dict[str, float]:
        return _run(
            ["run", *common, "--set", f"logging.run_dir={shared}", "--set",
             "pipeline.loop.steps=0", "--set", f"pipeline.eval.policies={policies}"],
            root / "shared.log", watch_shared(shared, probe_episodes, None) if bars else None,
            "shared",
        )  # fmt: skip

    if restore_dirs(keep, "shared-probe", shared):  # a fresh machine: no second probe
        say(f"shared: the probe and filter kept in {keep} put back")
    say("shared: world, warm start, probe, filter")
    shared_time = shared_run("[]")
    kept = Kept(keep, shared_identity(shared))
    if kept.get("shared-probe") is None:  # else: the ones put back, identity checked
        kept.put_dirs("shared-probe", shared, ("probe", "filter"))
    warm = kept.get("warmstart")
    if warm is None:
        say("shared: eval of the warm start")
        t = shared_run("[warmstart]")  # resumes: only the evaluation runs
        shared_time = {"wall_s": shared_time["wall_s"] + t["wall_s"],
                       "peak_rss_gb": max(shared_time["peak_rss_gb"], t["peak_rss_gb"])}  # fmt: skip
        warm = _eval_summary(shared / "eval" / "warmstart")
        kept.put("warmstart", warm)
    test_episodes = len(warm["task_accuracy"]) * eval_k
    w2_kept = kept.get("world2-warmstart")
    if w2_kept is not None:
        if world2_seed is not None and world2_seed != w2_kept["seed"]:
            raise ValueError(f"{kept.path('world2-warmstart')}: this benchmark's second world "
                             f"is seed {w2_kept['seed']}, not {world2_seed}")  # fmt: skip
        world2_seed = int(w2_kept["seed"])
    world2_seed = second_world_seed(root, world2_seed)
    w2 = ["--set", f"env.world.seed={world2_seed}"]
    ev2 = eval_args(shared, "test", n=0, k=eval_k, extra=w2)
    if w2_kept is None:
        say(f"second world (generator seed {world2_seed}): eval of the warm start")
        w2_warm = root / "world2-warmstart"
        _run([*ev2, "--policy", str(shared / "warmstart" / "ckpt"), "--run-dir", str(w2_warm)],
             root / "world2.log", watch_eval(w2_warm, None) if bars else None, "world 2: warm start")  # fmt: skip
        w2_kept = {"seed": world2_seed, "eval": _eval_summary(w2_warm)}
        kept.put("world2-warmstart", w2_kept)
    warm_w2 = w2_kept["eval"]
    w2_episodes = len(warm_w2["task_accuracy"]) * eval_k
    rows = []
    for s in range(seeds):
        row = kept.get(f"seed-{s}")
        if row is not None:
            say(f"seed {s}: kept in {kept.path(f'seed-{s}')}")
            rows.append(row)
            continue
        d = root / f"seed-{s}"
        _link_shared(shared, d)
        say(f"seed {s}: RL, eval")
        run = _run(
            [
                "run",
                *common,
                "--set",
                f"logging.run_dir={d}",
                "--set",
                f"pipeline.loop.seed={s}",
                "--set",
                f"rl.seed={s}",
                "--set",
                "pipeline.eval.policies=[rl]",
            ],
            root / f"seed-{s}.log",
            watch_run(d, steps, test_episodes) if bars else None,
            f"seed {s}",
        )
        rl_ckpt = json.loads((d / "rl" / "done.json").read_text())["checkpoint"]
        rl_eval = _eval_summary(d / "eval" / "rl")
        say(f"seed {s}: second world (generator seed {world2_seed})")
        w2_run = _run([*ev2, "--policy", rl_ckpt, "--run-dir", str(d / "world2-rl")], root / "world2.log",
                      watch_eval(d / "world2-rl", w2_episodes) if bars else None, f"seed {s}: world 2")  # fmt: skip
        rows.append(seed_row(d, s, warm, rl_eval, warm_w2, _eval_summary(d / "world2-rl")))
        rows[-1].update(wall_s=run["wall_s"] + w2_run["wall_s"], peak_rss_gb=run["peak_rss_gb"],
                        pools=pools_digest(shared))  # fmt: skip
        kept.put(f"seed-{s}", rows[-1])
    return aggregate(rows, preset=preset, overrides=overrides, eval_k=eval_k,
                     world2_seed=world2_seed, warm=warm) | {
        "shared": shared_time,
        "shared_from": str(source) if source is not None else None,
        "kept": kept.summary(),
    }  # fmt: skip


def seed_row(
    seed_dir: Path,
    seed: int,
    warm: dict[str, Any],
    rl_eval: dict[str, Any],
    warm_w2: dict[str, Any],
    rl_w2: dict[str, Any],
) -> dict[str, Any]:
    """One seed's row: RL against the warm start on test and on the second world (the
    summaries of :func:`_eval_summary`), and the mixed-version share of its RL stage."""
    main = compare(warm, rl_eval)
    second = compare(warm_w2, rl_w2)
    return {
        "seed": seed,
        "accuracy_gain_points": main["accuracy_gain_points"],
        "accuracy_gain_se": main["accuracy_gain_se"],
        "tool_calls_solved_cut_frac": main["tool_calls_solved_cut_frac"],
        "mixed_version_frac": mixed_version_frac(seed_dir / "rl"),
        "second_world_gain_points": second["accuracy_gain_points"],
        "second_world_gain_se": second["accuracy_gain_se"],
        "second_world_tool_calls_solved_cut_frac": second["tool_calls_solved_cut_frac"],
        "per_tier": main["per_tier"],
        "second_world_per_tier": second["per_tier"],
        "warmstart_accuracy": warm["accuracy"],
        "rl_accuracy": rl_eval["accuracy"],
        "test_tasks": main["tasks"],
        "wall_s": None,
        "peak_rss_gb": None,
        "rl_time": time_split(seed_dir / "rl"),
    }


def time_split(rl_dir: Path) -> dict[str, Any]:
    """Where the RL stage's time went (``RUN/rl/done.json``; ``{}`` before it exists): wall
    and trainer-busy seconds over every session, the trainer's idle share, and for the last
    session the engine's busy share, generated tokens per second and mean batch occupancy,
    and the torch threads of engine and trainer."""
    done = rl_dir / "done.json"
    if not done.is_file():
        return {}
    d = json.loads(done.read_text())
    col = d.get("collector", {})
    return {
        "wall_s": d.get("wall_s"),
        "trainer_busy_s": d.get("trainer_busy_s"),
        "trainer_idle_frac": d.get("trainer_idle_frac"),
        "session_wall_s": d.get("session_wall_s"),
        "engine_busy_frac": d.get("engine_busy_frac"),
        "generated_tokens_per_s": col.get("tokens_per_s"),
        "mean_batch_occupancy": col.get("mean_batch_occupancy"),
        "threads": d.get("threads", {}),
    }


def aggregate(
    rows: list[dict[str, Any]],
    *,
    preset: str,
    overrides: Sequence[str],
    eval_k: int,
    world2_seed: int | None,
    warm: dict[str, Any],
) -> dict[str, Any]:
    """The record: the rows, their means and 95 % t-intervals."""
    keys = ("accuracy_gain_points", "tool_calls_solved_cut_frac", "mixed_version_frac",
            "second_world_gain_points", "wall_s", "peak_rss_gb")  # fmt: skip
    return {
        "benchmark": "learning",
        "preset": preset,
        "overrides": list(overrides),
        "eval_k": eval_k,
        "world2_seed": world2_seed,
        "warmstart_accuracy": warm["accuracy"],
        "warmstart_tool_calls_solved": warm["tool_calls_solved"],
        "seeds": rows,
        "mean": {k: _mean([r[k] for r in rows]) for k in keys},
        "ci95": {k: ci95([r[k] for r in rows]) for k in keys},
    }


def summarize_finished(
    out: str | os.PathLike[str], preset: str, overrides: Sequence[str], eval_k: int
) -> dict[str, Any]:
    """The record of the seeds of ``out`` (a benchmark directory) that have finished every
    run, built from their files alone: for a benchmark stopped before its last seed. Wall
    times and RSS are not in the files (NaN); ``partial`` says which seeds are missing."""
    root = Path(out).resolve()
    warm = _eval_summary(root / "shared" / "eval" / "warmstart")
    warm_w2 = _eval_summary(root / "world2-warmstart")
    rows, missing = [], []
    for d in sorted(root.glob("seed-*"), key=lambda p: int(p.name.split("-")[1])):
        s = int(d.name.split("-")[1])
        done = [d / "rl" / "done.json", d / "eval" / "rl" / "trajectories.jsonl",
                d / "world2-rl" / "eval.json"]  # fmt: skip
        if all(p.exists() for p in done):
            rl_eval = _eval_summary(d / "eval" / "rl")
            rows.append(seed_row(d, s, warm, rl_eval, warm_w2, _eval_summary(d / "world2-rl")))
        else:
            missing.append(s)
    world = json.loads((root / "world2-warmstart" / "eval.json").read_text()).get("world", "")
    seed = Path(str(world)).name.removeprefix("seed").split("-")[0]
    rec = aggregate(rows, preset=preset, overrides=overrides, eval_k=eval_k,
                    world2_seed=int(seed) if seed.isdigit() else None, warm=warm)  # fmt: skip
    return rec | {"partial": {"finished_seeds": [r["seed"] for r in rows], "missing": missing}}


def eval_args(run_dir: Path, split: str, *, n: int, k: int, extra: Sequence[str] = ()) -> list[str]:
    """``provrl eval`` arguments for a policy of ``run_dir``: its pinned config (plus
    ``extra``), ``n`` tasks (0: all) × ``k`` samples of ``split``, of the preset's tiers;
    ``--policy`` and ``--run-dir`` are the caller's."""
    args = ["eval", "--config", str(run_dir / "config.yaml"), *extra, "--split", split]
    args += ["--n", str(n), "--k", str(k), "--concurrency", "32"]
    return [*args, "--set", f"env.eval.tiers={json.dumps(_tiers(run_dir))}"]


def _tiers(run_dir: Path) -> list[int]:
    """The preset's tiers, as the run's config.yaml resolved them."""
    import yaml

    cfg = yaml.safe_load((run_dir / "config.yaml").read_text())
    return [int(t) for t in cfg["pipeline"]["tasks"]["tiers"]]

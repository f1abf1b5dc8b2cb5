"""What the end-to-end RL benchmarks measure around one RL stage, without changing the loop.

:func:`run_measured` opens :class:`~provrl.pipeline.rl_loop.RLLoop` and runs it exactly as
:func:`~provrl.pipeline.rl_loop.run_rl` does (``with loop: run_sync() / run_async()``, then
``finish()``) and reads, from outside it:

* the engine's counters (``engine.stats()``: drains, cache resets, drain evictions, drain
  wait, hot-loads, busy seconds, steps, tokens) *before* the engine closes;
* the seconds of every checkpoint save and every weight load (the learner's ``save`` and
  the engine's ``load_weights``, timed by wrapping them on the instance);
* a copy of every step's weights, as hard links into ``keep_dir/v{version}`` (no bytes
  copied: the loop prunes older checkpoints, the links keep them), to evaluate afterwards;
  the optimizer state is not kept.

:func:`kept_shared_start` is :func:`shared_start` for a benchmark that keeps its finished
runs across machines. :func:`rl_from_shared` runs one measured RL stage from a copy of a shared warm start (the
benchmarks' loop body). :func:`evaluate_policy` scores one policy on the dev split (accuracy, mean reward, per task)
with the tool latency off and a fixed sampling seed, so two checkpoints are compared on
the same tasks with the same random numbers. :func:`episode_inputs` reads from a stage's
trajectory log what the simulator (:mod:`provrl.bench.simulate`) takes as its workload:
assistant tokens per turn of every episode, and the latency of every tool call.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Container, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from provrl.bench.kept import Kept, restore_dirs, settings_digest, shared_identity
from provrl.bench.time_scale import DEPLOYMENT, engine_step_s, time_scale
from provrl.config import load_config
from provrl.env.build import ensure_world
from provrl.env.tasks import Task
from provrl.pipeline.rl_loop import RLLoop
from provrl.pipeline.run import run_pipeline
from provrl.pipeline.rundir import RunDir
from provrl.pipeline.stages import rl_tasks
from provrl.pipeline.steplog import read_steps
from provrl.rollout.evaluate import evaluate
from provrl.run_config.run import RunConfig
from provrl.train.learner import OPTIMIZER_FILE
from provrl.trajlog import read_all

ENGINE_COUNTERS = (
    "hotloads",
    "drains",
    "cache_resets",
    "drain_evictions",
    "drain_wait_s",
    "evictions",
    "busy_s",
    "steps",
    "tokens_generated",
    "prefill_tokens",
    "prefix_hit_tokens",
    "replicas",
)
"""The engine counters a benchmark JSON carries (those the engine reports)."""

TOOL_NAMES = ("search", "open")
"""Tool calls that reach the search backend (and its simulated latency)."""


@dataclass
class Measured:
    """One RL stage as :func:`run_measured` saw it."""

    summary: dict[str, Any]
    """:meth:`RLLoop.finish`'s stage summary."""
    engine: dict[str, float]
    """The engine counters (:data:`ENGINE_COUNTERS`) read before the engine closed."""
    save_s: list[float] = field(default_factory=list)
    """Seconds of each checkpoint save (weights + optimizer), step by step."""
    load_s: list[float] = field(default_factory=list)
    """Seconds of each ``engine.load_weights`` call (a drain waits in it), step by step."""
    checkpoints: dict[int, Path] = field(default_factory=dict)
    """version → the kept copy of that step's weights (``keep_dir`` given)."""
    steps: list[dict[str, Any]] = field(default_factory=list)
    """The step records (``rl/steps.jsonl``)."""


@dataclass
class SharedStart:
    """The warm start, probe and filter every run of a benchmark starts from."""

    cfg: RunConfig
    """The preset with the benchmark's overrides (RL steps 0)."""
    root: Path
    """The run directory holding them (copied per run, without rl/eval/report)."""
    world: Path
    start: str
    """The warm start's checkpoint."""


def shared_start(preset: str, sets: Sequence[str], root: Path, *, reuse: bool) -> SharedStart:
    """Run warm start, probe and filter of ``preset`` + ``sets`` into ``root`` (RL with 0
    steps, no eval); ``reuse``: ``root`` is an existing run that already holds them."""
    cfg = load_config(RunConfig, preset, [*sets, "pipeline.loop.steps=0", "pipeline.eval.policies=[]"])  # fmt: skip
    if not reuse:
        run_pipeline(cfg, root, progress=False)
    world = ensure_world(cfg.env.world)
    start = json.loads((root / "warmstart" / "done.json").read_text())["checkpoint"]
    return SharedStart(cfg, root, world, str(start))


def kept_shared_start(
    preset: str,
    sets: Sequence[str],
    root: Path,
    *,
    reuse: bool,
    keep: Path | None,
    settings: Mapping[str, Any],
) -> tuple[SharedStart, Kept]:
    """:func:`shared_start`, for a benchmark whose finished runs are kept in ``keep``
    (:mod:`provrl.bench.kept`; None: nothing kept): on a machine that lost ``root``, the kept
    probe and filter are put back first (no second probe); a new probe is kept. The returned
    :class:`Kept` reads and writes the runs' pieces under the build's identity plus a digest of
    ``settings`` (every flag that changes a run), so a piece of another build or other flags is
    refused. The probe's piece carries the build's identity only: a learning benchmark's
    ``shared-probe`` of the same warm start fits."""
    if not reuse and restore_dirs(keep, "shared-probe", root):
        print(f"[bench] the probe and filter kept in {keep} put back", flush=True)
    shared = shared_start(preset, sets, root, reuse=reuse)
    identity = shared_identity(root)
    probe = Kept(keep, identity)
    if not reuse and probe.get("shared-probe") is None:
        probe.put_dirs("shared-probe", root, ("probe", "filter"))
    kept = Kept(keep, identity | {"settings": settings_digest(settings)})
    kept.read.extend(probe.read)
    return shared, kept


def fresh_copy(shared: SharedStart, d: Path) -> RunDir:
    """A run directory ``d`` holding a copy of the shared start (any older ``d`` removed)."""
    import shutil

    shutil.rmtree(d, ignore_errors=True)
    shutil.copytree(shared.root, d, ignore=shutil.ignore_patterns("rl", "eval", "report"))
    return RunDir(d)


def link_tree(src: Path, dst: Path, skip: Sequence[str] = ()) -> None:
    """Hard-link every file under ``src`` into ``dst`` (same layout), except the names in
    ``skip``; copies where the file system refuses links."""
    import shutil

    for root, _dirs, files in os.walk(src):
        out = dst / Path(root).relative_to(src)
        out.mkdir(parents=True, exist_ok=True)
        for name in files:
            if name in skip:
                continue
            try:
                os.link(Path(root) / name, out / name)
            except OSError:
                shutil.copy2(Path(root) / name, out / name)


def run_measured(
    cfg: RunConfig,
    run: RunDir,
    world_dir: Path,
    tasks: Sequence[Task],
    start_policy: str,
    *,
    keep_dir: Path | None = None,
    keep: Container[int] | None = None,
) -> Measured:
    """The RL stage of ``cfg`` in ``run`` (as :func:`~provrl.pipeline.rl_loop.run_rl`),
    measured as the module docstring says; ``keep``: the versions whose weights go to
    ``keep_dir`` (None: all). Each kept version takes the model's size on disk once the
    loop has pruned its checkpoint: delete ``keep_dir`` after evaluating it."""
    loop = RLLoop.open(cfg, run, world_dir, tasks, start_policy, progress=False)
    m = Measured(summary={}, engine={})
    save, load = loop.learner.save, loop.engine.load_weights

    def timed_save(path: str | os.PathLike[str], **meta: Any) -> None:
        t0 = time.perf_counter()
        save(path, **meta)
        m.save_s.append(time.perf_counter() - t0)
        v = int(meta["version"])
        if keep_dir is not None and (keep is None or v in keep):
            link_tree(Path(path), keep_dir / f"v{v}", skip=(OPTIMIZER_FILE,))
            m.checkpoints[v] = keep_dir / f"v{v}"

    def timed_load(*args: Any, **kwargs: Any) -> Any:
        t0 = time.perf_counter()
        out = load(*args, **kwargs)
        m.load_s.append(time.perf_counter() - t0)
        return out

    setattr(loop.learner, "save", timed_save)  # noqa: B010 - on this instance only
    setattr(loop.engine, "load_weights", timed_load)  # noqa: B010
    try:
        with loop:
            if cfg.pipeline.loop.mode == "sync":
                loop.run_sync()
            else:
                loop.run_async()
        stats = loop.engine.stats()
    except BaseException:
        loop.close()
        raise
    m.summary = loop.finish()
    m.engine = {k: float(stats[k]) for k in ENGINE_COUNTERS if k in stats}
    m.steps = read_steps(run.root)
    return m


def rl_from_shared(
    shared: SharedStart,
    preset: str,
    sets: Sequence[str],
    d: Path,
    *,
    keep_dir: Path | None = None,
    keep: Container[int] | None = None,
) -> tuple[RunConfig, Measured]:
    """One measured RL stage of ``preset`` + ``sets`` in ``d``, a fresh copy of the shared
    start, on the tasks ``provrl run`` gives the stage (:func:`~provrl.pipeline.stages.rl_tasks`:
    every probed task under the online curriculum) (:func:`run_measured`; ``keep_dir``,
    ``keep`` as there): the config it ran and what it measured."""
    run = fresh_copy(shared, d)
    cfg = load_config(RunConfig, preset, list(sets))
    pool = rl_tasks(cfg, run)
    return cfg, run_measured(
        cfg, run, shared.world, pool, shared.start, keep_dir=keep_dir, keep=keep
    )


def calibrate_time_scale(
    shared: SharedStart, preset: str, sets: Sequence[str], d: Path, kept: Kept
) -> dict[str, Any]:
    """``--time-scale auto`` (:mod:`provrl.bench.time_scale`): one RL step of ``preset`` +
    ``sets`` from the shared start in ``d``, strict on-policy, the latency undilated; N = its
    engine seconds per sampling step over the deployment's time per output token. Kept in
    ``kept`` as ``time-scale`` and read back there, so every run of a benchmark spread over
    sessions uses the same N. Returns the piece: ``value`` (N), the calibration's engine step
    time, steps and generating rows per step, and the deployment it is compared with."""
    piece = kept.get("time-scale")
    if piece is not None:
        print(f"[bench] time scale {piece['value']} kept in {kept.path('time-scale')}", flush=True)
        return dict(piece)
    run_sets = [*sets, "pipeline.loop.mode=sync", "pipeline.loop.steps=1",
                "env.search.latency.time_scale=1.0"]  # fmt: skip
    print("[bench] time scale: one strict on-policy RL step to measure the engine", flush=True)
    _cfg, m = rl_from_shared(shared, preset, run_sets, d)
    step_s = engine_step_s(m.engine)
    piece = {
        "value": time_scale(step_s),
        "engine_step_s": step_s,
        "engine_steps": m.engine["steps"],
        "rows_per_step": m.engine.get("tokens_generated", 0.0) / m.engine["steps"],
        "run": {"mode": "sync", "steps": 1, "time_scale": 1.0, "wall_s": m.summary["wall_s"]},
        "deployment": DEPLOYMENT,
    }
    kept.put("time-scale", piece)
    print(f"[bench] time scale {piece['value']} ({step_s:.3f} s per engine step here)", flush=True)
    return piece


def resolve_time_scale(
    given: float | str | None,
    shared: SharedStart,
    preset: str,
    sets: Sequence[str],
    d: Path,
    kept: Kept,
) -> tuple[float | None, dict[str, Any] | None]:
    """``--time-scale`` as the RL runs use it: ``(N, calibration)`` — ``auto`` calibrated (and
    kept) by :func:`calibrate_time_scale` in ``d``, a number (or None) as given, uncalibrated."""
    if given != "auto":
        return (float(given) if given is not None else None), None
    calibration = calibrate_time_scale(shared, preset, sets, d, kept)
    return float(calibration["value"]), calibration


def evaluate_policy(
    policy: str,
    world_dir: Path,
    cfg: RunConfig,
    out: Path,
    *,
    n: int,
    k: int,
    seed: int = 0,
) -> dict[str, Any]:
    """``policy`` on ``n`` dev tasks of the run's tiers, ``k`` samples each, tool latency off,
    sampling seed ``seed``: accuracy, mean reward, and each task's accuracy (``per_task``)."""
    ev_cfg = cfg.env.model_copy(deep=True)
    ev_cfg.search.latency.kind = "none"
    ev_cfg.eval.split, ev_cfg.eval.n, ev_cfg.eval.k, ev_cfg.eval.seed = "dev", n, k, seed
    ev_cfg.eval.tiers = tuple(cfg.pipeline.tasks.tiers)
    ev = evaluate(policy, world_dir, ev_cfg, out, progress=False, dtype=cfg.model.dtype, plot=False)
    trajs = read_all(out / "trajectories.jsonl")
    hits: dict[str, list[float]] = {}
    for t in trajs:
        hits.setdefault(t.task_id, []).append(float(t.metrics["exact_match"]))
    rewards = [float(t.reward) for t in trajs if t.reward is not None]
    return {
        "accuracy": float(ev["accuracy"]),
        "mean_reward": sum(rewards) / max(1, len(rewards)),
        "tasks": int(ev["tasks"]),
        "k": k,
        "per_task": {task: sum(v) / len(v) for task, v in hits.items()},
    }


def episode_inputs(log: Path) -> dict[str, list[Any]]:
    """From a trajectory log, per episode (aligned lists): ``turn_tokens`` (assistant tokens
    of each turn), ``waits`` (seconds of the search / open calls after each turn but the
    last: what the episode waited on tools) and ``episode_s`` (wall seconds); also
    ``tool_latency_s``, every search / open call's latency. Episodes without a sampled
    token (an engine error) are left out."""
    out: dict[str, list[Any]] = {"turn_tokens": [], "waits": [], "episode_s": [], "tool_latency_s": []}  # fmt: skip
    for t in read_all(log):
        per: dict[int, int] = {}
        for s in t.segments:
            if s.kind == "action":
                per[s.turn] = per.get(s.turn, 0) + s.end - s.start
        if not per:
            continue
        turns = sorted(per)
        wait = dict.fromkeys(turns, 0.0)
        for c in t.tool_calls:
            if c.name in TOOL_NAMES:
                out["tool_latency_s"].append(c.latency_s)
                if c.turn in wait:
                    wait[c.turn] += c.latency_s
        out["turn_tokens"].append([per[j] for j in turns])
        out["waits"].append([wait[j] for j in turns[:-1]])
        out["episode_s"].append(float(t.timings.get("total", 0.0)))
    return out

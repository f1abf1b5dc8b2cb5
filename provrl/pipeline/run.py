"""``provrl run``: the main job, stage by stage, each skipped when its output exists.

::

    world      the seeded search world (cached)                          → world_dir
    warmstart  oracle traces of a train slice → SFT (teacher data)        → warmstart/ckpt
    probe      k samples per task of a disjoint train slice               → probe/
    filter     K per task → kept (0 < K < k) / unsolved (K = 0) / solved  → filter/
    selfsft    (optional) SFT on the policy's own shortest successes       → selfsft/ckpt
    rl         sync or async GRPO with hot-load on the kept pool           → rl/ckpt-v{N}
    eval       base / warm start / RL on the test split (never trained on) → eval/{policy}/
    report     Markdown + PNG                                              → report/

Read it top to bottom: :func:`run_pipeline` is the whole job. A stage that finished wrote
``RUN/{stage}/done.json``; ``provrl run --resume RUN`` skips it and continues, and the RL stage
resumes from its last checkpoint.
"""

from __future__ import annotations

import contextlib
import json
import random
import time
from pathlib import Path
from typing import Any

import numpy as np

from provrl._sys import release_memory, writing
from provrl.config import ConfigError
from provrl.env.build import ensure_world, load_split, preflight_search
from provrl.env.jsonl import iter_records
from provrl.env.oracle import run_explorer, run_oracle
from provrl.env.tasks import Task, read_task_file
from provrl.failpoints import failpoint
from provrl.models.loading import load_tokenizer
from provrl.pipeline import stages
from provrl.pipeline.engines import engine_factory
from provrl.pipeline.pin import pin_config
from provrl.pipeline.rl_loop import run_rl
from provrl.pipeline.run_report import write_report
from provrl.pipeline.rundir import RunDir
from provrl.provenance import Trajectory
from provrl.rollout.agent import oracle_trajectory
from provrl.rollout.evaluate import select_tasks
from provrl.rollout.setup import agent_tools
from provrl.run_config.run import RunConfig
from provrl.train.sft import run_sft
from provrl.trajlog import TrajectoryWriter


def slices(train: list[Task], test: list[Task], cfg: RunConfig) -> dict[str, list[Task]]:
    """The disjoint task slices of a run: warm start and probe from train, eval from test,
    all restricted to ``pipeline.tasks.tiers``."""
    s = cfg.pipeline.tasks
    pool = [t for t in train if t.tier in s.tiers]
    rng = np.random.default_rng([s.seed, 11])
    pool = [pool[int(i)] for i in rng.permutation(len(pool))]
    if s.file is None and s.warmstart + s.probe > len(pool):
        raise ConfigError(
            f"pipeline.tasks: warmstart={s.warmstart} + probe={s.probe} exceeds the "
            f"{len(pool)} train tasks of tiers {list(s.tiers)}"
        )
    warm = pool[: s.warmstart] if cfg.pipeline.warmstart and not cfg.pipeline.warmstart_data else []
    probe = pool[s.warmstart : s.warmstart + s.probe]
    e = cfg.pipeline.eval
    held_out = [t for t in test if t.tier in s.tiers]
    if e.file is not None:  # the user's own held-out tasks, every tier
        held_out = read_task_file(e.file, split=e.split)
    if s.file is not None:
        probe = read_task_file(s.file, split="train")
        overlap = {t.question for t in probe} & {t.question for t in held_out}
        if overlap:
            where = f"pipeline.eval.file={e.file}" if e.file else "the test split"
            raise ConfigError(
                f"pipeline.tasks.file={s.file}: {len(overlap)} question(s) also in {where}, "
                f"e.g. {next(iter(overlap))!r}; RL tasks must be disjoint from the eval"
            )
    ev = select_tasks(held_out, s.eval, s.seed)
    return {"warmstart": warm, "probe": probe, "eval": ev}


def run_pipeline(cfg: RunConfig, run_dir: str | Path, *, progress: bool = True) -> dict[str, Any]:
    """Run (or resume) every stage of ``cfg`` in ``run_dir``; returns the final summary."""
    import torch

    run = RunDir(run_dir)
    run.root.mkdir(parents=True, exist_ok=True)
    pin_config(run, cfg)  # refuses an edited config.yaml or a changed key
    run.record_session()  # commit, machine and command: the report's header
    random.seed(cfg.seed)
    np.random.seed(cfg.seed)
    torch.manual_seed(cfg.seed)
    say = _say(progress)
    check_warm_start(cfg)  # before any work: a warm start that cannot produce data,
    check_eval_section(cfg)  # a provrl eval key provrl run would ignore,
    preflight_search(None, cfg.env)  # a dead retriever
    engines = engine_factory(cfg)  # the one engine factory: probe, RL and eval build through it

    # world ---------------------------------------------------------------------------------
    t0 = time.perf_counter()
    world_dir = ensure_world(cfg.env.world)
    held_out = load_split(world_dir, cfg.pipeline.eval.split)
    sl = slices(load_split(world_dir, "train"), held_out, cfg)
    if not run.done("world"):
        run.mark_done(
            "world",
            {
                "world_dir": str(world_dir),
                "wall_s": time.perf_counter() - t0,
                **{f"{k}_tasks": len(v) for k, v in sl.items()},
            },
        )
    say(f"world {world_dir}: {', '.join(f'{k} {len(v)}' for k, v in sl.items())} tasks")

    # warm start: SFT on oracle (teacher) traces -------------------------------------------
    policy = cfg.model.name
    if cfg.pipeline.warmstart:
        done = _stage(
            run, "warmstart", lambda: warm_start(cfg, run, world_dir, sl["warmstart"], progress)
        )
        policy = done["checkpoint"]
        say(f"warm start: {done['traces_selected']} teacher traces → {policy}")
    warm_policy = policy

    # probe and filter ----------------------------------------------------------------------

    probe = _stage(
        run,
        "probe",
        lambda: stages.probe(cfg, run, world_dir, sl["probe"], policy, progress, engines),
    )
    pools = _stage(run, "filter", lambda: stages.filter_pools(cfg, run))
    stages.check_fresh(cfg, run, policy, world_dir)
    say(
        f"filter: kept {pools['sizes']['kept']} of {len(sl['probe'])} (K histogram "
        f"{pools['K_histogram']})"
    )

    # optional SFT on the policy's own shortest successes -----------------------------------
    if cfg.pipeline.self_sft:
        done = _stage(run, "selfsft", lambda: stages.self_sft(cfg, run, probe, policy, progress))
        policy = done["checkpoint"]

    # RL --------------------------------------------------------------------------------------

    pool = stages.rl_tasks(cfg, run)  # the curriculum's: every probed task; else the named pools
    rl = _stage(
        run,
        "rl",
        lambda: run_rl(cfg, run, world_dir, pool, policy, progress=progress, engines=engines),
    )
    say(f"rl: {rl['steps']} steps ({rl['mode']}), final version {rl['final_version']}")

    # held-out evaluation ---------------------------------------------------------------------
    policies = {"base": cfg.model.name, "warmstart": warm_policy, "rl": rl["checkpoint"]}
    if cfg.pipeline.self_sft:
        policies["selfsft"] = policy
    results = run.done("eval") or {}
    t_eval = time.perf_counter()
    for name in cfg.pipeline.eval.policies:
        if name in results or name not in policies:
            continue
        if name == "warmstart" and not cfg.pipeline.warmstart:
            continue
        release_memory()
        with writing(run.root / "eval" / name):
            results[name] = stages.evaluate_policy(
                cfg, run, world_dir, name, policies[name], sl["eval"], progress, engines
            )
        say(
            f"eval {name}: accuracy {results[name]['accuracy']:.3f}, tool calls/solved "
            f"{results[name]['mean_tool_calls_solved']:.2f}"
        )
    results.setdefault("stage_wall_s", 0.0)
    results["stage_wall_s"] += time.perf_counter() - t_eval
    run.mark_done("eval", results)

    # report ------------------------------------------------------------------------------------

    with writing(run.root / "report"):
        report = write_report(run.root)
        run.mark_done("report", {"path": str(report)})
    summary = {"run_dir": str(run.root), "eval": results, "rl": rl, "report": str(report)}
    return summary


def _stage(run: RunDir, name: str, fn: Any) -> dict[str, Any]:
    """The stage's summary: read back if it finished before (and its logs are whole:
    :meth:`RunDir.check_finished_logs`), else computed (timed) and marked done. A write of the stage that fails for want of space or permission is one line naming
    the file (or at least the stage's directory)."""
    done = run.done(name)
    if done is not None and not run.check_finished_logs(name):  # a torn log: redone
        return done
    t0 = time.perf_counter()
    with writing(run.root / name):
        out: dict[str, Any] = fn()
        # a stage that resumes across processes (RL) reports its own total; else this call's
        out.setdefault("stage_wall_s", time.perf_counter() - t0)
        release_memory()
        run.mark_done(name, out)
    failpoint(f"{name}.done")  # crash tests: the stage's marker written, the next not begun
    return out


def check_warm_start(cfg: RunConfig) -> None:
    """Refuse, with one line and before any work, a warm start that cannot produce data: a
    ``pipeline.warmstart_data`` file that is missing, or the world's teacher on a user's own
    index (it solves the world's tasks on the world's index only)."""
    p, s = cfg.pipeline, cfg.env.search
    if not p.warmstart:
        return
    for f in p.warmstart_data:
        if not Path(f).exists():
            raise ConfigError(f"pipeline.warmstart_data: {f}: no such file or directory")
    if not p.warmstart_data and s.index:
        raise ConfigError(
            f"pipeline.warmstart: the {p.teacher} teacher solves the built-in world's tasks on "
            f"the world's index, not on env.search.index={s.index}; give your own warm-start "
            "data (--set pipeline.warmstart_data=[chat.jsonl]: chat JSONL or trajectory logs) "
            "or --set pipeline.warmstart=false"
        )


EVAL_KEYS = {
    "split": "pipeline.eval.split",
    "k": "pipeline.eval.k",
    "concurrency": "pipeline.eval.concurrency",
    "n": "pipeline.tasks.eval",
    "tiers": "pipeline.tasks.tiers",
    "seed": "pipeline.tasks.seed",
}
"""``env.eval`` (the ``provrl eval`` command's section) → what ``provrl run`` reads instead."""


def check_eval_section(cfg: RunConfig) -> None:
    """Refuse, with one line, an ``env.eval`` key changed for ``provrl run``: that section is the
    ``provrl eval`` command's, and the run's eval stage reads ``pipeline.eval`` and
    ``pipeline.tasks`` (:data:`EVAL_KEYS`), so the key would be silently ignored."""
    ev, default = cfg.env.eval, type(cfg.env.eval)()
    given = [name for name in EVAL_KEYS if getattr(ev, name) != getattr(default, name)]
    if given:  # compared with the defaults: a resumed run's config.yaml holds every key
        name = given[0]
        raise ConfigError(
            f"env.eval.{name}: provrl eval's setting, ignored by provrl run, whose eval stage "
            f"reads {EVAL_KEYS[name]} (set that instead)"
        )


def warmstart_files(paths: tuple[str, ...]) -> tuple[list[Path], list[Path]]:
    """``pipeline.warmstart_data`` split into (trajectory logs, chat JSONL files): a file whose
    first record has ``messages`` is chat, anything else (a log, a run directory) traces."""
    traces: list[Path] = []
    chats: list[Path] = []
    for raw in paths:
        f, first = Path(raw), None
        if f.is_file():
            with contextlib.closing(iter_records(f, ConfigError, "warm-start file")) as records:
                first = next(records, (0, None))[1]
        (chats if isinstance(first, dict) and "messages" in first else traces).append(f)
    return traces, chats


def warm_start(
    cfg: RunConfig, run: RunDir, world_dir: Path, tasks: list[Task], progress: bool
) -> dict[str, Any]:
    """Oracle traces of ``tasks`` (teacher data, labelled as such) → SFT of the base model;
    with ``pipeline.warmstart_data``, SFT on the user's files instead."""
    d = run.stage("warmstart")
    if cfg.pipeline.warmstart_data:
        logs, chats = warmstart_files(cfg.pipeline.warmstart_data)
        summary = run_sft(
            logs, cfg.model.name, d / "ckpt", cfg.sft, run_dir=d, dtype=cfg.model.dtype, data=chats
        )
        summary["source"] = "user data (" + ", ".join(cfg.pipeline.warmstart_data) + ")"
        summary["tasks"] = 0
        return summary
    teacher = cfg.pipeline.teacher
    traces = teacher_traces(cfg, world_dir, tasks)
    (d / "teacher.jsonl").unlink(missing_ok=True)  # a rerun after a kill rewrites it whole
    with TrajectoryWriter(d / "teacher.jsonl") as w:
        w.write_many(traces)
    summary = run_sft(traces, cfg.model.name, d / "ckpt", cfg.sft, run_dir=d, dtype=cfg.model.dtype)
    summary["source"] = f"teacher ({teacher})"
    summary["teacher_calls"] = teacher_call_stats(traces)
    summary["tasks"] = len(tasks)
    return summary


def teacher_traces(cfg: RunConfig, world_dir: Path, tasks: list[Task]) -> list[Trajectory]:
    """The ``pipeline.teacher``'s solved traces of ``tasks``, labelled as teacher data. The
    explorer spends at most ``env.explorer.max_calls`` calls (its own budget; by default the
    student's ``env.agent.max_tool_calls``)."""
    a = cfg.env.agent
    tools = agent_tools(world_dir, cfg.env, shots=False)  # teacher traces have no shots
    backend = tools.backend
    tok = load_tokenizer(cfg.model.name)
    teacher, k = cfg.pipeline.teacher, cfg.env.search.k
    budget = a.max_tool_calls if cfg.env.explorer.max_calls is None else cfg.env.explorer.max_calls
    traces = []
    for t in tasks:
        for i in range(cfg.pipeline.teacher_samples if teacher == "explorer" else 1):
            if teacher == "explorer":
                r = run_explorer(t, backend, k, a.protocol, cfg=cfg.env.explorer, sample=i, max_calls=budget, reasoning=a.reasoning)  # fmt: skip
            else:
                r = run_oracle(t, backend, k, a.protocol, reasoning=a.reasoning)
            if r.solved:
                tid = f"{t.task_id}-{teacher}" + (f"-{i}" if i else "")
                tr = oracle_trajectory(t, r, tok, a, tools.identity, traj_id=tid)
                tr.meta["source"] = "teacher"
                tr.meta["teacher"] = teacher
                traces.append(tr)
    if not traces:
        where = cfg.env.search.url if cfg.env.search.backend == "http" else "the world's index"
        raise ConfigError(
            f"warm start: the {teacher} teacher solved none of {len(tasks)} train tasks on "
            f"{where}; give your own warm-start data (--set pipeline.warmstart_data=[FILE]) "
            "or --set pipeline.warmstart=false"
        )
    return traces


def teacher_call_stats(traces: list[Trajectory]) -> dict[str, Any]:
    """Tool calls per teacher trace, overall and per tier: mean, the minimal plan's mean
    (``min_searches``), their ratio, and the histogram of calls."""

    def stats(ts: list[Trajectory]) -> dict[str, Any]:
        calls = np.array([t.metrics["num_tool_calls"] for t in ts])
        minimal = np.array([t.metrics["min_searches"] for t in ts])
        hist = np.bincount(calls.astype(int))
        return {
            "traces": len(ts),
            "calls_mean": float(calls.mean()),
            "calls_min_plan_mean": float(minimal.mean()),
            "calls_over_min_plan": float(calls.mean() / minimal.mean()),
            "calls_histogram": {str(i): int(n) for i, n in enumerate(hist) if n},
        }

    if not traces:
        return {}
    tiers = sorted({int(t.metrics["tier"]) for t in traces})
    by_tier = {str(k): stats([t for t in traces if int(t.metrics["tier"]) == k]) for k in tiers}
    return {**stats(traces), "per_tier": by_tier}


def _say(enabled: bool) -> Any:
    from rich.console import Console

    console = Console()

    def say(msg: str) -> None:
        if enabled:
            console.print(f"[bold green]✓[/] {msg}")

    return say


def load_summary(run_dir: str | Path) -> dict[str, Any]:
    """Every stage's ``done.json`` of a run, by stage name."""
    run = RunDir(run_dir)
    out = {}
    for p in sorted(run.root.glob("*/done.json")):
        out[p.parent.name] = json.loads(p.read_text())
    return out

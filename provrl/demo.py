"""`make demo` / `provrl demo`: the main job on the embedded defaults, end to end on a CPU.

1. **World** — the seeded BrowseComp-style world (fictional entities, 5,000 documents,
   SQLite FTS5 BM25), built once and cached.
2. **Oracle check** — the scripted oracle solves test tasks with the minimal searches
   (proof that the tasks are solvable with the shipped search backend).
3. **Asynchronous rollouts with a hot-load** — SmolLM2-135M-Instruct with one worked
   example in the prompt rolls out ``k`` samples per single-hop dev task, ``concurrency``
   agent loops at once on one rollout engine (continuous batching; tool outputs appended
   on the same KV cache). As soon as ``train_groups`` groups have finished, the RL trainer
   takes one GRPO step on them *in a background thread* while the actor keeps starting
   episodes; when the step is done the engine hot-loads the new weights as version 1 in
   ``keep`` mode, between two decode steps, without dropping a request. Episodes in flight
   at that moment continue under version 1 on their old KV: their trajectories mix
   versions, and every action token says which version sampled it and with what
   probability. The actor then stops starting episodes and drains.
4. **Report** — accuracy, tool calls and tokens per task, the version mix, the share of
   tokens attending to older KV, the exact log w(τ) = Σ log π_v1 − log q_{v_t} of the mixed
   trajectories, and one mixed trajectory printed token by token. Everything is written to
   ``logging.run_dir`` (trajectories, metrics, TensorBoard, summary.json).

This is a miniature of the asynchronous pipeline: one actor, one trainer step, one swap.
"""

from __future__ import annotations

import itertools
import json
import time
from collections import Counter, defaultdict
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from pathlib import Path
from typing import Any

import numpy as np

from provrl.run_config import RunConfig


def run_demo(cfg: RunConfig) -> dict[str, Any]:
    import torch
    from rich.console import Console
    from rich.table import Table
    from tqdm import tqdm

    from provrl.engine import LocalEngine
    from provrl.env.agent import AgentEnv, run_episode, tools_identity
    from provrl.env.build import ensure_world, load_split
    from provrl.env.evaluate import (
        evaluate,
        search_backend,
        select_tasks,
        summarize,
        worked_examples,
    )
    from provrl.models import load_model
    from provrl.provenance import Identity, Trajectory
    from provrl.report.metrics import MetricsWriter
    from provrl.report.show import print_trajectory, token_decoder
    from provrl.train.logprobs import token_logprobs_chunked
    from provrl.train.rl import RLTrainer, StepResult
    from provrl.trajlog import TrajectoryWriter

    d, console = cfg.demo, Console()
    run = Path(cfg.logging.run_dir)
    run.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(cfg.seed)
    t_start = time.perf_counter()

    # 1. world ------------------------------------------------------------------------
    console.rule("[bold]1. world")
    world_dir = ensure_world(cfg.env.world)
    console.print(f"world: {world_dir}")

    # 2. oracle -----------------------------------------------------------------------
    console.rule("[bold]2. oracle on test tasks")
    ocfg = cfg.env.model_copy(deep=True)
    ocfg.eval.split, ocfg.eval.n, ocfg.eval.k = "test", d.oracle_tasks, 1
    oracle = evaluate("oracle", world_dir, ocfg, run / "oracle", progress=False)
    console.print(
        f"oracle on {oracle['n']} test tasks: accuracy {oracle['accuracy']:.3f}, mean tool "
        f"calls {oracle['mean_tool_calls']:.2f} (the tasks' stated minimum "
        f"{oracle['mean_min_searches']:.2f})"
    )

    # 3. rollouts, one GRPO step in the background, hot-load --------------------------
    a = cfg.env.agent
    console.rule(
        f"[bold]3. {cfg.model.name}: {d.tasks} tier-1 dev tasks × {d.k} samples, "
        f"{a.shots}-shot, hot-load after {d.train_groups} groups"
    )
    lm = load_model(cfg.model.name, dtype=cfg.model.dtype, device=cfg.model.device)
    backend = search_backend(world_dir, cfg.env)
    tools = tools_identity(backend, cfg.env.search, a)
    dev = select_tasks([t for t in load_split(world_dir, "dev") if t.tier == 1], d.tasks, cfg.seed)
    shots = worked_examples(
        load_split(world_dir, "train"), a.shots, backend, cfg.env, {t.answer_entity for t in dev}
    )
    engine = LocalEngine(lm, cfg.engine)
    policy = Identity(lm.name, lm.fingerprint, {"dtype": cfg.model.dtype})
    env = AgentEnv(engine, lm.tokenizer, backend, a, cfg.env.search, policy, tools, shots)
    metrics = MetricsWriter(run, tensorboard=cfg.logging.tensorboard)
    trainer = RLTrainer(
        lm.model,  # the engine holds its own copy of the weights: training never touches it
        cfg.rl,
        pad_token_id=lm.tokenizer.pad_token_id,
        version=engine.version,
        metrics=metrics,
    )

    # Episodes are drawn round-robin: round r of task t is GRPO group (t, r).
    jobs = ((t, r, s) for r in itertools.count() for t in dev for s in range(d.k))
    groups: dict[tuple[str, int], list[Trajectory]] = defaultdict(list)
    rounds: dict[str, int] = {}
    trajs: list[Trajectory] = []
    hotload: dict[str, Any] = {}
    train_fut: Future[StepResult] | None = None
    started = 0
    t0 = time.perf_counter()
    with (
        TrajectoryWriter(run / "trajectories.jsonl") as writer,
        ThreadPoolExecutor(d.concurrency) as actors,
        ThreadPoolExecutor(1) as learner,
        tqdm(desc="episodes", unit="ep") as bar,
    ):
        running: dict[Future[Trajectory], tuple[str, int]] = {}

        def start_one() -> None:
            nonlocal started
            task, r, s = next(jobs)
            fut = actors.submit(
                run_episode, env, task, traj_id=f"{task.task_id}-r{r}-s{s}", seed=started
            )
            running[fut] = (task.task_id, r)
            started += 1

        while len(running) < d.concurrency:
            start_one()
        while running:
            done, _ = wait(running, timeout=0.5, return_when=FIRST_COMPLETED)
            for fut in done:
                key = running.pop(fut)
                traj = fut.result()
                writer.write(traj)
                trajs.append(traj)
                groups[key].append(traj)
                rounds[traj.traj_id] = key[1]
                bar.update(1)
            full = [g for g in groups.values() if len(g) == d.k]
            if train_fut is None and len(full) >= d.train_groups:
                batch = [t for g in full[: d.train_groups] for t in g]
                bar.write(f"GRPO step on {len(batch)} trajectories (background) …")
                train_fut = learner.submit(trainer.step, batch)
            if train_fut is not None and train_fut.done() and not hotload:
                step = train_fut.result()
                # swap while requests are mid-generation, so their next tokens are
                # sampled under the new version on KV computed by the old one
                while len(running) < d.concurrency:
                    start_one()
                while engine.stats()["active"] == 0 and not all(f.done() for f in running):
                    time.sleep(0.002)
                rep = engine.load_weights(step.state_dict, step.version, mode="keep")
                hotload = {
                    "new_version": rep.new_version,
                    "update_ms": rep.update_ms,
                    "in_flight": rep.in_flight,
                    "trained_on": int(step.metrics["num_trajectories"]),
                    "step_s": step.metrics["step_s"],
                    "reward_mean": step.metrics.get("reward_mean"),
                    "zero_signal_group_frac": step.metrics.get("zero_signal_group_frac"),
                }
                bar.write(
                    f"hot-loaded v{rep.new_version} (keep) in {rep.update_ms:.1f} ms, "
                    f"{rep.in_flight} requests in flight"
                )
            # keep the engine busy until the swap has happened, then drain
            while not hotload and len(running) < d.concurrency and started < d.max_episodes:
                start_one()
    wall = time.perf_counter() - t0
    stats = engine.stats()
    engine.close()

    # 4. report ----------------------------------------------------------------------
    console.rule("[bold]4. report")
    first_round = [t for t in trajs if rounds[t.traj_id] == 0]  # exactly k per task
    res = summarize(dev, first_round, d.k)
    acts = [t.is_action for t in trajs]
    mixed = [t for t in trajs if len(set(t.version[t.is_action].tolist())) > 1]
    stale = np.concatenate([t.kv_min[m] < t.version[m] for t, m in zip(trajs, acts, strict=True)])
    by_version = Counter(v for t in trajs for v in t.version[t.is_action].tolist())
    log_w = []  # exact log w(τ) under the new weights (version 1) for mixed trajectories
    with torch.no_grad():
        for t in mixed[:8]:
            ids = torch.from_numpy(t.token_id.astype(np.int64))[None]
            log_w.append(t.log_w(token_logprobs_chunked(lm.model, ids).logprobs[0].numpy()))
    rows = {
        "episodes (started / finished)": f"{started} / {len(trajs)}",
        "accuracy, first k samples per task (EM)": f"{res['accuracy']:.3f}",
        f"pass@{d.k}": f"{res.get(f'pass@{d.k}', float('nan')):.3f}",
        "mean tool calls / episode": f"{res['mean_tool_calls']:.2f}",
        "mean tokens / episode": f"{res['mean_tokens']:.0f}",
        "malformed calls / episode": f"{res['mean_malformed_calls']:.2f}",
        "histogram of K (successes of k)": json.dumps(res["K_histogram"]),
        "hot-load (keep): pause / in flight": (
            f"{hotload.get('update_ms', float('nan')):.1f} ms / {hotload.get('in_flight')}"
        ),
        "trajectories mixing versions": f"{len(mixed)} / {len(trajs)}",
        "action tokens by version": json.dumps(dict(sorted(by_version.items()))),
        "action tokens attending to older KV": f"{stale.mean():.1%}",
        "log w(τ) under v1 of mixed trajectories": ", ".join(f"{x:+.3f}" for x in log_w) or "-",
        "engine tokens/s (incl. trainer on same CPU)": f"{stats['tokens_generated'] / wall:.1f}",
        "wall time": f"{time.perf_counter() - t_start:.0f} s",
    }
    table = Table("metric", "value")
    for name, value in rows.items():
        table.add_row(name, value)
    console.print(table)
    if mixed:
        print_trajectory(
            console, max(mixed, key=lambda t: t.num_actions), token_decoder(lm.tokenizer)
        )
    summary = {
        "model": cfg.model.name,
        "oracle": {key: oracle[key] for key in ("n", "accuracy", "mean_tool_calls")},
        "eval": res,
        "episodes_started": started,
        "mixed_version_trajectories": len(mixed),
        "action_tokens_by_version": {str(k): v for k, v in by_version.items()},
        "stale_kv_fraction": float(stale.mean()),
        "hotload": hotload,
        "log_w_mixed": log_w,
        "engine": stats,
        "wall_s": time.perf_counter() - t_start,
    }
    (run / "summary.json").write_text(json.dumps(summary, indent=2, default=str))
    metrics.close()
    console.print(
        f"\nwritten to {run}/: trajectories.jsonl (`provrl trajectories show "
        f"{run}/trajectories.jsonl --table`), summary.json, metrics.jsonl, tb/"
    )
    return summary

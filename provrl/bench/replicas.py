"""One in-process engine vs engine replicas as Ray actors, side by side in one run.

    .venv/bin/python benchmarks/replicas.py --json                       # SmolLM2-135M
    .venv/bin/python benchmarks/replicas.py --model tiny --concurrency 16 --json

Three measurements, each printed in one JSON object:

* **throughput**: ``concurrency`` chat prompts × exactly ``new_tokens`` tokens (temperature 1,
  EOS not a stop), submitted at once: one :class:`~provrl.engine.LocalEngine` in this
  process at each of ``--threads`` torch-thread counts (default 1 and 2) vs ``--replicas``
  Ray actors with one thread each (:class:`~provrl.distributed.engine.RayEngine`, the router
  placing requests). The in-process peer is reported **at its best thread count** (highest
  median tokens/s, :func:`best_threads`) and the headline ratio is against it: the 2-thread
  engine alone is the setting other tenants' load hurts most, so comparing only with it
  flattered the replicas. The **machine's load** (1-minute load average) is read before and
  after every repeat and reported with the figures (``machine``). A third arm,
  the **ceiling** of splitting the work at all: ``--replicas`` plain OS processes, each one
  single-threaded ``LocalEngine`` with its share of the prompts, started on a barrier, no
  Ray, no router (``--no-ceiling`` skips it). Ray over plain processes is what the actor
  layer costs; plain processes over one engine is what one-thread-per-process can give on
  this CPU at all. Repeats rotate the order; headlines are medians of per-repeat ratios.
* **hot-load**: while every request is generating, a new version is published once and
  loaded with ``schedule: all`` or ``rolling`` (alternating, ``--swaps`` each, modes keep and
  drain; requests of ``--hotload-tokens`` tokens): per-replica pause (the replica's own
  ``update_ms``), the schedule's wall time, and the time every replica was paused at once
  (the replicas' own pause windows, wall clock, intersected; for drain a replica's "pause"
  is the time it admitted nothing new).
* **kill**: with every request generating, one replica is killed (``ray.kill``): turns
  resubmitted, lost (failed futures) and delivered twice (must be 0, 0), the replica's
  time to recover (death seen → new process ready at the current version), the run's wall
  time against the same run undisturbed. With ``--episodes`` also at the episode level: a
  collector over a small world, one replica killed after the first trajectory — episodes
  written, lost, written twice, aborted, turns resubmitted, requests re-prefilled.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import time
from typing import Any

from provrl.bench.engine import bench_prompts, engine_run
from provrl.distributed.config import RayConfig
from provrl.distributed.engine import RayEngine
from provrl.engine.config import EngineConfig
from provrl.engine.local import LocalEngine
from provrl.env.build import ensure_world, load_split
from provrl.env.config import EnvConfig, WorldConfig
from provrl.models.loading import load_model
from provrl.provenance import SamplingParams
from provrl.rollout.collector import Collector
from provrl.rollout.setup import build_env
from provrl.trajlog import TrajectoryWriter, read_all

EPISODE_TOKENS = 800
"""Token budget of an episode in the episode kill phase (sizes the engines' KV slots)."""


def median(xs: list[float]) -> float:
    return float(statistics.median(xs)) if xs else float("nan")


def best_threads(tokens_per_s: dict[int, list[float]]) -> int:
    """The in-process engine's best thread count: the highest median tokens/s over repeats
    (ties: fewer threads)."""
    if not tokens_per_s:
        raise ValueError("best_threads: no thread count measured")
    return max(sorted(tokens_per_s), key=lambda n: (median(tokens_per_s[n]), -n))


def load_summary(readings: list[float]) -> dict[str, float | list[float]]:
    """The 1-minute load averages read around the repeats: min, median, max and all."""
    return {"load_1m_min": min(readings), "load_1m_median": median(readings),
            "load_1m_max": max(readings), "load_1m_all": readings}  # fmt: skip


def run_batch(engine: Any, prompts: list[list[int]], new_tokens: int, seed: int) -> tuple[int, float]:  # fmt: skip
    """Submit every prompt at once; (tokens sampled, seconds until the last turn ended)."""
    outs, dt = engine_run(engine, prompts, new_tokens, seed)
    return sum(len(o.token_ids) for o in outs), dt


def median_ratio(num: list[float], den: list[float]) -> float:
    """The median of per-repeat ratios (the arms of one repeat ran back to back)."""
    return median([a / b for a, b in zip(num, den, strict=True)])


def _plain_replica(model: str, cfg: dict[str, Any], prompts: list[list[int]], new_tokens: int, conn: Any, barrier: Any) -> None:  # fmt: skip
    """One ceiling worker: a single-threaded LocalEngine in its own process. For each seed
    received: wait for the others at the barrier, run its prompts, send back (tokens,
    start, end) on the system-wide monotonic clock."""
    import torch

    torch.set_num_threads(1)

    with LocalEngine(load_model(model), EngineConfig(**cfg)) as eng:
        run_batch(eng, prompts[:4], 4, seed=0)  # warm-up
        conn.send("ready")
        while (seed := conn.recv()) is not None:
            barrier.wait()
            t0 = time.monotonic()
            n, _ = run_batch(eng, prompts, new_tokens, seed)
            conn.send((n, t0, time.monotonic()))


class PlainProcesses:
    """``n`` ceiling workers (spawned, so no torch state is forked); ``run`` returns the
    tokens/s of one batch split across them: all tokens over first start → last end."""

    def __init__(self, n: int, model: str, cfg: dict[str, Any], prompts: list[list[int]], new_tokens: int) -> None:  # fmt: skip
        import multiprocessing as mp

        ctx = mp.get_context("spawn")
        self.barrier = ctx.Barrier(n)
        self.conns, self.procs = [], []
        for i in range(n):
            mine, theirs = ctx.Pipe()
            share = prompts[i::n]
            p = ctx.Process(
                target=_plain_replica,
                args=(model, cfg, share, new_tokens, theirs, self.barrier),
                daemon=True,
            )
            p.start()
            self.conns.append(mine)
            self.procs.append(p)
        for c in self.conns:
            if c.recv() != "ready":
                raise RuntimeError("a ceiling worker failed to start")

    def run(self, seed: int) -> float:
        for i, c in enumerate(self.conns):
            c.send(seed + i)
        outs = [c.recv() for c in self.conns]
        return sum(n for n, _, _ in outs) / (
            max(e for _, _, e in outs) - min(s for _, s, _ in outs)
        )

    def close(self) -> None:
        for c in self.conns:
            c.send(None)
        for p in self.procs:
            p.join(60)


def perturbed(sd: dict[str, Any], version: int) -> dict[str, Any]:
    import torch

    g = torch.Generator().manual_seed(version)
    return {k: v + 1e-3 * v.std() * torch.randn(v.shape, generator=g) for k, v in sd.items()}


def wait_tokens(engine: Any, more_than: float, timeout: float = 600.0) -> None:
    t_end = time.perf_counter() + timeout
    while engine.stats()["tokens_generated"] <= more_than:
        if time.perf_counter() > t_end:
            raise TimeoutError("no token generated")
        time.sleep(0.01)


def load_published(client: Any, *, version: int, ref: Any, mode: str) -> Any:
    return client.load_published(version, ref, mode)


def hotload_phase(
    eng: Any, prompts: list[list[int]], new_tokens: int, sd: dict[str, Any], swaps: int
) -> dict[str, Any]:
    """Swaps under load, alternating schedules; per schedule and mode the medians."""
    from concurrent.futures import ThreadPoolExecutor

    rows: dict[str, dict[str, list[float]]] = {}
    version = eng.version
    for mode in ("keep", "drain"):
        for i in range(2 * swaps):
            schedule = ("all", "rolling")[i % 2]
            version += 1
            weights = perturbed(sd, version)
            t0 = eng.stats()["tokens_generated"]
            futs = [
                eng.submit(p, SamplingParams(temperature=1.0, max_new_tokens=new_tokens, seed=j))
                for j, p in enumerate(prompts)
            ]
            wait_tokens(eng, t0 + len(prompts))  # every replica is generating
            ref = eng.store.publish(weights, version)
            t = time.perf_counter()
            load = functools.partial(load_published, version=version, ref=ref, mode=mode)
            if schedule == "all":
                with ThreadPoolExecutor(len(eng.clients)) as ex:
                    reports = list(ex.map(load, eng.clients))
            else:
                reports = [load(c) for c in eng.clients]
            windows = [c.last_pause for c in eng.clients if c.last_pause is not None]
            wall = (time.perf_counter() - t) * 1e3
            overlap = max(0.0, min(b for _, b in windows) - max(a for a, _ in windows)) * 1e3
            in_flight = sum(r.in_flight for r in reports)
            for f in futs:
                eng.release(f.result().request_id)
            r = rows.setdefault(f"{schedule}/{mode}", {})
            for k, v in (
                ("pause_ms_per_replica", median([x.update_ms for x in reports])),
                ("pause_ms_max", max(x.update_ms for x in reports)),
                ("schedule_wall_ms", wall),
                ("all_replicas_paused_ms", overlap),
                ("in_flight", float(in_flight)),
            ):
                r.setdefault(k, []).append(v)
    return {
        key: {k: median(v) for k, v in r.items()} | {"swaps": len(r["schedule_wall_ms"])}
        for key, r in rows.items()
    }


def kill_phase(
    eng: Any, prompts: list[list[int]], new_tokens: int, victim: int = 1
) -> dict[str, Any]:
    """The same batch undisturbed and with one replica killed while it generates."""
    _, undisturbed = run_batch(eng, prompts, new_tokens, seed=7)
    s0 = eng.stats()
    t = time.perf_counter()
    futs = [
        eng.submit(p, SamplingParams(temperature=1.0, max_new_tokens=new_tokens, seed=7 + i))
        for i, p in enumerate(prompts)
    ]
    wait_tokens(eng, s0["tokens_generated"] + len(prompts))
    eng.kill_replica(victim)
    delivered, lost = [], 0
    for f in futs:
        try:
            delivered.append(f.result())
        except Exception:
            lost += 1
    wall = time.perf_counter() - t
    for o in delivered:
        eng.release(o.request_id)
    s1 = eng.stats()
    ids = [o.request_id for o in delivered]
    return {
        "requests": len(prompts),
        "on_killed_replica": sum(o.replica == victim for o in delivered),
        "turns_resubmitted": s1["turns_resubmitted"] - s0["turns_resubmitted"],
        "turns_lost": lost,
        "turns_delivered_twice": len(ids) - len(set(ids)),
        "short_turns": sum(len(o.token_ids) != new_tokens for o in delivered),
        "recover_s": s1["recover_s_last"],
        "wall_s": wall,
        "undisturbed_wall_s": undisturbed,
        "version_after": eng.versions(),
    }


def episode_kill_phase(eng: Any, lm: Any, tasks: int, k: int, concurrency: int) -> dict[str, Any]:
    """A collector's episodes on the Ray engine, one replica killed after the first."""
    import tempfile
    import threading
    from pathlib import Path

    world = ensure_world(WorldConfig(seed=7, entities=300, docs=800, tasks=240))
    env_cfg = EnvConfig()
    env_cfg.agent.max_new_tokens, env_cfg.agent.max_turns = 64, 3
    env_cfg.agent.max_total_tokens = EPISODE_TOKENS
    env = build_env(eng, lm, world, env_cfg)
    todo = load_split(world, "train")[:tasks]
    killed = threading.Event()

    def kill_once(_traj: Any) -> None:
        if not killed.is_set():
            killed.set()
            eng.kill_replica(1)

    s0 = eng.stats()
    with tempfile.TemporaryDirectory() as d:
        log = Path(d) / "traj.jsonl"
        t = time.perf_counter()
        with (
            TrajectoryWriter(log) as w,
            Collector(env, concurrency=concurrency, seed=3, writer=w, on_trajectory=kill_once) as c,
        ):
            groups = list(c.run(todo, k))
        wall = time.perf_counter() - t
        written = read_all(log)
    eng.clients[1].wait_ready(900)  # the restart may outlast the episodes
    s1 = eng.stats()
    ids = [x.traj_id for x in written]
    return {
        "episodes": tasks * k,
        "groups_complete": len(groups),
        "written": len(ids),
        "lost": tasks * k - len(set(ids)),
        "written_twice": len(ids) - len(set(ids)),
        "aborted": sum(str(x.meta.get("finish", "")).startswith("engine_") for x in written),
        "turns_resubmitted": s1["turns_resubmitted"] - s0["turns_resubmitted"],
        "requests_reprefilled": s1["requests_reprefilled"] - s0["requests_reprefilled"],
        "deaths": s1["deaths"] - s0["deaths"],
        "recover_s": s1["recover_s_last"],
        "wall_s": wall,
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2], help="torch thread counts of the in-process engine; the best is the peer")  # fmt: skip
    ap.add_argument("--replicas", type=int, default=2)
    ap.add_argument("--swaps", type=int, default=2, help="hot-loads per schedule and mode")
    ap.add_argument("--hotload-tokens", type=int, default=32, help="tokens per request in the hot-load phase")  # fmt: skip
    ap.add_argument("--episodes", type=int, default=0, help="tasks of the episode kill phase (×4 samples; 0 skips it)")  # fmt: skip
    ap.add_argument("--no-ceiling", action="store_true", help="skip the plain-process arm")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--out", default=None, help="also write a results file here")
    args = ap.parse_args(argv)
    import importlib.util

    if importlib.util.find_spec("ray") is None:  # `make bench` runs without the extra
        skipped = {"skipped": "needs ray: pip install 'provrl[ray]'"}
        print(json.dumps(skipped))
        return skipped

    # Ray's memory monitor kills workers when the *machine* is at 95 % memory — on a shared
    # machine that is other people's processes; the figures here are about our own faults
    os.environ.setdefault("RAY_memory_monitor_refresh_ms", "0")
    import torch

    say = (lambda m: None) if args.json else print
    lm = load_model(args.model)
    prompts = bench_prompts(lm.tokenizer, args.concurrency)
    ctx = max(len(p) for p in prompts) + args.new_tokens + 8
    if args.episodes:
        ctx = max(ctx, EPISODE_TOKENS + 8)
    cfg = EngineConfig(max_seqs=args.concurrency, max_context=ctx, eos_stops=False)
    locals_ = {n: LocalEngine(lm, cfg.model_copy(update={"threads": n})) for n in args.threads}
    rcfg = RayConfig(num_cpus=args.replicas, replicas=args.replicas, threads=1, schedule="rolling")
    t = time.perf_counter()
    ray_eng = RayEngine(lm, cfg, rcfg)
    start_s = time.perf_counter() - t
    say(f"ray replicas started in {start_s:.1f} s")
    for e in (*locals_.values(), ray_eng):  # warm-up
        run_batch(e, prompts[:4], 4, seed=0)

    arms: dict[str, Any] = {f"local{n}": e for n, e in locals_.items()} | {"ray": ray_eng}
    if not args.no_ceiling:
        say("ceiling: plain single-threaded processes")
        arms["plain"] = PlainProcesses(
            args.replicas,
            args.model,
            cfg.model_copy(update={"threads": 1}).model_dump(),
            prompts,
            args.new_tokens,
        )
    tps: dict[str, list[float]] = {a: [] for a in arms}
    names = list(arms)
    loads = [os.getloadavg()[0]]
    for r in range(args.repeats):
        for who in names[r % len(names) :] + names[: r % len(names)]:  # rotate the order
            e = arms[who]
            if who == "plain":
                tps[who].append(e.run(seed=1000 * r))
            else:
                n, dt = run_batch(e, prompts, args.new_tokens, seed=1000 * r)
                tps[who].append(n / dt)
            say(f"repeat {r + 1}: {who} {tps[who][-1]:.1f} tokens/s")
        loads.append(os.getloadavg()[0])
    by_threads = {n: tps[f"local{n}"] for n in args.threads}
    best = best_threads(by_threads)
    local_tps, ray_tps = by_threads[best], tps["ray"]
    ratios = [b / a for a, b in zip(local_tps, ray_tps, strict=True)]  # per repeat
    ceiling = None
    if "plain" in arms:
        arms["plain"].close()
        plain = tps["plain"]
        ceiling = {
            "processes": args.replicas,
            "threads_per_process": 1,
            "tokens_per_s": median(plain),
            "tokens_per_s_all": plain,
            "ratio_plain_vs_in_process": median_ratio(plain, local_tps),
            "ratio_ray_vs_plain": median_ratio(ray_tps, plain),
        }
    for e in locals_.values():
        e.close()

    sd = {k: v.detach().clone() for k, v in lm.model.state_dict().items()}
    say("hot-load")
    hot = hotload_phase(ray_eng, prompts, args.hotload_tokens, sd, args.swaps)
    say("kill")
    kill = kill_phase(ray_eng, prompts, args.new_tokens)
    episodes = (
        episode_kill_phase(ray_eng, lm, args.episodes, 4, min(16, args.concurrency))
        if args.episodes
        else None
    )
    stats = ray_eng.stats()
    ray_eng.close()
    result: dict[str, Any] = {
        "model": args.model,
        "concurrency": args.concurrency,
        "new_tokens": args.new_tokens,
        "hotload_tokens": args.hotload_tokens,
        "repeats": args.repeats,
        "cpus": os.cpu_count(),
        "load_average_1m": os.getloadavg()[0],
        "machine": {"cpus": os.cpu_count(), **load_summary(loads)},
        "in_process": {
            "threads": best,
            "tokens_per_s": median(local_tps),
            "by_threads": {
                str(n): {"tokens_per_s": median(v), "tokens_per_s_all": v}
                for n, v in by_threads.items()
            },
        },
        "ray": {
            "replicas": args.replicas,
            "threads_per_replica": 1,
            "tokens_per_s": median(ray_tps),
            "start_s": start_s,
        },
        "ratio_ray_vs_in_process": median(ratios),
        "ratio_all": ratios,
        "ceiling": ceiling,
        "in_process_tokens_per_s_all": local_tps,
        "ray_tokens_per_s_all": ray_tps,
        "hotload": hot,
        "published_versions": stats["published_versions"],
        "published_mb_per_version": stats["published_mb"] / max(stats["published_versions"], 1),
        "kill": kill,
        "episode_kill": episodes,
        "torch_threads_driver": torch.get_num_threads(),
    }
    if args.out is not None:
        from provrl.bench.results import run_record, write_result

        config = {k: v for k, v in vars(args).items() if k not in ("json", "out")}
        seeds = {"requests": "1000 * repeat + i", "kill": 7, "hot-load versions": "version"}
        write_result(args.out, run_record("replicas", result, config=config, seeds=seeds))
    print(json.dumps(result, indent=2, default=float))
    return result


if __name__ == "__main__":
    main()

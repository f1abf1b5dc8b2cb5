"""Predict the async / sync wall-time ratio of an RL run before renting the cluster: a
discrete-event simulation of the three roles — agent loops, engine replicas, trainer.

What it models (docs/simulate.md)::

    episode      c tool calls (uniform in tool_calls), c + 1 turns; turn j samples n_j tokens
                 (uniform in tokens_per_turn); after every turn but the last, one tool call
                 of latency L ~ env.search.latency (the Pareto-tailed model, presets fitted
                 to published web-search APIs)
    replica      continuous batching: one step samples one token for each of its b
                 generating turns and takes  d(b) = step_s + row_s · b  seconds (× contention
                 while the trainer runs on the same hardware); a turn that arrives during a
                 step joins the next one. An episode stays on the replica it started on
                 (its KV is there), the least-loaded one at its start
    trainer      a step on B trajectories takes  train_fixed_s + train_per_traj_s · B;
                 then every replica loads the new weights (load_s; at its next step
                 boundary) before the trainer takes the next batch
    sync         strict on-policy: start B episodes (≤ concurrency at once), wait for the
                 last, train, drain-load; repeat
    async        hot-load: keep up to `concurrency` episodes in flight while fewer than
                 (1 + max_lag) · B are started and not yet trained (provrl.pipeline.admission);
                 the trainer takes the first B finished episodes whenever it is free, drops
                 those whose start version lags its own by more than max_lag

Both modes train steps × B trajectories, drawn in the same order from the same seeded
streams (episode i is the same episode in both: common random numbers), and their wall time
ends when the last step's weights are loaded. Everything is deterministic given the seed.
The first step of async is a sync step (nothing overlaps it yet), so besides the whole-run
ratio the grid reports the *steady* ratio: seconds per step after the first, async over
sync — what a run of many steps approaches.
"""

from __future__ import annotations

import heapq
import itertools
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from provrl.env.config import LATENCY_PRESETS, LatencyConfig
from provrl.env.latency import draw, quantile

Mode = Literal["sync", "async"]
LatencySampler = Callable[[np.random.Generator, int], np.ndarray]
"""``(rng, n) → n`` tool-call latencies in seconds."""


@dataclass(frozen=True)
class Workload:
    """Everything :func:`simulate` needs besides the mode (module docstring's symbols)."""

    concurrency: int
    batch: int
    replicas: int
    steps: int
    tool_calls: tuple[int, int]
    tokens_per_turn: tuple[int, int]
    latency: LatencySampler
    step_s: float
    row_s: float
    train_fixed_s: float
    train_per_traj_s: float
    load_s: float
    max_lag: int = 1
    contention: float = 1.0
    seed: int = 0
    episodes: tuple[tuple[tuple[int, ...], tuple[float, ...]], ...] = ()
    """Measured episodes to replay instead of drawing them: (tokens of each turn, seconds
    waited on tools after each turn but the last). When given, episode i is one of them,
    chosen by its own stream, and tool_calls, tokens_per_turn and latency are unused."""


@dataclass
class Episode:
    i: int
    replica: int
    start_version: int
    turn_tokens: list[int]
    latencies: list[float]
    turn: int = 0


@dataclass
class Replica:
    ends: list[tuple[int, int]] = field(default_factory=list)
    """The generating turns: a heap of (the step count at which the turn's last token is
    sampled, episode). Every step samples one token of each, so a turn of n tokens that
    joins when the count is k ends at k + n."""
    joining: list[int] = field(default_factory=list)
    """Turns that arrived during a step or a swap (they join at its end)."""
    steps: int = 0
    busy: bool = False
    """Stepping or swapping."""
    swap_pending: bool = False
    """New weights wait for the current step to end."""
    swapping: bool = False
    version: int = 0
    assigned: int = 0
    busy_s: float = 0.0


@dataclass(frozen=True)
class Outcome:
    """One simulated run."""

    wall_s: float
    loaded_at: list[float]
    """When each step's weights were loaded on every replica (the last is ``wall_s``)."""
    trained: int
    engine_busy_frac: float
    trainer_busy_frac: float
    dropped_stale: int
    lag_hist: list[int]
    episode_s_mean: float


def episode_draw(w: Workload, i: int) -> tuple[list[int], list[float]]:
    """Episode ``i``'s tokens per turn and tool latencies: from its own stream ``(seed, i)``,
    so it is the same episode whichever mode and order it runs in (one of ``w.episodes``
    when those are given)."""
    rng = np.random.default_rng([w.seed, i])
    if w.episodes:
        tokens_, waits = w.episodes[int(rng.integers(len(w.episodes)))]
        return list(tokens_), list(waits)
    calls = int(rng.integers(w.tool_calls[0], w.tool_calls[1] + 1))
    lo, hi = w.tokens_per_turn
    tokens = [int(x) for x in rng.integers(lo, hi + 1, calls + 1)]
    return tokens, [float(x) for x in w.latency(rng, calls)]


def simulate(w: Workload, mode: Mode) -> Outcome:
    """Run ``w`` in ``mode`` to the load of its last step's weights (module docstring)."""
    if w.batch < 1 or w.concurrency < 1 or w.replicas < 1 or w.steps < 1:
        raise ValueError("simulate: batch, concurrency, replicas and steps must be ≥ 1")
    events: list[tuple[float, int, str, int]] = []
    seq = itertools.count()
    reps = [Replica() for _ in range(w.replicas)]
    eps: dict[int, Episode] = {}
    ready: deque[int] = deque()  # finished, not yet trained (in finishing order)
    t = 0.0
    started = in_flight = outstanding = 0
    step_started = 0  # sync: episodes started for the step in progress
    version = 0  # the trainer's
    steps_done = dropped = 0
    training = loading = False
    trainer_busy = 0.0
    lags: list[int] = []
    loaded_at: list[float] = []
    durations: list[float] = []
    start_t: dict[int, float] = {}

    def push(at: float, kind: str, who: int) -> None:
        heapq.heappush(events, (at, next(seq), kind, who))

    def begin_turn(e: Episode) -> None:
        r = reps[e.replica]
        if r.busy:
            r.joining.append(e.i)
        else:
            heapq.heappush(r.ends, (r.steps + e.turn_tokens[e.turn], e.i))

    def join(r: Replica) -> None:
        for i in r.joining:
            e = eps[i]
            heapq.heappush(r.ends, (r.steps + e.turn_tokens[e.turn], i))
        r.joining.clear()

    def may_start() -> bool:
        if in_flight >= w.concurrency:
            return False
        if mode == "sync":
            return not training and not loading and step_started < w.batch
        return outstanding < (1 + w.max_lag) * w.batch

    def admit() -> None:
        nonlocal started, in_flight, outstanding, step_started
        while may_start():
            r = min(range(w.replicas), key=lambda j: (reps[j].assigned, j))
            tokens, lat = episode_draw(w, started)
            e = Episode(started, r, reps[r].version, tokens, lat)
            eps[e.i] = e
            start_t[e.i] = t
            reps[r].assigned += 1
            started += 1
            in_flight += 1
            outstanding += 1
            step_started += 1
            begin_turn(e)

    def start_training() -> None:
        nonlocal training, trainer_busy, dropped, outstanding
        if training or loading or steps_done >= w.steps:
            return
        if mode == "sync":
            if step_started < w.batch or in_flight or len(ready) < w.batch:
                return
        else:
            stale = [i for i in ready if version - eps[i].start_version > w.max_lag]
            for i in stale:  # too stale for this step (the hard lag rule): dropped, counted
                ready.remove(i)
            dropped += len(stale)
            outstanding -= len(stale)
            if len(ready) < w.batch:
                return
        batch = [ready.popleft() for _ in range(w.batch)]
        lags.extend(version - eps[i].start_version for i in batch)
        training = True
        dt = w.train_fixed_s + w.train_per_traj_s * w.batch
        trainer_busy += dt
        push(t + dt, "trained", 0)

    def run_replicas() -> None:
        for j, r in enumerate(reps):
            if r.busy:
                continue
            if r.swap_pending:
                r.swap_pending = False
                r.busy = r.swapping = True
                push(t + w.load_s, "swapped", j)
            elif r.ends:
                r.busy = True
                d = w.step_s + w.row_s * len(r.ends)
                d *= w.contention if training else 1.0
                r.busy_s += d
                push(t + d, "step", j)

    def settle() -> None:
        admit()
        start_training()
        run_replicas()

    def handle(kind: str, who: int) -> None:
        """One event at time t."""
        nonlocal in_flight, training, loading, outstanding, version, steps_done, step_started
        if kind == "step":
            r = reps[who]
            r.busy = False
            r.steps += 1
            while r.ends and r.ends[0][0] <= r.steps:
                e = eps[heapq.heappop(r.ends)[1]]
                if e.turn < len(e.latencies):
                    push(t + e.latencies[e.turn], "tool", e.i)
                    e.turn += 1
                else:  # the answer turn: the episode is done
                    durations.append(t - start_t[e.i])
                    in_flight -= 1
                    r.assigned -= 1
                    ready.append(e.i)
            join(r)
        elif kind == "tool":
            begin_turn(eps[who])
        elif kind == "trained":
            training, loading = False, True
            for r in reps:
                r.swap_pending = True
        elif kind == "swapped":
            r = reps[who]
            r.version = version + 1
            r.busy = r.swapping = False
            join(r)
            if not any(x.swap_pending or x.swapping for x in reps):
                loading = False
                outstanding -= w.batch  # as RLLoop.finish_step: no admission during a load
                version += 1
                steps_done += 1
                step_started = 0
                loaded_at.append(t)

    settle()
    while events and steps_done < w.steps:
        t = events[0][0]
        while events and events[0][0] == t:  # simultaneous events first, then decisions
            _, _, kind, who = heapq.heappop(events)
            handle(kind, who)
        if steps_done < w.steps:
            settle()
    if steps_done < w.steps:
        raise RuntimeError(f"simulate: stalled after {steps_done} of {w.steps} steps")
    return Outcome(
        wall_s=t,
        loaded_at=loaded_at,
        trained=len(lags),
        engine_busy_frac=sum(r.busy_s for r in reps) / (w.replicas * t),
        trainer_busy_frac=trainer_busy / t,
        dropped_stale=dropped,
        lag_hist=[lags.count(k) for k in range(w.max_lag + 1)],
        episode_s_mean=float(np.mean(durations)),
    )


# ----------------------------------------------------------------------------- the grid
def latency_sampler(cfg: LatencyConfig) -> LatencySampler:
    """The tool-latency sampler of ``cfg`` (:func:`provrl.env.latency.draw`)."""
    return lambda rng, n: draw(cfg, rng, n)


def run_grid(
    *,
    concurrency: Sequence[int],
    replicas: Sequence[int],
    batch: int,
    seeds: int,
    latency: LatencyConfig,
    progress: Callable[[str], None] | None = None,
    **workload: Any,
) -> dict[str, Any]:
    """:func:`simulate` both modes at every (replicas, concurrency) point, ``seeds`` seeds
    each; ``batch`` 0 = B equals the concurrency. Per point: each mode's median wall time,
    trajectories/s, engine and trainer busy fractions (per-seed values in ``*_all``), and
    the median over seeds of the per-seed ratio ``wall_ratio_async_over_sync``; also the
    quantiles of the latency model and of every ``env.search.latency.preset``."""
    sampler = latency_sampler(latency)
    points: dict[str, dict[str, Any]] = {}
    for n in replicas:
        row: dict[str, Any] = {}
        for e in concurrency:
            b = batch or e
            per: dict[str, list[Outcome]] = {"sync": [], "async": []}
            for s in range(seeds):
                w = Workload(concurrency=e, batch=b, replicas=n, latency=sampler, seed=s,
                             **workload)  # fmt: skip
                for mode in ("sync", "async"):
                    per[mode].append(simulate(w, mode))  # type: ignore[arg-type]
            pairs = list(zip(per["async"], per["sync"], strict=True))
            ratios = [a.wall_s / s_.wall_s for a, s_ in pairs]
            many = len(pairs[0][0].loaded_at) > 1
            steady = [_steady_s(a) / _steady_s(s_) for a, s_ in pairs] if many else []
            row[f"E{e}"] = {
                "concurrency": e,
                "batch": b,
                "replicas": n,
                **{mode: _summary(outs) for mode, outs in per.items()},
                "wall_ratio_async_over_sync": float(np.median(ratios)),
                "wall_ratio_all": ratios,
                "steady_ratio_async_over_sync": float(np.median(steady)) if steady else None,
                "steady_ratio_all": steady,
            }
            if progress is not None:
                progress(f"N={n} E={e}: async/sync {np.median(ratios):.3f}")
        points[f"N{n}"] = row
    return {
        "latency": quantiles(latency) | {"kind": latency.kind},
        "presets": {
            name: quantiles(LatencyConfig(preset=name))  # type: ignore[arg-type]
            for name in LATENCY_PRESETS
        },
        "points": points,
    }


def quantiles(cfg: LatencyConfig) -> dict[str, float]:
    """p50, p95, p99 and p99.9 (as ``p999``) of the latency model ``cfg``, exactly."""
    return {f"p{q:g}".replace(".", ""): quantile(cfg, q / 100) for q in (50, 95, 99, 99.9)}


def _steady_s(o: Outcome) -> float:
    """Seconds per step after the first (the first step of async fills the pipeline)."""
    return (o.loaded_at[-1] - o.loaded_at[0]) / (len(o.loaded_at) - 1)


def _summary(outs: Sequence[Outcome]) -> dict[str, Any]:
    wall = [o.wall_s for o in outs]
    return {
        "wall_s": float(np.median(wall)),
        "wall_s_all": wall,
        "steady_step_s": float(np.median([_steady_s(o) for o in outs]))
        if len(outs[0].loaded_at) > 1
        else None,
        "trajectories_per_s": float(np.median([o.trained / o.wall_s for o in outs])),
        "engine_busy_frac": float(np.median([o.engine_busy_frac for o in outs])),
        "trainer_busy_frac": float(np.median([o.trainer_busy_frac for o in outs])),
        "episode_s_mean": float(np.median([o.episode_s_mean for o in outs])),
        "dropped_stale": sum(o.dropped_stale for o in outs),
        "lag_hist": [sum(h) for h in zip(*(o.lag_hist for o in outs), strict=True)],
    }


def plot(result: dict[str, Any], path: str) -> None:
    """The predicted curve: async / sync wall ratio against concurrency, one line per replica
    count (left), and each mode's trajectories/s (right)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4))
    for key, row in result["points"].items():
        pts = sorted(row.values(), key=lambda p: p["concurrency"])
        xs = [p["concurrency"] for p in pts]
        n = key[1:] + (" replica" if key == "N1" else " replicas")
        line = a.plot(xs, [p["wall_ratio_async_over_sync"] for p in pts], "o-",
                      label=f"{n}, whole run")  # fmt: skip
        c = line[0].get_color()
        if pts[0]["steady_ratio_async_over_sync"] is not None:
            a.plot(xs, [p["steady_ratio_async_over_sync"] for p in pts], "^:", color=c,
                   label=f"{n}, per step after the first")  # fmt: skip
        b.plot(xs, [p["async"]["trajectories_per_s"] for p in pts], "o-", color=c,
               label=f"async, {n}")  # fmt: skip
        b.plot(xs, [p["sync"]["trajectories_per_s"] for p in pts], "s--", color=c,
               label=f"sync, {n}")  # fmt: skip
    a.axhline(1.0, color="grey", lw=0.8)
    a.axhline(0.5, color="grey", lw=0.8, ls=":")
    for ax in (a, b):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("concurrent episodes")
    a.set_ylabel("wall time, async / sync")
    a.set_title("predicted async / sync wall ratio")
    b.set_yscale("log")
    b.set_ylabel("trajectories / s")
    b.set_title("predicted throughput")
    a.legend(fontsize=8, loc="upper left")
    b.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)

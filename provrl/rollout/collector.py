"""The rollout collector: a task pool in, completed GRPO groups out — the one implementation.

``provrl eval``, the probe, the sync and async RL loops and the demo all roll out through
:class:`Collector`. A *group* is the k samples of one task in one round::

    group (task, r) = { episode(task, r, s) : s = 0 … k−1 }
    traj_id         = f"{task_id}-r{r}-s{s}"
    seed            = derive_seed(seed, task_id, r, s)        (reproducible, order-free)

Episodes run as agent loops on worker threads (``concurrency`` in flight, so the engine's
continuous batching always has rows); the engine itself is shared. Each trajectory is written
to the provenance log the moment it finishes, so a killed run loses at most its in-flight
episodes, and a restarted one passes what it read back as ``done`` — those samples are not
rerun, they fill their groups.

Admission control: before *starting* an episode the collector asks ``admit()``; the async RL
loop uses it to bound staleness (an episode that could not be trained within ``max_lag``
versions is never started). Completed groups are returned by :meth:`Collector.poll` in the
order they complete.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import Any

from provrl.env.search import SearchError
from provrl.env.tasks import Task
from provrl.failpoints import failpoint
from provrl.provenance import Trajectory
from provrl.rollout.agent import (
    AgentEnv,
    derive_seed,
    run_episode,
    tool_failed,
    tool_failures,
    tool_ran,
)
from provrl.trajlog import TrajectoryWriter


def traj_id(task_id: str, round_: int, sample: int) -> str:
    """The id of sample ``sample`` of task ``task_id`` in round ``round_``."""
    return f"{task_id}-r{round_}-s{sample}"


def group_key(task_id: str, round_: int) -> str:
    """The GRPO group a trajectory belongs to (what advantages are centred over)."""
    return f"{task_id}#r{round_}"


@dataclass
class Group:
    """One task's k samples of one round."""

    task: Task
    round: int
    trajectories: list[Trajectory]  # k of them, ordered by sample index s

    @property
    def key(self) -> str:
        return group_key(self.task.task_id, self.round)

    @property
    def rewards(self) -> list[float]:
        return [float(t.reward or 0.0) for t in self.trajectories]

    @property
    def successes(self) -> int:
        """K: samples with an exact-match answer."""
        return int(sum(t.metrics.get("exact_match", 0.0) for t in self.trajectories))

    def min_version(self) -> int:
        """The oldest policy version that sampled any action token of the group."""
        vs = [int(t.version[t.is_action].min()) for t in self.trajectories if t.num_actions]
        return min(vs) if vs else 0


@dataclass
class _Pending:
    task: Task
    round: int
    k: int
    slots: list[Trajectory | None]
    to_start: deque[int]
    started_at_version: int = -1
    meta: dict[str, Any] = field(default_factory=dict)


@dataclass
class CollectorStats:
    """What the collector measured (the engine's own counters are in ``engine``)."""

    episodes: int = 0
    episodes_reused: int = 0
    episodes_refused: int = 0  # admission control said no at least once for this slot
    groups: int = 0
    wall_s: float = 0.0
    tool_calls_run: int = 0
    tool_errors: int = 0
    """Search/open calls that failed (:func:`~provrl.rollout.agent.tool_failures`)."""
    engine: dict[str, float] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        e = self.engine
        steps = e.get("steps", 0.0)
        return {
            "episodes": self.episodes,
            "episodes_reused": self.episodes_reused,
            "groups": self.groups,
            "tool_calls_run": self.tool_calls_run,
            "tool_errors": self.tool_errors,
            "tool_error_rate": self.tool_errors / self.tool_calls_run
            if self.tool_calls_run
            else 0.0,
            "replicas": int(e.get("replicas", 1.0)),  # engine replicas the episodes ran on
            "wall_s": round(self.wall_s, 3),
            "episodes_per_s": self.episodes / self.wall_s if self.wall_s else 0.0,
            "tokens_generated": e.get("tokens_generated", 0.0),
            "tokens_per_s": e.get("tokens_generated", 0.0) / self.wall_s if self.wall_s else 0.0,
            # fraction of wall time an engine thread spent computing a step (the mean over
            # replicas: busy_s is the fleet's sum)
            "engine_busy_frac": min(
                1.0, e.get("busy_s", 0.0) / e.get("replicas", 1.0) / self.wall_s
            )
            if self.wall_s
            else 0.0,
            # generated rows per engine step: how full continuous batching kept the batch
            "mean_batch_occupancy": e.get("tokens_generated", 0.0) / steps if steps else 0.0,
        }


TOOL_WINDOW = 50
"""Search/open calls the tool-error stop looks back over (``search.max_tool_error_rate``)."""
TOOL_MIN_CALLS = 20
"""Calls in the window before the tool-error stop judges (a few early failures are noise)."""


class Collector:
    """Turns tasks into completed groups on one engine (see the module docstring).

    Push groups with :meth:`submit`, pull completed ones with :meth:`poll`; or let
    :meth:`run` do both for a fixed task list (eval, probe)."""

    def __init__(
        self,
        env: AgentEnv,
        *,
        concurrency: int,
        seed: int,
        writer: TrajectoryWriter | None = None,
        progress: str | None = None,
        admit: Callable[[], bool] | None = None,
        on_trajectory: Callable[[Trajectory], None] | None = None,
    ) -> None:
        self.env, self.concurrency, self.seed = env, concurrency, seed
        self.writer, self.admit, self.on_trajectory = writer, admit, on_trajectory
        self._pool = ThreadPoolExecutor(concurrency, thread_name_prefix="agent")
        self._queue: deque[_Pending] = deque()
        self._running: dict[Future[Trajectory], tuple[_Pending, int]] = {}
        self._done: list[Group] = []
        self._lock = threading.Lock()
        self._progress_desc = progress
        self._bar: Any = None
        self._t0 = time.perf_counter()
        self._engine0 = _engine_stats(env)
        self.stats = CollectorStats()
        self._recent: deque[bool] = deque(maxlen=TOOL_WINDOW)  # recent calls: failed?

    # ------------------------------------------------------------------ push / pull
    def submit(
        self,
        task: Task,
        k: int,
        *,
        round: int = 0,
        done: Iterable[Trajectory] = (),
        meta: dict[str, Any] | None = None,
    ) -> None:
        """Queue group (task, round) of ``k`` samples; samples present in ``done`` (by
        ``traj_id``) are reused instead of rerun; ``meta`` goes into each new sample's
        metadata (the RL curriculum's start stamp)."""
        have = {t.traj_id: t for t in done}
        slots: list[Trajectory | None] = [
            have.get(traj_id(task.task_id, round, s)) for s in range(k)
        ]
        self.stats.episodes_reused += sum(x is not None for x in slots)
        todo = deque(s for s in range(k) if slots[s] is None)
        p = _Pending(task, round, k, slots, todo, meta=dict(meta or {}))
        if not todo:
            self._complete(p)
        else:
            self._queue.append(p)
        if self._bar is not None:
            self._bar.total = (self._bar.total or 0) + len(todo)
            self._bar.refresh()

    @property
    def in_flight(self) -> int:
        """Episodes running now."""
        return len(self._running)

    @property
    def queued(self) -> int:
        """Episodes submitted but not started."""
        return sum(len(p.to_start) for p in self._queue)

    @property
    def idle(self) -> bool:
        return not self._running and not self._queue

    def poll(self, timeout: float = 0.1) -> list[Group]:
        """Start episodes while there is room (and ``admit()`` allows), wait up to ``timeout``
        seconds for one to finish, and return the groups completed since the last call."""
        self._fill()
        if self._running:
            finished, _ = wait(list(self._running), timeout=timeout, return_when=FIRST_COMPLETED)
            for fut in finished:
                self._finish(fut)
            self._fill()
        elif timeout:
            time.sleep(min(timeout, 0.01))
        out, self._done = self._done, []
        return out

    def run(
        self, tasks: Sequence[Task], k: int, *, round: int = 0, done: Iterable[Trajectory] = ()
    ) -> Iterator[Group]:
        """Every task's group of ``k`` (see :meth:`submit`), yielded as each completes."""
        done = list(done)
        for t in tasks:
            self.submit(t, k, round=round, done=done)
        while True:
            yield from self.poll(timeout=0.2)
            if self.idle and not self._done:
                return

    def drain(self) -> list[Group]:
        """Stop starting new episodes; wait for the running ones; return completed groups
        (queued episodes are dropped — their groups never complete)."""
        self._queue.clear()
        while self._running:
            finished, _ = wait(list(self._running), return_when=FIRST_COMPLETED)
            for fut in finished:
                self._finish(fut)
        out, self._done = self._done, []
        return out

    def close(self) -> None:
        self._queue.clear()
        for fut in self._running:
            fut.cancel()
        self._pool.shutdown(wait=True, cancel_futures=True)
        self._update_stats()
        if self._bar is not None:
            self._bar.close()

    def __enter__(self) -> Collector:
        if self._progress_desc:
            from tqdm import tqdm

            self._bar = tqdm(total=0, desc=self._progress_desc, unit="ep", dynamic_ncols=True)
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def summary(self) -> dict[str, Any]:
        self._update_stats()
        return self.stats.as_dict()

    # ------------------------------------------------------------------ internals
    def _fill(self) -> None:
        while self._queue and len(self._running) < self.concurrency:
            if self.admit is not None and not self.admit():
                self.stats.episodes_refused += 1
                return
            p = self._queue[0]
            s = p.to_start.popleft()
            if not p.to_start:
                self._queue.popleft()
            tid = traj_id(p.task.task_id, p.round, s)
            fut = self._pool.submit(
                run_episode,
                self.env,
                p.task,
                traj_id=tid,
                seed=derive_seed(self.seed, p.task.task_id, p.round, s),
                meta={
                    "group": group_key(p.task.task_id, p.round),
                    "round": p.round,
                    "sample": s,
                    **p.meta,
                },
            )
            self._running[fut] = (p, s)

    def _finish(self, fut: Future[Trajectory]) -> None:
        p, s = self._running.pop(fut)
        traj = fut.result()  # run_episode turns tool and engine failures into trajectories
        if self.writer is not None:
            self.writer.write(traj)
            failpoint("collector.written")
        if self.on_trajectory is not None:
            self.on_trajectory(traj)
        p.slots[s] = traj
        self.stats.episodes += 1
        self._count_tool_failures(traj)
        if self._bar is not None:
            self._bar.update(1)
        if all(x is not None for x in p.slots):
            self._complete(p)

    def _count_tool_failures(self, traj: Trajectory) -> None:
        """Add ``traj``'s search/open calls to the counts, and stop (one
        :class:`~provrl.env.search.SearchError` line) when more than
        ``search.max_tool_error_rate`` of the last :data:`TOOL_WINDOW` calls failed."""
        self._recent.extend(tool_failed(c) for c in traj.tool_calls if tool_ran(c))
        tools = tool_failures([traj])
        self.stats.tool_calls_run += tools["tool_calls_run"]
        self.stats.tool_errors += tools["tool_errors"]
        limit = self.env.search.max_tool_error_rate
        failed = sum(self._recent)
        if limit < 1 and len(self._recent) >= TOOL_MIN_CALLS and failed > limit * len(self._recent):
            last = next((c.error for c in reversed(traj.tool_calls) if not c.ok), None)
            raise SearchError(
                f"{failed} of the last {len(self._recent)} search/open calls failed (more than "
                f"env.search.max_tool_error_rate={limit:g}; last: {last}): the tool is down or "
                "misconfigured, and the policy would be scored or trained on error observations"
            )

    def _complete(self, p: _Pending) -> None:
        trajs = [x for x in p.slots if x is not None]
        self._done.append(Group(p.task, p.round, trajs))
        self.stats.groups += 1

    def _update_stats(self) -> None:
        self.stats.wall_s = time.perf_counter() - self._t0
        now = _engine_stats(self.env)
        self.stats.engine = {k: now.get(k, 0.0) - self._engine0.get(k, 0.0) for k in now}
        self.stats.engine["replicas"] = now.get("replicas", 1.0)  # a gauge, not a counter


def _engine_stats(env: AgentEnv) -> dict[str, float]:
    with contextlib.suppress(Exception):
        return dict(env.engine.stats())
    return {}

"""The RL stage: GRPO (or PPO / TRPO, as ``rl`` configures the trainer) on the kept pool.

Two orchestrations of the same three roles — collector (actor), trainer (learner), engine:

**sync** (strict on-policy)::

    repeat steps times:
        roll out G groups × k samples under θ_u          (engine at version u)
        assert every action token has version u
        θ_{u+1} = trainer.step(batch)
        save checkpoint u+1; engine.load_weights(θ_{u+1}, mode="drain")   # caches reset

**async** (hot-load)::

    the collector keeps ``concurrency`` agent loops running, starting groups while
        admission allows (n < (s + 1 + L) · G, :mod:`provrl.pipeline.admission`);
    whenever the trainer is idle and G completed groups within the lag bound are ready:
        θ_{u+1} = trainer.step(batch)                    (a background thread)
    when a step finishes: save checkpoint u+1, then engine.load_weights(θ_{u+1}, mode="keep")
        — between two decode steps; in-flight requests keep their KV and continue under u+1.

Which task a group samples is the curriculum's choice (:mod:`provrl.pipeline.curriculum`):
kept tasks least visited first, a re-probe of the unsolved or solved pool every few groups,
pools moved by the evidence of every finished group. A finished group without signal (all
rewards equal) updates the evidence and is never trained on; the loop waits for G groups
that have signal. With ``train_on_probe`` the probe's own groups of kept tasks (round 0,
sampled at the first version) are the first ready groups.

Every trajectory carries per-token (version, log q, kept mass, KV versions), so the trainer's
importance weights use the probabilities the tokens were actually sampled with, whatever mix
of versions a trajectory holds.

Resume (``RUN/rl`` after a ``kill -9``): the newest complete checkpoint gives θ, the optimizer,
the version and the set of trained trajectories; the trajectory log is read back — complete
untrained groups go back to the ready queue (subject to the lag rule), incomplete ones are
finished without rerunning the samples that exist, and the curriculum is rebuilt by
replaying the probe and the log. A version is hot-loaded only after its checkpoint is complete, so no trajectory can
carry a version that a resumed run would produce again — unless that checkpoint is found
damaged on resume: then it is set aside, the previous one is used, the lost step is redone
first with the very batch it trained (its record names it; :mod:`provrl.pipeline.steplog`),
and untrained samples of the lost version are dropped, not continued. A step's record is written into its
checkpoint before ``COMPLETE`` and ``RUN/rl/steps.jsonl`` is rebuilt from it on resume
(:mod:`provrl.pipeline.steplog`), so the step records are always 1…N.

Between two durable writes of a step there is a failpoint (``PROVRL_FAILPOINT``, the crash
tests kill at each)::

    learner step ─ rl.trained ─ weights + optimizer ─ rl.ckpt.weights ─ state.json + step
    record in the checkpoint ─ rl.ckpt.state ─ COMPLETE ─ rl.ckpt.complete ─ older
    checkpoint pruned ─ rl.ckpt.pruned ─ steps.jsonl ─ rl.recorded ─ metrics row ─
    rl.saved ─ hot-load (engine.hotload inside) ─ rl.hotloaded
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

from provrl._sys import release_memory, rss_mb
from provrl.config import ConfigError
from provrl.distributed.factory import fleet_summary
from provrl.engine.api import EngineFactory, HotLoadMode
from provrl.env.tasks import Task
from provrl.failpoints import failpoint
from provrl.pipeline.admission import (
    Ema,
    RecentMedian,
    group_lag,
    groups_needed,
    may_start,
    paced_start,
    split_stale,
)
from provrl.pipeline.build import build_rl_parts
from provrl.pipeline.curriculum import Curriculum, has_signal
from provrl.pipeline.probe import probe_groups
from provrl.pipeline.rl_stats import SignalCount, batch_stats, stage_summary
from provrl.pipeline.rundir import RunDir
from provrl.pipeline.steplog import StepLog
from provrl.pipeline.steplog import read_steps as read_steps  # re-exported: its old home
from provrl.rollout.collector import Collector, Group, group_key
from provrl.run_config.run import RunConfig
from provrl.train.learner import NonFiniteGuard
from provrl.trajlog import TrajectoryWriter, read_trajectories


class RLLoop:
    """The RL stage, one named step at a time (see the module docstring)::

        loop = RLLoop(cfg, run, world_dir, tasks, start_policy)   # model, engine, learner,
                                                                  # and what RUN/rl holds
        with loop:                 # the log writer and the collector; untrained groups back
            loop.run_sync()        # or loop.run_async()
        summary = loop.finish()    # close the engine and the learner; the stage summary

    :meth:`run` (and :func:`run_rl`) is exactly that. Everything the two loops share is an
    attribute; the methods that change it — :meth:`submit_next`, :meth:`finish_step`,
    :meth:`drop_stale` — run on the loop's thread; the learner thread runs only
    :meth:`train`."""

    def __init__(
        self,
        cfg: RunConfig,
        run: RunDir,
        world_dir: Path,
        tasks: Sequence[Task],
        start_policy: str,
        *,
        progress: bool = True,
        engines: EngineFactory | None = None,
    ) -> None:
        """Load the newest checkpoint's weights (or ``start_policy``), start the engine (from
        ``engines``, the run's engine factory; default
        :func:`~provrl.pipeline.engines.engine_factory`) and the learner, and read back what
        ``RUN/rl`` already holds (:meth:`resume_from_log`)."""
        self.cfg, self.run_dir, self.start_policy = cfg, run, start_policy
        self.loop, self.rl_dir = cfg.pipeline.loop, run.stage("rl")
        if not tasks:
            raise ValueError("the RL task pool is empty (the filter kept no task)")
        self.by_id = {t.task_id: t for t in tasks}
        self.seed = cfg.seed if self.loop.seed is None else self.loop.seed
        order_seed = cfg.pipeline.tasks.seed + 1 + (0 if self.loop.seed is None else 7919 * self.seed)  # fmt: skip
        self.curriculum = Curriculum(list(tasks), cfg.pipeline.curriculum, seed=order_seed)
        self.probe_groups = probe_groups(run.root / "probe", self.by_id, self.loop.k)
        self.log = StepLog(run, start_policy)  # what RUN/rl holds: the newest intact checkpoint
        self.state = self.log.state
        parts = build_rl_parts(  # model, engine, environment, learner, metrics sink
            cfg,
            self.rl_dir,
            world_dir,
            policy=self.log.policy,
            start_policy=start_policy,
            version=self.state.version,
            seed=self.seed,
            optimizer_state=self.log.checkpoint,
            engines=engines,
        )
        self.lm, self.engine, self.env = parts.lm, parts.engine, parts.env
        self.learner, self.metrics = parts.learner, parts.metrics
        self.engine_threads, self.trainer_threads = parts.engine_threads, parts.trainer_threads
        self.log.rebuild_rows(self.metrics)
        self.guard = NonFiniteGuard(cfg.rl.nonfinite_limit, self.state.nonfinite_steps)
        self.resumed = self.resume_from_log()
        self.t_session = time.perf_counter()  # this process: the engine's counters start here
        self.t_start = self.t_session - self.state.wall_s  # the stage: accumulates across resumes
        self.ready: list[Group] = []
        """Completed groups not yet trained, oldest first."""
        self.outstanding = 0
        """Groups started (or resubmitted) and not yet trained or dropped."""
        self.groups_dropped = 0
        """Groups this session dropped as too stale (async)."""
        self.signal = SignalCount()
        """Finished groups this session, and how many (and their tokens) had no signal."""
        self.step_time, self.group_time = RecentMedian(), RecentMedian()
        self.zero_rate = Ema()
        """Paced admission's estimates: a step's wall time (train, save, load), a group's
        (start to finish) and the share of groups finishing without signal."""
        self.started_at: dict[str, float] = {}
        """perf_counter() at which each group of this session started, by group key."""
        self.t_train: float | None = None
        """When the step in progress was handed to the learner (None: learner idle)."""
        self.collector_summary: dict[str, Any] = {}
        self._stack = contextlib.ExitStack()
        self.col: Collector | None = None
        self.bar = tqdm(
            total=self.loop.steps,
            initial=self.state.steps,
            desc=f"rl ({self.loop.mode})",
            unit="step",
            dynamic_ncols=True,
            disable=not progress,
        )

    # ------------------------------------------------------------------ resume
    def resume_from_log(self) -> dict[str, int]:
        """What the trajectory log holds beyond the checkpoint (the step log reads back its
        untrained groups), the curriculum rebuilt from the probe and the log, and the counts
        the summary reports."""
        path = self.log.trajectories
        logged = list(read_trajectories(path)) if path.is_file() else []
        self.log.read_back(logged, self.probe_groups.values(), self.by_id)
        self.curriculum.replay(self.probe_groups.values(), logged, self.loop.k, self.state.version)
        return {"trajectories_in_log": len(logged), "untrained_groups": len(self.log.untrained)}

    def __enter__(self) -> RLLoop:
        """Open the log writer and the collector, and resubmit the untrained groups of the
        log (sync drops them: strict on-policy never trains what an earlier version sampled)."""
        writer = self._stack.enter_context(TrajectoryWriter(self.log.trajectories))
        self.col = self._stack.enter_context(
            Collector(self.env, concurrency=self.loop.concurrency, seed=self.seed, writer=writer)
        )
        for task_id, r, done in self.log.resumable(sync=self.loop.mode == "sync"):
            self.col.submit(self.by_id[task_id], self.loop.k, round=r, done=done)
            self.outstanding += 1
        if self.cfg.pipeline.curriculum.train_on_probe and self.loop.mode == "async":
            # the probe's untrained groups of kept tasks: ready (the lag rule drops them once stale)
            first = self.curriculum.trainable(self.probe_groups.values(), self.log.done())
            self.ready, self.outstanding = self.ready + first, self.outstanding + len(first)
        self.ready[:0] = self.log.redo  # a lost step redone first, with the batch it trained
        self.outstanding += len(self.log.redo)
        return self

    def __exit__(self, exc_type: object, *exc: object) -> None:
        try:
            if exc_type is None and self.col is not None:
                self.col.drain()
                self.collector_summary = self.col.summary()
        finally:
            self._stack.close()
            self.col = None

    @property
    def collector(self) -> Collector:
        if self.col is None:
            raise RuntimeError("RLLoop: enter the loop (with loop: ...) before running it")
        return self.col

    # ------------------------------------------------------------------ admit / submit
    def submit_next(self) -> None:
        """Start the group the curriculum picks (a kept task, or a re-probe)."""
        task, r, _ = self.curriculum.next_task()
        self.collector.submit(task, self.loop.k, round=r)
        self.started_at[group_key(task.task_id, r)] = time.perf_counter()
        self.outstanding += 1

    def may_start_now(self, training: int) -> bool:
        """``admission: paced``: whether the next step needs a group started now
        (:func:`~provrl.pipeline.admission.paced_start`); eager: always."""
        if self.loop.admission == "eager":
            return True
        G, lag = self.loop.groups_per_step, self.loop.max_lag
        elapsed = None if self.t_train is None else time.perf_counter() - self.t_train
        return paced_start(
            pending=self.outstanding - training,
            need=groups_needed(G, self.zero_rate.value or 0.0, cap=(1 + lag) * G),
            elapsed_s=elapsed,
            step_s=self.step_time.value,
            group_s=self.group_time.value,
        )

    def take(self, finished: Sequence[Group]) -> None:
        """Finished groups: their evidence into the curriculum; those with signal to the
        ready queue, the others skipped (never trained) and counted."""
        for g in finished:
            self.curriculum.observe(g)
            t0 = self.started_at.pop(g.key, None)
            if t0 is not None:
                self.group_time.update(time.perf_counter() - t0)
            signal = has_signal(g.rewards)
            self.signal.add(sum(len(t) for t in g.trajectories), signal)
            self.zero_rate.update(0.0 if signal else 1.0)
            if signal or not self.cfg.pipeline.curriculum.skip_zero_signal:
                self.ready.append(g)
            else:
                self.state.skipped.extend(t.traj_id for t in g.trajectories)
                self.outstanding -= 1
        limit = self.cfg.pipeline.curriculum.zero_signal_limit
        if self.cfg.pipeline.curriculum.skip_zero_signal and self.signal.streak >= limit:
            raise ConfigError(
                f"rl: {self.signal.streak} finished groups in a row had no signal (all rewards "
                "equal): nothing to train on — check the reward, or set "
                "pipeline.curriculum.skip_zero_signal: false"
            )

    def drop_stale(self) -> None:
        """Drop the ready groups a step on the learner's version could not train within
        ``max_lag`` (async)."""
        fresh, stale = split_stale(self.ready, self.learner.version, self.loop.max_lag)
        for g in stale:
            self.state.dropped.extend(t.traj_id for t in g.trajectories)
            self.groups_dropped += 1
            self.outstanding -= 1
        self.ready = fresh

    # ------------------------------------------------------------------ one step
    def train(self, groups: list[Group]) -> tuple[Any, dict[str, Any]]:
        """One optimizer step on ``groups`` (the async loop runs it on the learner thread):
        the update and the batch's statistics. Changes nothing the loop's thread reads."""
        stats = batch_stats(groups, self.learner.version)
        result = self.learner.step([t for g in groups for t in g.trajectories])
        return result, stats

    def finish_step(
        self, result: Any, stats: dict[str, Any], groups: list[Group], mode: HotLoadMode
    ) -> None:
        """After a step: checkpoint u+1 with the step's record, append the record to the logs,
        then hot-load u+1 (``mode``) — never the other way round, so no token is sampled
        under a version a crash could lose, and no committed step lacks its record."""
        failpoint("rl.trained")  # the update exists only in memory: a kill trains it again
        self.outstanding -= len(groups)
        if result.skipped is not None:  # not finite: nothing saved or loaded, batch untrained
            self.state.nonfinite.extend(t.traj_id for g in groups for t in g.trajectories)
            self.guard.skipped(result, self.state.steps + 1)  # raises after rl.nonfinite_limit
            return
        self.state.trainer_busy_s += float(result.metrics.get("step_s", 0.0))
        self.state.trained.extend(t.traj_id for g in groups for t in g.trajectories)
        self.state.steps += 1
        if self.cfg.pipeline.curriculum.enabled:
            self.curriculum.advance(result.version)
        stats["pools"] = self.curriculum.counts()
        stats.update(self.signal.since_last_step())
        if self.loop.admission == "paced":  # the estimates the next starts are paced by
            stats["paced_step_s"], stats["paced_group_s"] = self.step_time.value, self.group_time.value  # fmt: skip
        stats["nonfinite_skipped"] = self.guard.since_last_step()
        self.state.nonfinite_steps = self.guard.total
        record = self.step_record(result.version, dict(result.metrics), stats)
        # checkpoint u+1 with its record, then steps.jsonl: before the engine samples from it
        self.log.commit(result.version, record, self.learner, self.metrics, t_start=self.t_start, keep=self.loop.save_total_limit)  # fmt: skip
        failpoint("rl.saved")  # version u+1 saved and recorded, not yet loaded anywhere
        self.engine.load_weights(result.weights, result.version, mode=mode)
        failpoint("rl.hotloaded")
        release_memory()
        self.bar.update(1)
        self.bar.set_postfix(acc=f"{stats['accuracy']:.2f}", calls=f"{stats['tool_calls']:.2f}")

    def step_record(
        self, version: int, step_metrics: dict[str, Any], stats: dict[str, Any]
    ) -> dict[str, Any]:
        """The step's line of ``steps.jsonl``: the batch's statistics and the update's."""
        return {
            "step": self.state.steps,
            "version": version,
            **stats,
            **step_metrics,
            "wall_s": time.perf_counter() - self.t_start,
            "rss_mb": rss_mb(),
        }

    # ------------------------------------------------------------------ the two loops
    def run_sync(self) -> None:
        """Strict on-policy: roll out G groups under the learner's version, check that every
        action token has it, train, drain-load the new version; until ``steps``."""
        col, G, k = self.collector, self.loop.groups_per_step, self.loop.k
        while self.state.steps < self.loop.steps:
            while col.queued + col.in_flight < G * k and len(self.ready) < G:
                self.submit_next()
            while len(self.ready) < G:
                self.take(col.poll(0.2))
            batch, self.ready = self.ready[:G], self.ready[G:]
            for g in batch:  # strict on-policy: every token from the weights being updated
                for t in g.trajectories:
                    vs = t.version[t.is_action]
                    if len(vs) and (vs != self.learner.version).any():
                        raise AssertionError(
                            f"sync: {t.traj_id} has versions {sorted(set(vs.tolist()))}, "
                            f"trainer is at {self.learner.version}"
                        )
            result, stats = self.train(batch)
            self.finish_step(result, stats, batch, "drain")

    def run_async(self) -> None:
        """Hot-load: rollouts never stop (admission bounds staleness); whenever the learner
        is idle and G fresh groups are ready it trains them on its own thread, and each new
        version is hot-loaded into the running engine (``hotload`` mode); until ``steps``."""
        col, G, lag = self.collector, self.loop.groups_per_step, self.loop.max_lag
        background = ThreadPoolExecutor(
            1,
            thread_name_prefix="learner",
            initializer=_set_threads,
            initargs=(self.trainer_threads,),
        )
        fut: Future[tuple[Any, dict[str, Any]]] | None = None
        in_training: list[Group] = []
        try:
            while self.state.steps < self.loop.steps:
                while (
                    col.queued < self.loop.concurrency
                    and may_start(self.outstanding, G, lag)
                    and self.may_start_now(len(in_training))
                ):
                    self.submit_next()
                self.take(col.poll(0.05))
                if fut is not None and fut.done():
                    result, stats = fut.result()
                    self.finish_step(result, stats, in_training, self.loop.hotload)
                    if self.t_train is not None:  # the step's wall time: train, save, load
                        self.step_time.update(time.perf_counter() - self.t_train)
                    self.t_train = None
                    # the published weights are in the engine now: don't hold them through
                    # the next step
                    fut, in_training, result = None, [], None
                if fut is None and self.state.steps < self.loop.steps:
                    self.drop_stale()
                    if len(self.ready) >= G:
                        in_training, self.ready = self.ready[:G], self.ready[G:]
                        assert all(group_lag(g, self.learner.version) <= lag for g in in_training)
                        fut = background.submit(self.train, in_training)
                        self.t_train = time.perf_counter()
        finally:
            background.shutdown(wait=True)

    # ------------------------------------------------------------------ the end
    def run(self) -> dict[str, Any]:
        """The whole stage: the loop ``pipeline.loop.mode`` names, then :meth:`finish` (on
        an error — a full disk, say — :meth:`close`, and the error goes on)."""
        try:
            with self:
                if self.loop.mode == "sync":
                    self.run_sync()
                else:
                    self.run_async()
        except BaseException:
            self.close()
            raise
        return self.finish()

    def close(self) -> None:
        """Close the progress bar, the learner, the engine and the metrics sink."""
        self.bar.close()
        self.learner.close()
        self.engine.close()
        self.metrics.close()

    def finish(self) -> dict[str, Any]:
        """Close the learner, the engine and the metrics sink; the stage summary."""
        eng = self.engine.stats()
        fleet = fleet_summary(self.engine, eng)  # engine.backend: ray — versions per replica
        trainer_info = self.learner.info()
        self.close()
        latest = self.run_dir.latest_checkpoint()
        return stage_summary(
            mode=self.loop.mode,
            steps=self.state.steps,
            version=self.state.version,
            checkpoint=str(latest[1]) if latest else self.start_policy,
            trained=len(self.state.trained),
            dropped=self.groups_dropped + self.log.dropped_before,
            resumed=self.resumed,
            notes=self.log.resume.notes,
            wall_s=time.perf_counter() - self.t_start,
            session_s=time.perf_counter() - self.t_session,
            trainer_busy_s=self.state.trainer_busy_s,
            engine=eng,
            fleet=fleet,
            threads={"engine": self.engine_threads, "trainer": self.trainer_threads},
            trainer=trainer_info,
            collector=self.collector_summary,
            curriculum=self.curriculum.summary(),
            signal=self.signal,
            skipped=len(self.state.skipped),
            nonfinite_steps=self.guard.total,
        )


def run_rl(
    cfg: RunConfig,
    run: RunDir,
    world_dir: Path,
    tasks: Sequence[Task],
    start_policy: str,
    **opts: Any,
) -> dict[str, Any]:
    """Train ``start_policy`` with RL on ``tasks`` (see the module docstring) and return the
    stage summary: :meth:`RLLoop.run`. Resumes from ``RUN/rl`` when it holds a checkpoint or a
    log; ``opts``: ``progress``, ``engines`` (the run's engine factory)."""
    return RLLoop(cfg, run, world_dir, tasks, start_policy, **opts).run()


def _set_threads(n: int) -> None:
    """torch intra-op threads of the calling thread (0: leave the default)."""
    if n:
        torch.set_num_threads(n)

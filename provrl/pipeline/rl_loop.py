"""The RL stage: GRPO (or PPO / TRPO, as ``rl`` configures the trainer) on the kept pool.

Two orchestrations of the same three roles — collector (actor), trainer (learner), engine:

**sync** (strict on-policy)::

    repeat steps times:
        roll out G groups × k samples under θ_u          (engine at version u)
        assert every action token has version u
        θ_{u+1} = trainer.step(batch)
        commit checkpoint u+1; engine.load_weights(θ_{u+1}, mode="drain")   # caches reset

**async** (hot-load)::

    the collector keeps ``concurrency`` agent loops running, starting groups while
        admission allows (n < (s + 1 + L) · G, :mod:`provrl.pipeline.admission`);
    whenever the trainer is idle and G completed groups within the lag bound are ready:
        θ_{u+1} = trainer.step(batch)                    (a background thread)
    when a step finishes: commit checkpoint u+1, then engine.load_weights(θ_{u+1}, mode="keep")
        — between two decode steps; in-flight requests keep their KV and continue under u+1.
    with ``split_cores`` the engine and the learner hold a core each; with ``lend_cores`` the
        engine also takes the learner's while the learner waits for a batch, with
        ``borrow_cores`` the learner the engine's for a micro-batch while the engine idles.

The curriculum picks each group's task (:mod:`~provrl.pipeline.curriculum`); a group without
signal (all rewards equal) is never trained. Per-token provenance (version, log q, kept mass,
KV versions) gives the trainer exact importance weights, whatever mix of versions a
trajectory holds. The loop is handed its parts (:func:`~provrl.pipeline.build.build_rl_parts`)
and ``RUN/rl`` as the step log reads it back (:class:`~provrl.pipeline.steplog.StepLog`: the
resume, the step records); the groups between start and training are
:class:`~provrl.pipeline.admission.Admission`'s, its numbers come from
:mod:`~provrl.pipeline.rl_stats`. A version is hot-loaded only after its checkpoint is
complete, so no token carries a version a resumed run would produce again. A failpoint
(``PROVRL_FAILPOINT``) sits between every two durable writes of a step; the crash tests kill
at each (those of the commit are :class:`~provrl.pipeline.steplog.StepLog`'s)::

    learner step ─ rl.trained ─ StepLog.commit (rl.ckpt.weights … rl.recorded) ─ rl.saved ─
    hot-load (engine.hotload inside) ─ rl.hotloaded
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Sequence
from concurrent.futures import Future
from pathlib import Path
from typing import Any

from tqdm import tqdm

from provrl._sys import release_memory, rss_mb
from provrl.engine.api import EngineFactory, HotLoadMode
from provrl.env.tasks import Task
from provrl.failpoints import failpoint
from provrl.pipeline.admission import Admission, check_on_policy, group_lag
from provrl.pipeline.build import RLParts, build_rl_parts, rl_seeds
from provrl.pipeline.curriculum import Curriculum
from provrl.pipeline.rl_stats import batch_stats, stage_summary, step_record
from provrl.pipeline.rundir import RunDir
from provrl.pipeline.steplog import StepLog
from provrl.rollout.collector import Collector, Group, group_key
from provrl.run_config.run import RunConfig
from provrl.trajlog import TrajectoryWriter


class RLLoop:
    """The RL stage, one named step at a time (see the module docstring)::

        loop = RLLoop.open(cfg, run, world_dir, tasks, start_policy)   # RUN/rl read back,
                                                                       # the parts built
        with loop:                 # the log writer and the collector; untrained groups back
            loop.run_sync()        # or loop.run_async()
        summary = loop.finish()    # close the engine and the learner; the stage summary

    :meth:`run` (and :func:`run_rl`) is exactly that. Everything the two loops share is an
    attribute; the methods that change it — :meth:`submit_next`, :meth:`take`,
    :meth:`finish_step` — run on the loop's thread; the learner thread runs only
    :meth:`train`."""

    def __init__(self, cfg: RunConfig, tasks: Sequence[Task], parts: RLParts, log: StepLog, *, progress: bool = True) -> None:  # fmt: skip
        """The loop on ``parts`` and the read-back ``log``: the curriculum rebuilt from the
        probe and the trajectory log, the log's untrained groups and lost batches found."""
        self.cfg, self.loop, self.log, self.state = cfg, cfg.pipeline.loop, log, log.state
        self.parts, self.engine, self.learner, self.metrics = parts, parts.engine, parts.learner, parts.metrics  # fmt: skip
        self.by_id = {t.task_id: t for t in tasks}
        self.seed, order_seed = rl_seeds(cfg)
        self.probe_groups, logged = log.restore(self.by_id, self.loop.k, self.metrics)
        self.curriculum = Curriculum.restored(tasks, cfg.pipeline.curriculum, order_seed, self.probe_groups.values(), logged, self.loop.k, self.state.version)  # fmt: skip
        self.guard, self.signal = log.counters(cfg.rl.nonfinite_limit)
        """Non-finite steps skipped; finished groups, and how many had no signal (durable)."""
        self.t_session = time.perf_counter()  # this process: the engine's counters start here
        self.t_start = self.t_session - self.state.wall_s  # the stage: accumulates across resumes
        self.admit = Admission(self.loop.groups_per_step, self.loop.max_lag, paced=self.loop.admission == "paced", straddle=self.loop.straddle)  # fmt: skip
        """The groups started and not yet trained or dropped; the ready queue."""
        self.collector_summary: dict[str, Any] = {}
        self._stack = contextlib.ExitStack()
        self.col: Collector | None = None
        self.bar = tqdm(total=self.loop.steps, initial=self.state.steps, desc=f"rl ({self.loop.mode})", unit="step", dynamic_ncols=True, disable=not progress)  # fmt: skip

    @classmethod
    def open(cls, cfg: RunConfig, run: RunDir, world_dir: Path, tasks: Sequence[Task], start_policy: str, *, progress: bool = True, engines: EngineFactory | None = None) -> RLLoop:  # fmt: skip
        """Read back ``RUN/rl`` (:class:`~provrl.pipeline.steplog.StepLog`), build the parts
        on its newest intact checkpoint or ``start_policy`` (:func:`build_rl_parts`, engines
        from ``engines``, the run's engine factory), and the loop on them."""
        if not tasks:
            raise ValueError("the RL task pool is empty (the filter kept no task)")
        log = StepLog(run, start_policy)  # the newest intact checkpoint, steps.jsonl restored
        parts = build_rl_parts(cfg, log.rl_dir, world_dir, policy=log.policy, start_policy=start_policy, version=log.state.version, seed=rl_seeds(cfg)[0], optimizer_state=log.checkpoint, engines=engines)  # fmt: skip
        try:
            return cls(cfg, tasks, parts, log, progress=progress)
        except BaseException:
            parts.close()
            raise

    def __enter__(self) -> RLLoop:
        """Open the log writer and the collector; resubmit the log's untrained groups (sync
        drops them: strict on-policy never trains what an earlier version sampled), then the
        probe's (async ``train_on_probe``), and a lost step's batch first of all."""
        writer = self._stack.enter_context(TrajectoryWriter(self.log.trajectories))
        self.col = self._stack.enter_context(Collector(self.parts.env, concurrency=self.loop.concurrency, seed=self.seed, writer=writer))  # fmt: skip
        for task_id, r, done in self.log.resumable(sync=self.loop.mode == "sync"):
            self.col.submit(self.by_id[task_id], self.loop.k, round=r, done=done)
            self.admit.started(None)
        self.admit.queue(self.log.redo)  # a lost step redone first, with the batch it trained
        for g in self.log.redo:  # counted as the lost step counted them (unless an earlier did)
            self.signal.add_group(g)
        if self.cfg.pipeline.curriculum.train_on_probe and self.loop.mode == "async":
            self.admit.queue(self.curriculum.trainable(self.probe_groups.values(), self.log.done()))  # fmt: skip
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

    # ------------------------------------------------------------------ groups in and out
    def submit_next(self) -> None:
        """Start the group the curriculum picks (a kept task, or a re-probe)."""
        task, r, _ = self.curriculum.next_task()
        self.collector.submit(task, self.loop.k, round=r, meta=self.curriculum.stamp(task.task_id, r))  # fmt: skip
        self.admit.started(group_key(task.task_id, r))

    def admit_groups(self, in_training: int) -> None:
        """Start groups while the engine has room and admission wants them."""
        while self.collector.queued < self.loop.concurrency and self.admit.may_start(in_training):
            self.submit_next()

    def take(self, finished: Sequence[Group]) -> None:
        """Finished groups: their evidence into the curriculum; those with signal to the
        ready queue, the others skipped (never trained) and counted."""
        skip_zero = self.cfg.pipeline.curriculum.skip_zero_signal
        for g in finished:
            self.curriculum.observe(g)
            signal = self.signal.add_group(g)
            keep = signal or not skip_zero
            self.admit.finished(g, signal, keep=keep)
            if not keep:
                self.state.skipped.extend(t.traj_id for t in g.trajectories)
        if skip_zero:
            self.signal.check(self.cfg.pipeline.curriculum.zero_signal_limit)

    # ------------------------------------------------------------------ one step
    def train(self, groups: list[Group]) -> tuple[Any, dict[str, Any]]:
        """One optimizer step on ``groups`` (the async loop runs it on the learner thread):
        the update and the batch's statistics. Changes nothing the loop's thread reads."""
        stats = batch_stats(groups, self.learner.version)
        return self.learner.step([t for g in groups for t in g.trajectories]), stats

    def finish_step(
        self, result: Any, stats: dict[str, Any], groups: list[Group], mode: HotLoadMode
    ) -> None:
        """After a step: commit checkpoint u+1 with the step's record (the step log), then
        hot-load u+1 (``mode``) — never the other way round, so no token is sampled under a
        version a crash could lose, and no committed step lacks its record."""
        failpoint("rl.trained")  # the update exists only in memory: a kill trains it again
        self.admit.settled(len(groups))
        trajs = [t.traj_id for g in groups for t in g.trajectories]
        if result.skipped is not None:  # not finite: nothing saved or loaded, batch untrained
            self.state.nonfinite.extend(trajs)
            self.guard.skipped(result, self.state.steps + 1)  # raises after rl.nonfinite_limit
            return
        self.state.trainer_busy_s += float(result.metrics.get("step_s", 0.0))
        self.state.trained.extend(trajs)
        self.state.steps += 1
        if self.cfg.pipeline.curriculum.enabled:
            self.curriculum.advance(result.version)
        stats["pools"] = self.curriculum.counts()
        stats.update(self.signal.since_last_step())
        stats.update(self.admit.pacer.estimates())  # paced admission: what the next starts use
        stats["nonfinite_skipped"] = self.guard.since_last_step()
        self.state.nonfinite_steps, self.state.signal = self.guard.total, self.signal.durable()
        wall = time.perf_counter() - self.t_start
        record = step_record(self.state.steps, result.version, stats, dict(result.metrics), wall_s=wall, rss_mb=rss_mb())  # fmt: skip
        self.log.commit(result.version, record, self.learner, self.metrics, t_start=self.t_start, keep=self.loop.save_total_limit, keep_versions=self.loop.keep_versions)  # fmt: skip
        failpoint("rl.saved")  # version u+1 saved and recorded, not yet loaded anywhere
        self.engine.load_weights(result.weights, result.version, mode=mode)
        failpoint("rl.hotloaded")
        release_memory()
        self.bar.update(1)
        self.bar.set_postfix(acc=f"{stats['accuracy']:.2f}", calls=f"{stats['tool_calls']:.2f}")

    # ------------------------------------------------------------------ the two loops
    def run_sync(self) -> None:
        """Strict on-policy: roll out G groups under the learner's version, check that every
        action token has it, train, drain-load the new version; until ``steps``."""
        col, G, k = self.collector, self.loop.groups_per_step, self.loop.k
        while self.state.steps < self.loop.steps:
            while col.queued + col.in_flight < G * k and len(self.admit.ready) < G:
                self.submit_next()
            while (batch := self.admit.batch()) is None:
                self.take(col.poll(0.2))
            check_on_policy(batch, self.learner.version)
            result, stats = self.train(batch)
            self.finish_step(result, stats, batch, "drain")

    def run_async(self) -> None:
        """Hot-load: rollouts never stop (admission bounds staleness); whenever the learner
        is idle and G fresh groups are ready it trains them on its own thread, and each new
        version is hot-loaded into the running engine (``hotload`` mode); until ``steps``."""
        col, lag, background = self.collector, self.loop.max_lag, self.parts.learner_thread()
        fut: Future[tuple[Any, dict[str, Any]]] | None = None
        in_training: list[Group] = []
        self.parts.lend_cores(learner_busy=False)  # lend_cores: the learner waits for a batch
        try:
            while self.state.steps < self.loop.steps:
                self.admit_groups(len(in_training))
                self.take(col.poll(0.05))
                if fut is not None and fut.done():
                    self.parts.lend_cores(learner_busy=False)
                    result, stats = fut.result()
                    self.admit.pacer.train_done()  # groups due in the save and load start now
                    self.admit_groups(len(in_training))
                    self.finish_step(result, stats, in_training, self.loop.hotload)
                    self.admit.pacer.trained(result.metrics.get("step_s"))  # train, save, load
                    # the published weights are in the engine now: don't hold them through
                    # the next step
                    fut, in_training, result = None, [], None
                if fut is None and self.state.steps < self.loop.steps:
                    self.log.drop(self.admit.drop_stale(self.learner.version))  # too stale
                    if (batch := self.admit.batch()) is not None:
                        assert all(group_lag(g, self.learner.version) <= lag for g in batch)
                        self.parts.lend_cores(learner_busy=True)
                        fut, in_training = background.submit(self.train, batch), batch
                        self.admit.pacer.training(batch, self.learner.progress)
        finally:
            background.shutdown(wait=True)
            self.parts.lend_cores(learner_busy=True)  # the engine's own share again

    # ------------------------------------------------------------------ the end
    def run(self) -> dict[str, Any]:
        """The whole stage: the loop ``pipeline.loop.mode`` names, then :meth:`finish` (on
        an error — a full disk, say — :meth:`close`, and the error goes on)."""
        try:
            with self:
                self.run_sync() if self.loop.mode == "sync" else self.run_async()
        except BaseException:
            self.close()
            raise
        return self.finish()

    def close(self) -> None:
        """Close the progress bar, the learner, the engine and the metrics sink."""
        self.bar.close()
        self.parts.close()

    def finish(self) -> dict[str, Any]:
        """Close the learner, the engine and the metrics sink; the stage summary."""
        parts = self.parts.summary()  # engine counters, Ray fleet, trainer, threads
        self.close()
        return stage_summary(
            {"mode": self.loop.mode, **self.log.summary()},
            **parts,
            wall_s=time.perf_counter() - self.t_start,
            session_s=time.perf_counter() - self.t_session,
            trainer_busy_s=self.state.trainer_busy_s,
            collector=self.collector_summary,
            curriculum=self.curriculum.summary(),
            signal=self.signal,
            skipped=len(self.state.skipped),
            nonfinite_steps=self.guard.total,
        )


def run_rl(cfg: RunConfig, run: RunDir, world_dir: Path, tasks: Sequence[Task], start_policy: str, **opts: Any) -> dict[str, Any]:  # fmt: skip
    """Train ``start_policy`` with RL on ``tasks`` (see the module docstring) and return the
    stage summary: :meth:`RLLoop.open`, then :meth:`RLLoop.run`. Resumes from ``RUN/rl``
    when it holds a checkpoint or a log; ``opts``: ``progress``, ``engines`` (the run's
    engine factory)."""
    return RLLoop.open(cfg, run, world_dir, tasks, start_policy, **opts).run()

"""The trainer as a Ray actor (``engine.backend: ray``): the learner in its own process.

:class:`TrainerActor` holds a :class:`~provrl.train.learner.LocalLearner` over its own copy
of the policy (the model the replicas started from, taken from the object store). One RL
step is one actor call with two results::

    meta_ref, weights_ref = actor.step.options(num_returns=2).remote(trajectories)
    meta = ray.get(meta_ref)                    # version, metrics, the metric-sink calls
    engine.load_weights(Published(weights_ref, …), version)   # replicas read weights_ref

so the new weights go from the trainer process into the object store once and from there to
every replica; the driver holds only the reference. Checkpoints are written by the actor
(``save``), which is therefore placed on the driver's node (the run directory's
filesystem); the driver writes ``state.json`` and the completion marker after ``save``
returns, so a kill at any point leaves either a complete checkpoint or none.

The trainer's metrics are recorded in the actor (:class:`~provrl.train.learner.MetricsBuffer`)
and replayed into the run's sink by the driver, so TensorBoard / W&B see the same series as
with ``engine.backend: local``.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from provrl._sys import release_memory
from provrl.distributed.config import RayConfig
from provrl.distributed.engine import connect
from provrl.distributed.weights import PackedWeights, Published, pack_state_dict
from provrl.models.loading import LoadedModel
from provrl.provenance import Trajectory
from provrl.train.config import RLConfig
from provrl.train.learner import LocalLearner, MetricsBuffer, Update, replay_metrics

if TYPE_CHECKING:
    from ray import ObjectRef


class TrainerActor:
    """RL updates in a Ray actor process (see the module docstring). Plain Python;
    :class:`RayLearner` makes it an actor."""

    def __init__(
        self,
        lm: LoadedModel,
        rl: dict[str, Any],
        *,
        version: int,
        seed: int,
        threads: int,
        optimizer_state: str | None,
        reference: str | None = None,
    ) -> None:
        import torch

        if threads:
            torch.set_num_threads(threads)
        torch.manual_seed(seed)
        self.metrics = MetricsBuffer()
        self.learner = LocalLearner(
            lm,
            RLConfig(**rl),
            version=version,
            metrics=self.metrics,
            optimizer_state=optimizer_state,
            reference=reference,
        )

    def step(
        self, trajectories: Sequence[Trajectory]
    ) -> tuple[dict[str, Any], PackedWeights | None]:
        """One update; (version, metrics, recorded metric calls, bytes) and the packed new
        weights — two results, so the weights become their own object-store entry. A refused
        step (not finite; the learner rolled itself back) has ``skipped`` and no weights."""
        u = self.learner.step(trajectories)
        if u.skipped is not None:
            meta = {"version": u.version, "metrics": u.metrics, "calls": self.metrics.take()}
            return meta | {"skipped": u.skipped}, None
        packed = pack_state_dict(u.weights)
        release_memory()  # the RL step's heap churn happens in this process now
        meta = {
            "version": u.version,
            "metrics": u.metrics,
            "calls": self.metrics.take(),
            "nbytes": packed.nbytes,
        }
        return meta, packed

    def save(self, path: str, meta: dict[str, Any]) -> None:
        self.learner.save(path, **meta)

    def info(self) -> dict[str, Any]:
        import ray

        return self.learner.info() | {
            "where": "ray-actor",
            "node_id": ray.get_runtime_context().get_node_id(),
        }


class RayLearner:
    """The :class:`~provrl.train.learner.Learner` surface over a :class:`TrainerActor`."""

    def __init__(
        self,
        lm_ref: LoadedModel | ObjectRef[LoadedModel],
        rl: RLConfig,
        cfg: RayConfig,
        *,
        version: int,
        seed: int,
        threads: int = 0,
        metrics: Any = None,
        optimizer_state: str | os.PathLike[str] | None = None,
        start_timeout_s: float = 900.0,
        reference: str | os.PathLike[str] | None = None,
    ) -> None:
        """``lm_ref``: the LoadedModel (or its object-store reference) holding the weights
        of ``version``; ``rl``: the RLConfig; ``threads``: torch threads of the actor
        (``ray.trainer_threads``, 0 = this process's count); ``reference``: the KL
        reference a resumed learner loads (:class:`~provrl.train.learner.LocalLearner`)."""
        import ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        self._started_ray = connect(cfg)
        if threads <= 0:
            import torch

            threads = torch.get_num_threads()
        here = ray.get_runtime_context().get_node_id()
        actor_cls: Any = ray.remote(TrainerActor).options(
            num_cpus=cfg.trainer_cpus,
            num_gpus=cfg.trainer_gpus,
            max_restarts=0,
            # checkpoints go to the run directory: the driver's filesystem
            scheduling_strategy=NodeAffinitySchedulingStrategy(here, soft=False),
        )
        self.version = version
        self.metrics = metrics
        self.actor: Any = actor_cls.remote(
            lm_ref,
            rl.model_dump(mode="json"),
            version=version,
            seed=seed,
            threads=threads,
            optimizer_state=None if optimizer_state is None else str(optimizer_state),
            reference=None if reference is None else str(reference),
        )
        self._info: dict[str, Any] = ray.get(self.actor.info.remote(), timeout=start_timeout_s)

    def step(self, trajectories: Sequence[Trajectory]) -> Update:
        import ray

        meta_ref, weights_ref = self.actor.step.options(num_returns=2).remote(list(trajectories))
        meta = ray.get(meta_ref)
        replay_metrics(self.metrics, meta["calls"])
        self.version = int(meta["version"])
        if meta.get("skipped") is not None:  # not finite: nothing published
            return Update(self.version, None, meta["metrics"], skipped=meta["skipped"])
        return Update(self.version, Published(weights_ref, meta["nbytes"]), meta["metrics"])

    def save(self, path: str | os.PathLike[str], **meta: Any) -> None:
        import ray

        ray.get(self.actor.save.remote(str(path), meta))

    def info(self) -> dict[str, Any]:
        return dict(self._info)

    def progress(self) -> float | None:
        return None  # in the actor: paced admission falls back to its per-token estimate

    def close(self) -> None:
        import ray

        if self.actor is not None:
            ray.kill(self.actor)
            self.actor = None
        if self._started_ray:
            ray.shutdown()

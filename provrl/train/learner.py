"""The learner role of the RL stage: an :class:`~provrl.train.rl.RLTrainer` over one copy of
the policy, plus what a run needs around it — restore from a checkpoint, save one.

Two implementations with one surface (the :class:`Learner` protocol), chosen by
``provrl.pipeline.engines.make_learner`` from the run config's ``engine.backend``:

* :class:`LocalLearner` — in this process, over the model the caller loaded;
* :class:`provrl.distributed.trainer.RayLearner` — in a Ray actor (its own process and copy
  of the policy); its weights go to the replicas through the object store without passing
  through this process.

::

    learner = LocalLearner(lm, cfg.rl, version=u, metrics=metrics, optimizer_state=ckpt)
    update = learner.step(trajectories)              # θ_{u+1}
    learner.save(ckpt_dir, kind="rl", version=update.version, start_policy=...)
    engine.load_weights(update.weights, update.version, mode)
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from provrl.provenance import Trajectory
from provrl.train.config import RLConfig

if TYPE_CHECKING:  # models.loading imports torch; the learner protocol stays light
    from provrl.models.loading import LoadedModel

OPTIMIZER_FILE = "optimizer.pt"
"""Inside a checkpoint directory: AdamW state, the trainer's RNG state and step count."""


@dataclass
class Update:
    """One RL step as the orchestration sees it."""

    version: int
    """The new weights' version (the old one + 1)."""
    weights: Any
    """What ``engine.load_weights`` takes: a state dict (:class:`LocalLearner`) or a
    :class:`~provrl.distributed.weights.Published` object-store reference (Ray)."""
    metrics: dict[str, float]
    """The step's metrics (also logged to the run's metrics sink)."""


class Learner(Protocol):
    """What the RL loop calls on its learner."""

    @property
    def version(self) -> int:
        """The version of the weights the learner holds (the last step's result)."""
        ...

    def step(self, trajectories: Sequence[Trajectory]) -> Update:
        """One update from ``trajectories``."""
        ...

    def save(self, path: str | os.PathLike[str], **meta: Any) -> None:
        """Write the current weights (``save_checkpoint(..., **meta)``) and optimizer state
        into ``path``."""
        ...

    def info(self) -> dict[str, Any]:
        """Where the learner runs (process id, threads; for Ray the node)."""
        ...

    def close(self) -> None: ...


class LocalLearner:
    """The trainer in this process, over ``lm.model`` (see the module docstring)."""

    def __init__(
        self,
        lm: LoadedModel,
        rl: RLConfig,
        *,
        version: int,
        metrics: Any = None,
        optimizer_state: str | os.PathLike[str] | None = None,
        publish_dtype: Any = None,
    ) -> None:
        """``rl``: the :class:`~provrl.train.config.RLConfig`; ``optimizer_state``: a
        checkpoint directory holding :data:`OPTIMIZER_FILE` (a resumed run), or None;
        ``publish_dtype``: the torch dtype of the weights each step hands to the engines (the
        engines' own; None: the model's)."""
        from provrl.train.rl import RLTrainer

        pad = lm.tokenizer.pad_token_id
        self.lm = lm
        self.trainer = RLTrainer(
            lm.model,
            rl,
            pad_token_id=pad if pad is not None else 0,
            version=version,
            metrics=metrics,
            tokenizer=lm.tokenizer_identity,
            publish_dtype=publish_dtype,
        )
        if optimizer_state is not None:
            self.restore(optimizer_state)

    @property
    def version(self) -> int:
        return self.trainer.version

    def restore(self, ckpt: str | os.PathLike[str]) -> None:
        """Load AdamW state, RNG and step count from ``ckpt/optimizer.pt`` (if the trainer
        has an optimizer: TRPO keeps none)."""
        import torch

        t = self.trainer
        if t.optimizer is None:
            return
        path = Path(ckpt) / OPTIMIZER_FILE
        import pickle

        try:
            opt = torch.load(path, weights_only=True)
            t.optimizer.load_state_dict(opt["optimizer"])
            t.generator.set_state(opt["generator"])
            t.optimizer_steps = int(opt["optimizer_steps"])
        except (OSError, RuntimeError, KeyError, ValueError, pickle.UnpicklingError) as e:
            raise ValueError(f"{path}: unreadable optimizer state ({e})") from e

    def step(self, trajectories: Sequence[Trajectory]) -> Update:
        r = self.trainer.step(trajectories)
        return Update(r.version, r.state_dict, r.metrics)

    def save(self, path: str | os.PathLike[str], **meta: Any) -> None:
        import torch

        from provrl.models.checkpoint import save_checkpoint

        save_checkpoint(self.lm.model, self.lm.tokenizer, path, **meta)
        t = self.trainer
        if t.optimizer is not None:
            torch.save(
                {
                    "optimizer": t.optimizer.state_dict(),
                    "generator": t.generator.get_state(),
                    "optimizer_steps": t.optimizer_steps,
                },
                Path(path) / OPTIMIZER_FILE,
            )

    def info(self) -> dict[str, Any]:
        import torch

        return {"where": "in-process", "pid": os.getpid(), "threads": torch.get_num_threads()}

    def close(self) -> None:
        pass


def replay_metrics(metrics: Any, calls: Sequence[tuple[str, Sequence[Any], Mapping[str, Any]]]) -> None:  # fmt: skip
    """Apply ``(method, args, kwargs)`` calls a :class:`MetricsBuffer` recorded elsewhere
    to the run's metrics sink ``metrics`` (None: dropped)."""
    if metrics is None:
        return
    for name, args, kwargs in calls:
        getattr(metrics, name)(*args, **kwargs)


class MetricsBuffer:
    """Stands in for the metrics sink where the real one lives in another process: records
    ``log`` / ``log_histogram`` calls until :meth:`take`; :func:`replay_metrics` applies
    them to the real sink."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, tuple[Any, ...], dict[str, Any]]] = []

    def log(self, step: int, metrics: Mapping[str, Any], prefix: str = "") -> None:
        self.calls.append(("log", (step, dict(metrics)), {"prefix": prefix}))

    def log_histogram(self, step: int, name: str, values: Any) -> None:
        self.calls.append(("log_histogram", (step, name, values), {}))

    def take(self) -> list[tuple[str, tuple[Any, ...], dict[str, Any]]]:
        calls, self.calls = self.calls, []
        return calls

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
    if update.skipped is None:                       # a finite update
        learner.save(ckpt_dir, kind="rl", version=update.version, start_policy=...)
        engine.load_weights(update.weights, update.version, mode)

A step whose loss, gradient or new weights are not finite is refused by the trainer
(:func:`provrl.train.rl.nonfinite_reason`): ``update.skipped`` says why, the learner holds the
weights and optimizer state it held before the step (rolled back from the last saved copy
where an optimizer step had already run: :meth:`LocalLearner.rollback`), and there is
nothing to save or load. :class:`NonFiniteGuard` counts the refused steps and stops the run
after ``rl.nonfinite_limit`` in a row.
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
    skipped: str | None = None
    """Why the step was refused (its loss, a gradient or a new weight not finite), else
    None. A refused step has no weights (None) and keeps the old version; the learner is
    back where it was before the step."""


class NonFiniteError(ValueError):
    """Too many RL steps in a row were not finite: the run stops (one line, the last
    reason and what to change)."""


class NonFiniteGuard:
    """The refused steps of a run (:attr:`Update.skipped`): each is one warning line and is
    counted (:meth:`since_last_step` goes into the next step record); ``limit`` of them in a
    row raise :class:`NonFiniteError`."""

    def __init__(self, limit: int, total: int = 0) -> None:
        self.limit, self.total, self.streak, self._pending = limit, total, 0, 0

    def skipped(self, update: Update, step: int) -> None:
        """Count one refused attempt at step ``step``; raise once ``limit`` are in a row."""
        self.total += 1
        self.streak += 1
        self._pending += 1
        if self.streak >= self.limit:
            raise NonFiniteError(
                f"rl step {step}: {self.streak} updates in a row were not finite (last: "
                f"{update.skipped}); nothing of them was saved or loaded — lower rl.lr, keep "
                "rl.max_grad_norm set, or check the rewards (rl.nonfinite_limit)"
            )
        import warnings

        warnings.warn(
            f"rl step {step}: update not finite ({update.skipped}); skipped, its batch is "
            f"not trained ({self.streak} in a row, limit {self.limit})",
            NonFiniteWarning,
            stacklevel=2,
        )

    def since_last_step(self) -> int:
        """Refused attempts since the last taken step (and the streak ends: one was taken)."""
        n, self._pending, self.streak = self._pending, 0, 0
        return n


class NonFiniteWarning(UserWarning):
    """An RL step was refused because it was not finite (it is skipped)."""


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

    def progress(self) -> float | None:
        """How far the step in progress is: the share of its tokens whose forward and
        backward are done (None: not observable from here)."""
        ...

    def close(self) -> None: ...


def load_reference(path: str | os.PathLike[str], like: LoadedModel) -> Any:
    """The frozen KL reference π_ref: the model at ``path`` in ``like``'s dtype and device."""
    from provrl.models.loading import DTYPES, load_model

    param = next(like.model.parameters())
    dtype = next(k for k, v in DTYPES.items() if v == param.dtype)
    ref = load_model(str(path), dtype=dtype, device=str(param.device)).model
    return ref.eval().requires_grad_(False)


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
        reference: str | os.PathLike[str] | None = None,
    ) -> None:
        """``rl``: the :class:`~provrl.train.config.RLConfig`; ``optimizer_state``: a
        checkpoint directory holding :data:`OPTIMIZER_FILE` (a resumed run), or None;
        ``publish_dtype``: the torch dtype of the weights each step hands to the engines (the
        engines' own; None: the model's); ``reference``: the policy π_ref of the KL penalty
        (``rl.objective.kl_coef``), the run's start policy. At version 0 ``lm`` is that policy
        and is copied; a resumed learner (version > 0) loads ``reference`` instead, so that the
        penalty still pulls toward the start and not toward the checkpoint resumed from."""
        from provrl.train.rl import RLTrainer

        pad = lm.tokenizer.pad_token_id
        self.lm = lm
        ref_model = None
        if rl.objective.kl_coef > 0 and version > 0:
            if reference is None:
                raise ValueError(
                    f"rl.objective.kl_coef > 0 and the learner resumes at version {version}: "
                    "it needs the start policy as the KL reference (reference=…), or the "
                    "penalty would pull toward the resumed checkpoint"
                )
            ref_model = load_reference(reference, lm)
        self.trainer = RLTrainer(
            lm.model,
            rl,
            pad_token_id=pad if pad is not None else 0,
            version=version,
            metrics=metrics,
            tokenizer=lm.tokenizer_identity,
            publish_dtype=publish_dtype,
            ref_model=ref_model,
        )
        self.durable: Path | None = lm.path
        """The last saved weights (and optimizer state, if any): where :meth:`rollback`
        restores from — the checkpoint resumed from or last saved, else the start policy."""
        if optimizer_state is not None:
            self.restore(optimizer_state)
            self.durable = Path(optimizer_state)

    @property
    def version(self) -> int:
        return self.trainer.version

    def progress(self) -> float | None:
        return self.trainer.progress

    def restore(self, ckpt: str | os.PathLike[str]) -> None:
        """Load AdamW state, RNG and step count from ``ckpt/optimizer.pt`` (if the trainer
        has an optimizer: TRPO keeps none; a LoRA checkpoint holds no AdamW state — its
        adapters were merged into the weights and start again)."""
        import torch

        from provrl.train.lora import has_lora

        t = self.trainer
        if t.optimizer is None:
            return
        path = Path(ckpt) / OPTIMIZER_FILE
        import pickle

        try:
            opt = torch.load(path, weights_only=True)
            if "optimizer" in opt or not has_lora(t.model):
                t.optimizer.load_state_dict(opt["optimizer"])
            t.generator.set_state(opt["generator"])
            t.optimizer_steps = int(opt["optimizer_steps"])
        except (OSError, RuntimeError, KeyError, ValueError, pickle.UnpicklingError) as e:
            raise ValueError(f"{path}: unreadable optimizer state ({e})") from e

    def step(self, trajectories: Sequence[Trajectory]) -> Update:
        r = self.trainer.step(trajectories)
        if r.skipped is not None:
            if r.restore:
                self.rollback()
            return Update(r.version, None, r.metrics, skipped=r.skipped)
        return Update(r.version, r.state_dict, r.metrics)

    def rollback(self) -> None:
        """Put back the weights and optimizer state of :attr:`durable` — the state before a
        refused step, since every taken step is saved before the next one starts (with no
        optimizer file there: a fresh optimizer, as at the start)."""
        import torch

        from provrl.models.checkpoint import load_state_dict
        from provrl.train.lora import has_lora, lora_base_names, reset_adapters

        if self.durable is None:
            raise NonFiniteError(
                "rl: a refused update had already changed the weights and there is no saved "
                "copy to roll back to (the start policy is not a directory); lower rl.lr"
            )
        state: dict[str, torch.Tensor] = {}
        for f in sorted(self.durable.glob("*.safetensors")):
            state.update(load_state_dict(f))
        model = self.lm.model
        lora = has_lora(model)
        if lora:  # merged weights into the base layers, fresh adapters
            state = lora_base_names(model, state)
            reset_adapters(model)
        missing, unexpected = model.load_state_dict(state, strict=False)
        missing = [k for k in missing if ".lora_" not in k]
        tied = {k for k in missing if k.endswith("lm_head.weight")}
        if unexpected or set(missing) - tied:
            raise NonFiniteError(f"{self.durable}: cannot roll back to these weights")
        t = self.trainer
        saved = (self.durable / OPTIMIZER_FILE).is_file()
        if t.optimizer is not None and (lora or not saved):  # LoRA: fresh adapter moments
            from provrl.train.optim import adamw

            c = t.cfg
            t.optimizer = adamw(
                t.params, lr=c.lr, betas=c.betas, eps=c.adam_eps, weight_decay=c.weight_decay
            )
            t.optimizer_steps = 0
        if saved:
            self.restore(self.durable)

    def save(self, path: str | os.PathLike[str], **meta: Any) -> None:
        import torch

        from provrl.models.checkpoint import save_checkpoint
        from provrl.train.lora import has_lora, merged_state_dict

        t = self.trainer
        lora = has_lora(t.model)  # on disk a plain model, W + (alpha / r)·B·A
        merged = merged_state_dict(t.model) if lora else None
        save_checkpoint(self.lm.model, self.lm.tokenizer, path, state_dict=merged, **meta)
        if t.optimizer is not None:
            state = {"generator": t.generator.get_state(), "optimizer_steps": t.optimizer_steps}
            if not lora:  # LoRA: adapters and their moments restart on the merged weights
                state["optimizer"] = t.optimizer.state_dict()
            torch.save(state, Path(path) / OPTIMIZER_FILE)
        self.durable = Path(path)

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

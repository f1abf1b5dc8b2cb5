"""The run's engine factory and learner, each built from the run config by one switch,
``engine.backend``:

==============  =================================================  ======================
engine.backend  engines (:class:`~provrl.engine.api.EngineFactory`)  learner
==============  =================================================  ======================
local, vllm     :func:`provrl.engine.make_engine`, in this process  :class:`LocalLearner`
ray             :class:`provrl.distributed.RayEngines`: replicas    :class:`RayLearner`, an
                as Ray actors, each running ``ray.engine``          actor
==============  =================================================  ======================

:func:`provrl.pipeline.run.run_pipeline` builds the factory once and hands it to the probe,
eval and RL stages (:mod:`provrl.rollout.setup` builds each stage's environment with it);
``provrl eval`` and ``provrl probe`` build theirs here too, and every engine's settings come
from :func:`stage_engine_config`.
"""

from __future__ import annotations

import os
from typing import Any

from provrl.distributed.config import RayConfig
from provrl.distributed.engine import RayEngine
from provrl.distributed.factory import RayEngines
from provrl.distributed.trainer import RayLearner
from provrl.engine.api import Engine, EngineFactory
from provrl.engine.config import EngineConfig, for_stage
from provrl.engine.factory import make_engine
from provrl.models.loading import DTYPES, LoadedModel
from provrl.models.precision import resolve_dtype
from provrl.run_config.run import RunConfig
from provrl.train.learner import Learner, LocalLearner


def engine_factory(cfg: RunConfig) -> EngineFactory:
    """The run's rollout engines: Ray replicas for ``engine.backend: ray``, else the
    in-process engine ``engine.backend`` names."""
    if cfg.engine.backend == "ray":
        return RayEngines(cfg.ray)
    return make_engine


def make_rollout_engine(
    lm: LoadedModel, cfg: RunConfig, engine_cfg: EngineConfig | None = None, *, version: int = 0
) -> Engine:
    """One engine from the run's factory (:func:`engine_factory`) serving ``lm``, whose weights
    are ``version``; ``engine_cfg`` (the replica's settings) defaults to ``cfg.engine``."""
    return engine_factory(cfg)(lm, engine_cfg or cfg.engine, version=version)


def stage_engine_config(
    cfg: RunConfig, concurrency: int, *, seed: int | None = None, threads: int | None = None
) -> EngineConfig:
    """The one derivation of an engine's settings from a run config: ``cfg.engine`` with a
    KV slot for each of a stage's ``concurrency`` agent loops, and the stage's sampler
    ``seed`` and scheduler ``threads`` where given (:func:`provrl.engine.config.for_stage`).
    ``provrl run`` (probe, RL, eval), ``provrl eval`` and ``provrl probe`` all call it."""
    return for_stage(cfg.engine, concurrency, seed=seed, threads=threads)


def make_learner(
    lm: LoadedModel,
    cfg: RunConfig,
    engine: Engine,
    *,
    version: int,
    metrics: Any = None,
    threads: int = 0,
    optimizer_state: str | os.PathLike[str] | None = None,
    reference: str | os.PathLike[str] | None = None,
) -> Learner:
    """The RL stage's learner: ``engine.backend: ray`` → a :class:`RayLearner`, the trainer
    in a Ray actor starting from the model the replicas started from (``engine.model_ref``);
    otherwise a :class:`LocalLearner` over ``lm.model`` in this process. ``threads``: torch
    threads the trainer should use (0: ``ray.trainer_threads``, else the process default);
    ``optimizer_state``: the checkpoint directory a resumed run restores the optimizer from;
    ``reference``: the start policy, the KL penalty's π_ref when resuming."""
    if cfg.engine.backend == "ray":
        ray: RayConfig = cfg.ray
        return RayLearner(
            engine.model_ref if isinstance(engine, RayEngine) else lm,
            cfg.rl,
            ray,
            version=version,
            seed=cfg.seed + version,
            threads=threads or ray.trainer_threads,
            metrics=metrics,
            optimizer_state=optimizer_state,
            reference=reference,
        )
    # the engines round the published weights to their dtype anyway: publish them in it
    engine_dtype = resolve_dtype(cfg.engine.dtype, cfg.engine.device)
    publish = DTYPES[engine_dtype] if engine_dtype != cfg.model.dtype else None
    return LocalLearner(
        lm,
        cfg.rl,
        version=version,
        metrics=metrics,
        optimizer_state=optimizer_state,
        publish_dtype=publish,
        reference=reference,
    )

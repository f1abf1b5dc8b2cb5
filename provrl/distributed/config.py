"""Typed configuration of the Ray backend (``engine.backend: ray`` in the run config)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from provrl.config import Section

HotLoadSchedule = Literal["all", "rolling"]
"""``all``: every replica takes the new version at once (their pauses overlap; with
``drain`` the whole fleet stops admitting). ``rolling``: one replica after another, the
others keep generating meanwhile."""


class RayConfig(Section):
    """Engine replicas as Ray actors: where the cluster is, how many replicas, how they
    recover. Used when the run config says ``engine.backend: ray``."""

    address: str | None = Field(
        None,
        description="ray.init address: None starts a local Ray instance in this process "
        "(shut down with the run); 'auto' joins the cluster of `ray start --head` on this "
        "machine; 'ray://host:10001' a remote one.",
    )
    num_cpus: int | None = Field(
        None,
        ge=1,
        description="CPUs a local Ray instance offers (None: every core). Ignored when "
        "joining a cluster (address set).",
    )
    object_store_mb: int | None = Field(
        None,
        ge=64,
        description="Object-store size of a local Ray instance in MiB (None: Ray's default, "
        "30 % of memory). Holds the model once plus one published weight version.",
    )
    worker_niceness: int = Field(
        0,
        ge=0,
        le=19,
        description="nice value of the replica processes of a local Ray instance. Ray's own "
        "default, 15, starves them on a busy machine (an actor took 120 s to start instead "
        "of 4 s beside a training run); a cluster of `ray start` sets RAY_worker_niceness.",
    )
    replicas: int = Field(
        2, ge=1, description="Engine replicas, each a Ray actor in its own process."
    )
    engine: Literal["local", "vllm"] = Field(
        "local",
        description="The engine each replica runs, with the engine section's settings: "
        "'local' (provrl's PyTorch engine) or 'vllm' (docs/engine.md §10).",
    )
    threads: int = Field(
        1,
        ge=1,
        description="torch threads of each replica (also its Ray num_cpus request); "
        "replaces engine.threads inside the replica processes.",
    )
    num_gpus: float = Field(
        0.0,
        ge=0.0,
        description="GPUs each replica asks Ray for (1 = one replica per GPU; the engine "
        "then runs on engine.device=cuda). Weights still travel through the object store.",
    )
    placement: Literal["spread", "pack"] = Field(
        "spread",
        description="spread: Ray's SPREAD strategy (replicas on different nodes where "
        "resources allow); pack: Ray's default placement.",
    )
    schedule: HotLoadSchedule = Field(
        "rolling",
        description="How a new weight version reaches the replicas (the trainer publishes "
        "it once): all = every replica swaps at once (the pauses overlap); rolling = one "
        "replica at a time while the others keep generating.",
    )
    max_restarts: int = Field(
        3,
        ge=0,
        description="Times each replica is restarted after its process dies (it comes back "
        "at the newest published version); after that it is dead and its requests fail.",
    )
    resubmit: bool = Field(
        True,
        description="Resubmit a turn that was generating on a replica that died (its whole "
        "context is re-prefilled on the restarted replica, with the turn's own seed); "
        "False fails the turn with an EngineError (the episode is recorded as aborted).",
    )
    max_resubmits: int = Field(
        2, ge=0, description="Most resubmissions of one turn before it fails."
    )
    stats_timeout_s: float = Field(
        10.0,
        gt=0,
        description="Longest wait for a replica's counters in stats(); a replica that does "
        "not answer (restarting) reports only its client-side counters.",
    )
    trainer_threads: int = Field(
        0,
        ge=0,
        description="torch threads of the trainer actor (0: as many as the driver process "
        "has). The trainer runs as a Ray actor in its own process whenever engine.backend is "
        "ray.",
    )
    trainer_cpus: float = Field(
        0.0,
        ge=0.0,
        description="CPUs the trainer actor reserves in Ray's accounting. 0 lets it share "
        "the replicas' cores, as the in-process trainer shares the engine's; on a cluster "
        "set it (and trainer_gpus) so Ray keeps replicas off the trainer's cores.",
    )
    trainer_gpus: float = Field(
        0.0,
        ge=0.0,
        description="GPUs the trainer actor asks Ray for (1 with model.device=cuda).",
    )
    log_to_driver: bool = Field(
        False, description="Forward the replica processes' stdout/stderr to this process."
    )

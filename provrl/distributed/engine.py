"""Engine replicas as Ray actors behind one :class:`~provrl.engine.api.Engine`.

:class:`RayEngine` starts ``ray.replicas`` actors (:mod:`provrl.distributed.replica`, each a
process with ``ray.threads`` torch threads), wraps each in a
:class:`~provrl.distributed.client.ReplicaClient` and routes over them with the existing
:class:`~provrl.engine.router.Router` (least loaded, prefix affinity, continuations to the
replica that holds the KV). New weights::

    ref = ray.put(pack(state_dict))                  once per version (WeightStore)
    schedule all:      every replica loads ref at once        (their pauses overlap)
    schedule rolling:  replica 0 loads ref, then 1, then …    (the others keep generating)

Every token keeps the replica and version that sampled it (the replica's own stamps);
``timeline()`` lists each replica's version changes over time, restarts included.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from provrl.distributed.client import COUNTERS, FAULTS, ReplicaClient
from provrl.distributed.config import RayConfig
from provrl.distributed.replica import EngineReplica
from provrl.distributed.weights import Published, WeightStore
from provrl.engine.api import EngineError, HotLoadMode, HotLoadReport, TurnOutput
from provrl.engine.config import EngineConfig
from provrl.engine.hotload import read_weights
from provrl.engine.router import Router
from provrl.extras import require
from provrl.models.loading import LoadedModel
from provrl.provenance import SamplingParams


@contextlib.contextmanager
def _env(name: str, value: str) -> Iterator[None]:
    """``os.environ[name] = value`` unless already set, for the duration of the block."""
    before = os.environ.get(name)
    if before is None:
        os.environ[name] = value
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(name, None)


def connect(cfg: RayConfig) -> bool:
    """Join ``cfg.address`` or start a local Ray instance; True if this call started it
    (the caller then shuts it down). An already initialised Ray is used as it is."""
    require("ray", "ray", "engine.backend: ray")
    import ray

    if ray.is_initialized():
        return False
    common: dict[str, Any] = {
        "include_dashboard": False,
        "log_to_driver": cfg.log_to_driver,
        "logging_level": "WARNING",
    }
    if cfg.address:
        ray.init(address=cfg.address, **common)
    else:
        store = cfg.object_store_mb * 2**20 if cfg.object_store_mb else None
        with _env("RAY_worker_niceness", str(cfg.worker_niceness)):
            ray.init(num_cpus=cfg.num_cpus, object_store_memory=store, **common)
    return True


class RayEngine:
    """``ray.replicas`` engine actors behind the router (see the module docstring)."""

    def __init__(
        self,
        lm: LoadedModel,
        engine_cfg: EngineConfig,
        cfg: RayConfig,
        *,
        version: int = 0,
        start_timeout_s: float = 900.0,
    ) -> None:
        self.cfg = cfg
        self._started_ray = connect(cfg)  # first: without Ray, the one-line MissingExtra
        import ray

        self._t0 = time.perf_counter()
        self.store = WeightStore(version)
        self._base_version = version
        self.model_ref: Any = ray.put(lm)
        """The LoadedModel in the object store (the replicas' and the trainer actor's start)."""
        self._replica_cfg = engine_cfg.model_copy(update={"threads": cfg.threads}).model_dump()
        options: dict[str, Any] = {
            "num_cpus": cfg.threads,
            "num_gpus": cfg.num_gpus,
            "max_restarts": 0,  # the client restarts it, at the newest version
            "max_task_retries": 0,
        }
        if cfg.placement == "spread":
            options["scheduling_strategy"] = "SPREAD"
        self._actor_cls = ray.remote(EngineReplica).options(**options)
        self.clients = [
            ReplicaClient(i, self._spawn, self.store, cfg, self._t0) for i in range(cfg.replicas)
        ]
        self.router = Router(self.clients)
        self.last_reports: list[HotLoadReport] = []
        self.last_schedule_ms = 0.0
        deadline = time.perf_counter() + start_timeout_s
        for c in self.clients:
            started = c.wait_ready(max(0.0, deadline - time.perf_counter()))
            if not started or c.dead:
                self.close()
                why = f"died {cfg.max_restarts + 1} times ({c.last_error})" if c.dead else f"did not start in {start_timeout_s} s"  # fmt: skip
                raise EngineError(f"ray engine replica {c.index} {why}")

    def _spawn(self, index: int) -> tuple[Any, int]:
        """A new actor for replica ``index`` at the newest published version."""
        version, ref = self.store.latest()
        handle = self._actor_cls.remote(
            self.model_ref, self._replica_cfg, index, self._base_version, ref, version
        )
        return handle, max(version, self._base_version)

    # ------------------------------------------------------------------ Engine protocol
    @property
    def version(self) -> int:
        return self.router.version

    def versions(self) -> list[int]:
        return self.router.versions()

    def submit(
        self,
        prompt_ids: Sequence[int],
        params: SamplingParams,
        *,
        request_id: str | None = None,
    ) -> Future[TurnOutput]:
        return self.router.submit(prompt_ids, params, request_id=request_id)

    def submit_continue(
        self, request_id: str, extra_ids: Sequence[int], params: SamplingParams
    ) -> Future[TurnOutput]:
        return self.router.submit_continue(request_id, extra_ids, params)

    def cancel(self, request_id: str) -> None:
        self.router.cancel(request_id)

    def release(self, request_id: str) -> None:
        self.router.release(request_id)

    def replica_of(self, request_id: str) -> int:
        return self.router.replica_of(request_id)

    def load_weights(
        self,
        weights: Mapping[str, Any] | str | os.PathLike[str] | Published,
        version: int,
        mode: HotLoadMode = "keep",
        *,
        schedule: str | None = None,
    ) -> HotLoadReport:
        """Publish ``weights`` once as ``version`` and load it on every replica by
        ``schedule`` (default ``ray.schedule``); a :class:`Published` (the trainer actor's
        weights, already in the object store) is handed on as it is. The report: the
        longest per-replica pause, summed in-flight and recomputed counts; ``last_reports``
        holds the per-replica reports, ``last_schedule_ms`` the wall time of the whole
        schedule."""
        if isinstance(weights, Published):
            ref = self.store.adopt(weights, version)
        else:
            sd, _ = read_weights(weights)
            ref = self.store.publish(sd, version)
        schedule = schedule or self.cfg.schedule
        t0 = time.perf_counter()

        def load(c: ReplicaClient) -> HotLoadReport:
            return c.load_published(version, ref, mode)

        if schedule == "all":
            with ThreadPoolExecutor(len(self.clients), thread_name_prefix="hotload") as ex:
                reports = list(ex.map(load, self.clients))
        elif schedule == "rolling":
            reports = [load(c) for c in self.clients]
        else:
            raise ValueError(f"ray.schedule {schedule!r} is not all or rolling")
        self.last_schedule_ms = (time.perf_counter() - t0) * 1e3
        self.last_reports = reports
        return HotLoadReport.combine(reports, mode, version)

    def stats(self) -> dict[str, float]:
        """The router's totals and ``r{i}/…`` per replica, plus fleet totals of the engine
        counters and of the fault counters (deaths, restarts, resubmitted/failed turns,
        recovery time), and what was published."""
        out = self.router.stats()
        n = len(self.clients)
        for k in (*COUNTERS, *FAULTS):
            vals = [out.get(f"r{i}/{k}", 0.0) for i in range(n)]
            out[k] = max(vals) if k.startswith("recover_s") else sum(vals)
        out["published_versions"] = float(self.store.published)
        out["published_mb"] = self.store.published_bytes / 2**20
        return out

    def timeline(self) -> list[tuple[float, int, int]]:
        """(seconds since start, replica, version) of every version change, in time order."""
        return sorted(e for c in self.clients for e in c.timeline)

    def replica_info(self) -> list[dict[str, Any]]:
        """Per replica: pid, Ray node id, version as reported when it (last) started."""
        return [dict(c.info) for c in self.clients]

    def kill_replica(self, index: int) -> None:
        """Fault injection: ``ray.kill`` replica ``index`` (it is restarted)."""
        self.clients[index].kill()

    def close(self) -> None:
        import ray

        for c in self.clients:
            c.close()
        self.model_ref = None
        if self._started_ray:
            ray.shutdown()

    def __enter__(self) -> RayEngine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

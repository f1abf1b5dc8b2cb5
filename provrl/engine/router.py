"""N engine replicas behind one :class:`~provrl.engine.api.Engine`.

Placement of a new request: the least-loaded replica (turns generating or queued), except
that a prompt whose first ``prefix_tokens`` ids were seen recently goes back to the replica
that saw them (its prefix cache holds that KV — the k samples of a GRPO group, the shared
agent instructions) unless that replica is more than ``max_imbalance`` turns busier than
the least-loaded one. A continuation, cancel or release always goes to the replica that
holds the request's KV (affinity). Replicas keep their own versions: ``load_weights`` can
update all of them or a subset, so a run can have replicas at different versions at once.
"""

from __future__ import annotations

import itertools
import os
import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future
from typing import Any

from provrl.engine.api import (
    Engine,
    EngineError,
    HotLoadMode,
    HotLoadReport,
    ThreadedEngine,
    TurnOutput,
)
from provrl.engine.hotload import read_weights
from provrl.provenance import SamplingParams


def engine_load(engine: Engine) -> int:
    """Turns generating or queued on one replica."""
    load = getattr(engine, "load", None)
    if callable(load):
        return int(load())
    s = engine.stats()
    return int(s.get("active", 0) + s.get("queued", 0))


class Router:
    """Least-loaded placement with prefix affinity over engine replicas."""

    def __init__(
        self,
        engines: Sequence[Engine],
        *,
        prefix_tokens: int = 64,
        max_imbalance: int = 4,
        remember: int = 4096,
    ) -> None:
        if not engines:
            raise EngineError("Router needs at least one engine replica")
        self.engines = list(engines)
        self.prefix_tokens = prefix_tokens
        self.max_imbalance = max_imbalance
        self._remember = remember
        self._owner: dict[str, int] = {}
        self._recent: OrderedDict[tuple[int, ...], int] = OrderedDict()
        self._ids = itertools.count()
        self._lock = threading.Lock()
        self.last_reports: list[HotLoadReport] = []

    @property
    def version(self) -> int:
        """The newest version any replica samples with."""
        return max(e.version for e in self.engines)

    def versions(self) -> list[int]:
        return [e.version for e in self.engines]

    def place(self, prompt_ids: Sequence[int]) -> int:
        """The replica index a new request with this prompt goes to."""
        loads = [engine_load(e) for e in self.engines]
        best = min(range(len(loads)), key=loads.__getitem__)
        key = tuple(prompt_ids[: self.prefix_tokens])
        with self._lock:
            seen = self._recent.get(key)
        if seen is not None and loads[seen] <= loads[best] + self.max_imbalance:
            return seen
        return best

    def submit(
        self,
        prompt_ids: Sequence[int],
        params: SamplingParams,
        *,
        request_id: str | None = None,
        on_token: Callable[[str, int], None] | None = None,
    ) -> Future[TurnOutput]:
        i = self.place(prompt_ids)
        with self._lock:
            rid = request_id if request_id is not None else f"q{next(self._ids)}"
            if rid in self._owner:
                raise EngineError(f"request {rid!r}: this request id is already in use")
            self._owner[rid] = i
            key = tuple(prompt_ids[: self.prefix_tokens])
            self._recent[key] = i
            self._recent.move_to_end(key)
            while len(self._recent) > self._remember:
                self._recent.popitem(last=False)
        try:
            engine = self.engines[i]
            if on_token is not None:
                return engine.submit(  # type: ignore[call-arg]
                    prompt_ids, params, request_id=rid, on_token=on_token
                )
            return engine.submit(prompt_ids, params, request_id=rid)
        except BaseException:
            with self._lock:
                self._owner.pop(rid, None)
            raise

    def _engine_of(self, request_id: str) -> Engine:
        with self._lock:
            i = self._owner.get(request_id)
        if i is None:
            raise EngineError(f"unknown request id {request_id!r} (never submitted, or released)")
        return self.engines[i]

    def replica_of(self, request_id: str) -> int:
        with self._lock:
            if request_id not in self._owner:
                raise EngineError(f"unknown request id {request_id!r}")
            return self._owner[request_id]

    def submit_continue(
        self,
        request_id: str,
        extra_ids: Sequence[int],
        params: SamplingParams,
        on_token: Callable[[str, int], None] | None = None,
    ) -> Future[TurnOutput]:
        engine = self._engine_of(request_id)
        if on_token is not None:
            return engine.submit_continue(  # type: ignore[call-arg]
                request_id, extra_ids, params, on_token=on_token
            )
        return engine.submit_continue(request_id, extra_ids, params)

    def cancel(self, request_id: str) -> None:
        self._engine_of(request_id).cancel(request_id)

    def release(self, request_id: str) -> None:
        self._engine_of(request_id).release(request_id)
        with self._lock:
            self._owner.pop(request_id, None)

    def load_weights(
        self,
        weights: Mapping[str, Any] | str | os.PathLike[str],
        version: int,
        mode: HotLoadMode = "keep",
        *,
        replicas: Sequence[int] | None = None,
    ) -> HotLoadReport:
        """Hot-load ``replicas`` (default: all) one after another, so the others keep
        serving meanwhile. The report: the longest pause, the summed in-flight and
        recomputed counts; ``last_reports`` keeps the per-replica reports."""
        sd, _ = read_weights(weights)  # read a file once, not once per replica
        chosen = list(range(len(self.engines))) if replicas is None else list(replicas)
        for i in chosen:
            if not 0 <= i < len(self.engines):
                raise EngineError(f"load_weights: no replica {i} (have {len(self.engines)})")
        reports = [self.engines[i].load_weights(sd, version, mode) for i in chosen]
        self.last_reports = reports
        return HotLoadReport.combine(reports, mode, version)

    def set_threads(self, n: int) -> None:
        """Each replica that runs in this process uses ``n`` torch threads from its next step
        (:class:`~provrl.engine.api.ThreadedEngine`); others are left alone."""
        for e in self.engines:
            if isinstance(e, ThreadedEngine):
                e.set_threads(n)

    def stats(self) -> dict[str, float]:
        """Totals over replicas plus ``r{i}/<name>`` per replica."""
        out: dict[str, float] = {}
        for i, e in enumerate(self.engines):
            for k, v in e.stats().items():
                out[f"r{i}/{k}"] = v
                if k in ("tokens_generated", "active", "queued", "idle", "tokens_per_s"):
                    out[k] = out.get(k, 0.0) + v
        out["replicas"] = float(len(self.engines))
        out["version"] = float(self.version)
        return out

    def close(self) -> None:
        for e in self.engines:
            e.close()

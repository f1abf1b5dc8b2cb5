"""An :class:`~provrl.engine.api.Engine` over one replica actor — and what happens when that
actor's process dies.

The client keeps, for every request, its whole context (prompt, sampled ids, tool ids: the
ids the engine consumed and produced, in order) and which *incarnation* of the replica
holds its KV. A turn is one actor call; its Ray reference becomes the caller's future.

A replica's death is seen the moment Ray fails the ``wait_forever`` call the client keeps
open (or any call in flight). Then, on the client's supervisor thread::

    incarnation += 1; start a new actor at the newest published version (WeightStore.latest)
    every turn that was generating on the dead one:
        resubmit:  submit(whole context, the turn's own SamplingParams) on the new actor —
                   a fresh prefill, the same seed, the caller's future unchanged
        or fail:   EngineError naming the replica and why (ray.resubmit off, resubmissions
                   used up, restarts used up) — run_episode records the episode as aborted
    every request idle between turns: its KV is gone; its next turn is a fresh submit of
        its context + the new ids (counted as re-prefilled)

The restarted replica never samples a token under an older version than the newest
published one (it loads it in its constructor, before any call reaches it), and no partial
turn is ever delivered: a turn's tokens reach the caller only when the turn has ended on a
live replica.
"""

from __future__ import annotations

import itertools
import logging
import queue
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

import numpy as np

from provrl.distributed.config import RayConfig
from provrl.distributed.weights import WeightStore
from provrl.engine.api import EngineError, HotLoadMode, HotLoadReport, TurnOutput
from provrl.provenance import SamplingParams

log = logging.getLogger(__name__)

COUNTERS = (
    "steps",
    "tokens_generated",
    "prefill_tokens",
    "prefix_hit_tokens",
    "evictions",
    "hotloads",
    "drains",
    "cache_resets",
    "drain_evictions",
    "drain_wait_s",
    "recomputed_tokens",
    "turns_finished",
    "busy_s",
)
"""Engine counters that add up over a replica's incarnations (the rest are gauges)."""

FAULTS = (
    "deaths",
    "restarts",
    "turns_resubmitted",
    "turns_failed",
    "requests_reprefilled",
    "recover_s_last",
    "recover_s_max",
)
"""Client-side fault counters, per replica (``recover_s``: death seen → new actor ready)."""

Spawn = Callable[[int], tuple[Any, int]]
"""``spawn(replica index)`` → (a new actor handle, the weight version it starts at)."""


@dataclass(eq=False)
class _Req:
    rid: str
    ctx: list[int]
    """Every id of the request's context, in order (what a fresh prefill feeds)."""
    kv_inc: int = -1
    """The incarnation whose KV holds ``ctx`` (-1: none)."""
    future: Future[TurnOutput] | None = None
    """The caller's future of the running turn (None between turns)."""
    params: SamplingParams | None = None
    turn_inc: int = -1
    resubmits: int = 0
    cancelled: bool = False
    released: bool = False


def _cause(exc: BaseException) -> BaseException:
    """The exception raised inside the actor (Ray wraps it in a RayTaskError)."""
    cause = getattr(exc, "cause", None)
    return cause if isinstance(cause, BaseException) else exc


def _cancelled(rid: str, replica: int) -> TurnOutput:
    empty_f, empty_i = np.zeros(0, np.float32), np.zeros(0, np.int32)
    return TurnOutput(rid, [], empty_f, empty_f, empty_i, empty_i, empty_i, replica, "cancelled")


class ReplicaClient:
    """The Engine protocol over one replica actor, surviving its deaths (module docstring).

    ``load()`` is answered locally (turns submitted and not yet returned), so the router's
    placement costs no round trip; a restarting replica reports a load of at least
    :data:`RESTARTING_LOAD` so that new requests go to the others, a dead one
    :data:`DEAD_LOAD`."""

    RESTARTING_LOAD = 1_000
    DEAD_LOAD = 1_000_000

    def __init__(
        self, index: int, spawn: Spawn, store: WeightStore, cfg: RayConfig, t0: float
    ) -> None:
        self.index, self.cfg, self._spawn, self._store, self._t0 = index, cfg, spawn, store, t0
        self._cv = threading.Condition()
        self._reqs: dict[str, _Req] = {}
        self._ids = itertools.count()
        self._events: queue.SimpleQueue[tuple[Any, ...]] = queue.SimpleQueue()
        self._faults: dict[str, float] = dict.fromkeys(FAULTS, 0.0)
        self._base: dict[str, float] = dict.fromkeys(COUNTERS, 0.0)
        self._last_remote: dict[str, float] = {}
        self._closed = self._dead = False
        self._inc = 0
        self._actor, self._version = spawn(index)
        self._ready = False
        self._t_death: float | None = None
        self.info: dict[str, Any] = {}
        self.last_error = ""
        """How the last incarnation died (the Ray exception, one line)."""
        self.last_pause: tuple[float, float] | None = None
        """Wall-clock window (time.time()) of this replica's last swap pause."""
        self.timeline: list[tuple[float, int, int]] = [(0.0, index, self._version)]
        """(seconds since the engine started, replica, version) at every version change."""
        self._thread = threading.Thread(
            target=self._supervise, name=f"provrl-ray-replica-{index}", daemon=True
        )
        self._thread.start()
        self._watch()

    # ------------------------------------------------------------------ Engine protocol
    @property
    def version(self) -> int:
        return self._version

    def submit(
        self,
        prompt_ids: Sequence[int],
        params: SamplingParams,
        *,
        request_id: str | None = None,
    ) -> Future[TurnOutput]:
        ids = [int(i) for i in prompt_ids]
        rid = request_id if request_id is not None else f"r{self.index}-{next(self._ids)}"
        if not ids:
            raise EngineError(f"request {rid!r}: empty prompt")
        with self._cv:
            self._check_usable()
            if rid in self._reqs:
                raise EngineError(f"request {rid!r}: this request id is already in use")
            req = _Req(rid, ids)
            self._reqs[rid] = req
            return self._start(req, params, None)

    def submit_continue(
        self, request_id: str, extra_ids: Sequence[int], params: SamplingParams
    ) -> Future[TurnOutput]:
        extra = [int(i) for i in extra_ids]
        with self._cv:
            self._check_usable()
            req = self._get(request_id)
            if req.future is not None:
                raise EngineError(f"request {request_id!r}: its previous turn is still running")
            return self._start(req, params, extra)

    def cancel(self, request_id: str) -> None:
        with self._cv:
            req = self._get(request_id)
            req.cancelled = True
            if req.future is not None and req.turn_inc == self._inc and self._actor is not None:
                self._actor.cancel.remote(request_id)

    def release(self, request_id: str) -> None:
        with self._cv:
            req = self._get(request_id)
            del self._reqs[request_id]
            req.released = req.cancelled = True
            if req.kv_inc == self._inc and self._actor is not None:
                self._actor.release.remote(request_id)  # answers a bool: never an error

    def load_weights(
        self,
        weights: Mapping[str, Any] | Any,
        version: int,
        mode: HotLoadMode = "keep",
    ) -> HotLoadReport:
        """Publish ``weights`` (a state dict) once as ``version`` and load it here."""
        ref = self._store.publish(weights, version)
        return self.load_published(version, ref, mode)

    def load_published(self, version: int, ref: Any, mode: HotLoadMode) -> HotLoadReport:
        """Hot-load the published ``version`` (its object-store reference ``ref``) on this
        replica and wait. A replica that dies meanwhile restarts at the newest published
        version, which is at least ``version``: that counts as loaded."""
        from ray.exceptions import RayActorError

        t0 = time.perf_counter()
        while True:
            with self._cv:
                self._check_usable()
                old, inc, actor = self._version, self._inc, self._actor
                if old >= version:
                    in_flight = sum(r.future is not None for r in self._reqs.values())
                    ms = (time.perf_counter() - t0) * 1e3
                    return HotLoadReport(mode, old, old, ms, in_flight)
            try:
                done = actor.load_weights.remote(ref, version, mode).future().result()
            except RayActorError:
                self._wait_restart(inc)
                continue
            except Exception as e:
                raise EngineError(f"replica {self.index}: {_cause(e)}") from None
            rep, end = done
            with self._cv:
                self.last_pause = (end - rep.update_ms / 1e3, end)
                if inc == self._inc and rep.new_version > self._version:
                    self._set_version(rep.new_version)
            return rep

    def _wait_restart(self, inc: int) -> None:
        """Block until the supervisor has handled the death of incarnation ``inc``."""
        with self._cv:
            self._cv.wait_for(lambda: self._inc != inc or self._closed or self._dead)

    def stats(self) -> dict[str, float]:
        import ray
        from ray.exceptions import GetTimeoutError, RayActorError

        with self._cv:
            actor, ready, inc = self._actor, self._ready, self._inc
        remote: dict[str, float] = {}
        if actor is not None and ready:
            try:
                remote = ray.get(actor.stats.remote(), timeout=self.cfg.stats_timeout_s)
            except (RayActorError, GetTimeoutError):
                remote = {}
        with self._cv:
            if remote and inc == self._inc:
                self._last_remote = dict(remote)
            out = dict(remote)
            for k in COUNTERS:
                out[k] = self._base[k] + float(remote.get(k, 0.0))
            out.update(self._faults)
            out.update(
                version=float(self._version),
                replica=float(self.index),
                incarnation=float(self._inc),
                load=float(self.load()),
                dead=float(self._dead),
            )
        return out

    @property
    def dead(self) -> bool:
        """Restarts used up: the replica serves nothing any more."""
        return self._dead

    @property
    def incarnation(self) -> int:
        """How many times this replica's process was started, minus one."""
        return self._inc

    def owns(self, request_id: str) -> bool:
        with self._cv:
            return request_id in self._reqs

    def load(self) -> int:
        """Turns generating or queued (the router's placement signal), answered locally."""
        with self._cv:
            running = sum(r.future is not None for r in self._reqs.values())
            if self._dead:
                return self.DEAD_LOAD + running
            if not self._ready:
                return self.RESTARTING_LOAD + running
            return running

    def wait_ready(self, timeout: float | None = None) -> bool:
        """Block until the current incarnation has started (True) or ``timeout`` passed."""
        with self._cv:
            return self._cv.wait_for(lambda: self._ready or self._dead or self._closed, timeout)

    def kill(self) -> None:
        """``ray.kill`` the current actor (fault injection: the client restarts it)."""
        import ray

        with self._cv:
            actor = self._actor
        if actor is not None:
            ray.kill(actor, no_restart=True)

    def close(self) -> None:
        import ray

        with self._cv:
            if self._closed:
                return
            self._closed = True
            actor, self._actor = self._actor, None
            pending = [r.future for r in self._reqs.values() if r.future is not None]
            for r in self._reqs.values():
                r.future = None
            self._cv.notify_all()
        for f in pending:
            if not f.done():
                f.set_exception(EngineError(f"engine replica {self.index} is closed"))
        if actor is not None:
            ray.kill(actor, no_restart=True)
        self._events.put(("stop",))
        self._thread.join()

    # ------------------------------------------------------------------ internals
    def _check_usable(self) -> None:
        if self._closed:
            raise EngineError(f"engine replica {self.index} is closed")
        if self._dead:
            raise EngineError(
                f"engine replica {self.index} is dead: its process died and "
                f"ray.max_restarts={self.cfg.max_restarts} restarts are used up"
            )

    def _get(self, rid: str) -> _Req:
        req = self._reqs.get(rid)
        if req is None:
            raise EngineError(f"unknown request id {rid!r} (never submitted, or released)")
        return req

    def _start(self, req: _Req, params: SamplingParams, extra: list[int] | None) -> Future[TurnOutput]:  # fmt: skip
        """Begin a turn (lock held): a continuation on the kept KV, or a fresh submit of the
        whole context where this incarnation does not hold it."""
        fut: Future[TurnOutput] = Future()
        req.future, req.params, req.resubmits, req.cancelled = fut, params, 0, False
        if extra is not None:
            req.ctx.extend(extra)
        self._send(req, extra)
        return fut

    def _send(self, req: _Req, extra: list[int] | None) -> None:
        assert self._actor is not None and req.params is not None
        if extra is not None and req.kv_inc == self._inc:
            ref = self._actor.submit_continue.remote(req.rid, extra, req.params)
        else:
            if extra is not None:
                self._faults["requests_reprefilled"] += 1
            ref = self._actor.submit.remote(list(req.ctx), req.params, req.rid)
        req.kv_inc = req.turn_inc = inc = self._inc
        ref.future().add_done_callback(lambda f: self._events.put(("turn", req, inc, f)))

    def _watch(self) -> None:
        """Two calls on the new incarnation: ``info`` (it has started) and ``wait_forever``
        (fails the moment the process dies)."""
        assert self._actor is not None
        inc = self._inc
        self._actor.info.remote().future().add_done_callback(
            lambda f: self._events.put(("ready", inc, f))
        )
        self._actor.wait_forever.remote().future().add_done_callback(
            lambda f: self._events.put(("died", inc, f))
        )

    def _set_version(self, v: int) -> None:
        self._version = v
        self.timeline.append((time.perf_counter() - self._t0, self.index, v))

    def _supervise(self) -> None:
        while True:
            ev = self._events.get()
            if ev[0] == "stop":
                return
            try:
                if ev[0] == "turn":
                    self._on_turn(*ev[1:])
                elif ev[0] == "ready":
                    self._on_ready(*ev[1:])
                else:
                    self._on_died(*ev[1:])
            except Exception:  # the supervisor must outlive any one event
                log.exception("replica %d: supervisor event %s failed", self.index, ev[0])

    def _on_ready(self, inc: int, f: Future[Any]) -> None:
        if f.exception() is not None:
            return  # it died while starting: the wait_forever call reports it
        with self._cv:
            if inc != self._inc or self._closed:
                return
            self.info = dict(f.result())
            self._ready = True
            if self._t_death is not None:
                dt = time.perf_counter() - self._t_death
                self._faults["recover_s_last"] = dt
                self._faults["recover_s_max"] = max(self._faults["recover_s_max"], dt)
                self._t_death = None
            self._cv.notify_all()

    def _on_died(self, inc: int, f: Future[Any]) -> None:
        from ray.exceptions import RayActorError

        exc = f.exception()
        if isinstance(exc, RayActorError):
            with self._cv:
                self._death(inc, exc)

    def _death(self, inc: int, exc: BaseException) -> None:
        """Incarnation ``inc`` died (lock held; once per incarnation): restart or give up."""
        if inc != self._inc or self._closed or self._dead:
            return
        self._faults["deaths"] += 1
        self.last_error = (
            f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"
        )
        self._t_death = time.perf_counter()
        self._ready = False
        for k in COUNTERS:  # the dead process's counters, as last seen
            self._base[k] += float(self._last_remote.get(k, 0.0))
        self._last_remote = {}
        if self._faults["restarts"] >= self.cfg.max_restarts:
            log.error("replica %d died (%s); no restarts left", self.index, type(exc).__name__)
            self._dead, self._actor = True, None
            self._cv.notify_all()
            return
        log.warning("replica %d died (%s); restarting it", self.index, type(exc).__name__)
        self._faults["restarts"] += 1
        self._inc += 1
        self._actor, version = self._spawn(self.index)
        if version != self._version:
            self._set_version(version)
        self._watch()
        self._cv.notify_all()

    def _on_turn(self, req: _Req, inc: int, f: Future[Any]) -> None:
        from ray.exceptions import RayActorError

        exc = f.exception()
        resolve: tuple[Future[TurnOutput], TurnOutput | BaseException] | None = None
        with self._cv:
            fut = req.future
            if fut is None or inc != req.turn_inc:
                return  # closed, or a stale result of a turn already resubmitted
            if exc is None:
                out: TurnOutput = f.result()
                req.ctx.extend(out.token_ids)
                req.future = None
                resolve = (fut, out)
            elif isinstance(exc, RayActorError):
                self._death(inc, exc)
                why = self._why_not_resubmit(req)
                if req.cancelled:
                    req.future = None
                    resolve = (fut, _cancelled(req.rid, self.index))
                elif why is None:
                    req.resubmits += 1
                    self._faults["turns_resubmitted"] += 1
                    self._send(req, None)  # the whole context, fresh, on the new incarnation
                else:
                    req.future = None
                    self._faults["turns_failed"] += 1
                    resolve = (
                        fut,
                        EngineError(
                            f"replica {self.index} died while request {req.rid!r} was "
                            f"generating ({type(exc).__name__}); not resubmitted: {why}"
                        ),
                    )
            else:
                req.future = None
                cause = _cause(exc)
                msg = str(cause) if isinstance(cause, EngineError) else repr(cause)
                resolve = (fut, EngineError(f"replica {self.index}: {msg}"))
        if resolve is not None:
            target, value = resolve
            if isinstance(value, BaseException):
                target.set_exception(value)
            else:
                target.set_result(value)

    def _why_not_resubmit(self, req: _Req) -> str | None:
        """Why the turn of ``req`` cannot be resubmitted after a death, or None."""
        if self._dead:
            return f"the replica cannot restart (ray.max_restarts={self.cfg.max_restarts} used)"
        if not self.cfg.resubmit:
            return "ray.resubmit is off"
        if req.resubmits >= self.cfg.max_resubmits:
            return f"resubmitted {req.resubmits} times already (ray.max_resubmits)"
        return None

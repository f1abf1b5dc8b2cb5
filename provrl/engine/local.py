"""The local PyTorch rollout engine: continuous batching, exact provenance, hot-load.

One background thread runs the scheduler; any number of agent-loop threads call
:meth:`LocalEngine.submit` / :meth:`~LocalEngine.submit_continue` and wait on futures.
This module holds that thread, the lock and the public API; the bookkeeping is in three
rooms of its own::

    scheduler.py   requests, KV slots, prefix reuse, the plan of each step  (no thread, no lock)
    hotload.py     keep / recompute / drain weight swaps
    audit.py       the KV-staleness audit

Each scheduler step::

    ┌ under the lock ───────────────────────────────────────────────────────────────┐
    │ KV-staleness audits (weights are still the version that sampled the tokens)   │
    │ hot-load at the head of the queue: keep / recompute now, drain when idle      │
    │ Scheduler.plan(): admit queued requests into free KV slots (evict idle caches │
    │   LRU; copy the longest shared prefix from a resident request: prefix cache), │
    │   pack the running requests into slots 0…B-1 (swap KV) and build the step:    │
    │   B decode rows (one token each) + prefill chunks (≤ prefill_chunk tokens)    │
    └───────────────────────────────────────────────────────────────────────────────┘
      forward (llama.py) → logits of the rows that sample → sample (sampling.py)
    ┌ under the lock ───────────────────────────────────────────────────────────────┐
    │ Scheduler.apply(): append tokens with their stamps; end turns on stop id /    │
    │   stop string / length / context / cancel; resolve their futures              │
    └───────────────────────────────────────────────────────────────────────────────┘

Every forward of the replica (sampling steps, recompute hot-loads, audits) runs here, on
the scheduler thread, while no other step runs.
"""

from __future__ import annotations

import itertools
import logging
import os
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future
from typing import Any

import numpy as np
import torch

from provrl.engine import audit, hotload
from provrl.engine.api import EngineError, HotLoadMode, HotLoadReport, TurnOutput
from provrl.engine.checks import check_continuation, check_ids, check_params, check_prompt
from provrl.engine.config import EngineConfig
from provrl.engine.fingerprint import fingerprint
from provrl.engine.hotload import HotLoad, read_weights
from provrl.engine.llama import KVCache, LlamaWeights, Rope, StepInputs, forward, mlp_block
from provrl.engine.sampling import behaviour_logprob, sample
from provrl.engine.scheduler import EngineCounters, Request, Scheduler
from provrl.models.chat import stop_token_ids
from provrl.models.loading import LoadedModel
from provrl.models.precision import resolve_dtype
from provrl.provenance import SamplingParams

__all__ = ["DTYPES", "LocalEngine", "read_weights"]

log = logging.getLogger(__name__)

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class LocalEngine:
    """A rollout engine replica over an HF Llama-family model (see the module docstring).

    The engine copies the model's weights once into its own fused layout, so the trainer
    may keep updating ``lm.model`` in place: new weights reach the engine only through
    :meth:`load_weights`, atomically, with a new version."""

    def __init__(
        self,
        lm: LoadedModel,
        cfg: EngineConfig | None = None,
        *,
        replica: int = 0,
        version: int = 0,
    ) -> None:
        self.cfg = cfg = cfg or EngineConfig()
        self.replica = replica
        self.tokenizer = lm.tokenizer
        self.name = lm.name
        self.dtype = resolve_dtype(cfg.dtype, cfg.device)  # auto: this device's fast dtype
        dtype = DTYPES[self.dtype]
        self.weights = LlamaWeights.from_hf(lm.model, cfg.device, dtype)
        self.shape = self.weights.shape
        max_pos = getattr(lm.model.config, "max_position_embeddings", cfg.max_context)
        if cfg.max_context > max_pos:
            raise EngineError(
                f"EngineConfig.max_context={cfg.max_context} exceeds the model's "
                f"max_position_embeddings={max_pos}"
            )
        self.rope = Rope.from_hf(lm.model, cfg.max_context, cfg.device, dtype)
        self._mlp: Callable[..., Any] = (
            torch.compile(mlp_block, dynamic=True) if cfg.compile else mlp_block
        )
        # slots 0 … max_seqs-1 are the scheduler's; slot max_seqs is the audit's scratch slot
        self.kv = KVCache(self.shape, cfg.max_seqs + 1, cfg.max_context, cfg.device, dtype,
                          release=cfg.kv_release, huge_pages=cfg.kv_huge_pages)  # fmt: skip
        eos_ids = frozenset(stop_token_ids(self.tokenizer)) if cfg.eos_stops else frozenset()
        self._seeds = np.random.SeedSequence(cfg.seed)
        self._ids = itertools.count()
        self._audit_rng = np.random.default_rng(cfg.seed + 1)

        self._cv = threading.Condition()
        self._counters = EngineCounters()
        self._sched = Scheduler(
            cfg,
            self.kv,
            self.tokenizer,
            eos_ids,
            self._counters,
            replica=replica,
            version=version,
            on_finish=self._maybe_audit,
        )
        self._hotloads: deque[HotLoad] = deque()
        self._audits: deque[audit.Audit] = deque()
        self._closed = False
        self._error: BaseException | None = None
        self._threads = cfg.threads
        """Intra-op threads the scheduler thread should run with (0: torch's default)."""
        self._threads_now = 0
        """The count the scheduler thread last set (0: not set by the engine)."""
        self._t0 = time.perf_counter()
        self._thread = threading.Thread(
            target=self._loop, name=f"provrl-engine-{replica}", daemon=True
        )
        self._thread.start()

    # ------------------------------------------------------------------ public API
    @property
    def version(self) -> int:
        return self._sched.version

    @property
    def eos_ids(self) -> frozenset[int]:
        """Stop ids added to every request (the tokenizer's EOS and ``<|im_end|>`` ids,
        unless ``EngineConfig.eos_stops`` is False); a turn they end is ``'eos'``."""
        return self._sched.eos_ids

    @eos_ids.setter
    def eos_ids(self, ids: frozenset[int]) -> None:
        self._sched.eos_ids = frozenset(ids)

    def submit(
        self,
        prompt_ids: Sequence[int],
        params: SamplingParams,
        *,
        request_id: str | None = None,
        on_token: Callable[[str, int], None] | None = None,
    ) -> Future[TurnOutput]:
        """Start a request: prefill ``prompt_ids`` and sample one turn. ``on_token(request_id,
        token_id)`` streams each sampled token (called on the scheduler thread: keep it
        short); the future resolves with the whole turn and its provenance."""
        ids = [int(i) for i in prompt_ids]
        rid = request_id if request_id is not None else f"r{self.replica}-{next(self._ids)}"
        V = self.shape.vocab_size
        check_params(rid, params, V)
        check_prompt(rid, ids, self.cfg.max_context, V)
        with self._cv:
            self._check_open()
            if rid in self._sched.requests:
                raise EngineError(f"request {rid!r}: this request id is already in use")
            seed = params.seed if params.seed is not None else self._seeds.spawn(1)[0]
            req = Request(rid, ids, np.random.default_rng(seed), params)
            self._sched.requests[rid] = req
            fut = self._sched.start_turn(req, params, on_token)
            self._cv.notify_all()
        return fut

    def submit_continue(
        self,
        request_id: str,
        extra_ids: Sequence[int],
        params: SamplingParams,
        on_token: Callable[[str, int], None] | None = None,
    ) -> Future[TurnOutput]:
        """Append ``extra_ids`` to an idle request and sample its next turn on the kept KV
        (only ``extra_ids`` and the last sampled token are prefilled)."""
        extra = [int(i) for i in extra_ids]
        check_params(request_id, params, self.shape.vocab_size)
        check_ids(request_id, extra, "extra_ids", self.shape.vocab_size)
        with self._cv:
            self._check_open()
            req = self._get(request_id)
            if req.state != "idle":
                raise EngineError(f"request {request_id!r}: its previous turn is still running")
            check_continuation(request_id, len(req.ids), len(extra), self.cfg.max_context)
            req.ids.extend(extra)
            req.params = params
            if params.seed is not None:
                req.rng = np.random.default_rng(params.seed)
            fut = self._sched.start_turn(req, params, on_token)
            self._cv.notify_all()
            return fut

    def cancel(self, request_id: str) -> None:
        with self._cv:
            self._sched.cancel(self._get(request_id))
            self._cv.notify_all()

    def release(self, request_id: str) -> None:
        with self._cv:
            self._sched.release(self._get(request_id))
            self._cv.notify_all()

    def load_weights(
        self,
        weights: Mapping[str, Any] | str | os.PathLike[str],
        version: int,
        mode: HotLoadMode = "keep",
    ) -> HotLoadReport:
        """Swap in new weights as ``version`` (> the current version).

        The file is read and every key and shape checked in the caller's thread; the
        scheduler then swaps between two steps (``keep``, ``recompute``) or after the
        in-flight turns finish (``drain``): :mod:`provrl.engine.hotload`. No token is ever
        sampled from a mix of versions: the copy happens while no step runs. Blocks until
        the swap is done; :meth:`load_weights_async` returns at once."""
        if threading.current_thread() is self._thread:
            raise EngineError(
                "load_weights: called on the scheduler thread (an on_token callback), where it "
                "would wait for itself; call load_weights_async there"
            )
        return self.load_weights_async(weights, version, mode).result()

    def load_weights_async(
        self,
        weights: Mapping[str, Any] | str | os.PathLike[str],
        version: int,
        mode: HotLoadMode = "keep",
    ) -> Future[HotLoadReport]:
        """Queue the swap of :meth:`load_weights` and return its future at once.

        Called from an ``on_token`` callback (the scheduler thread, between the sampling of
        a token and the next step) the swap lands at that token boundary: in ``keep`` and
        ``recompute`` mode every token sampled after the callback is sampled under
        ``version``, every one before under the old version — a swap in the middle of a turn,
        exactly where the caller chose (``provrl conformance``'s ``stamps`` check)."""
        if mode not in ("keep", "recompute", "drain"):
            raise EngineError(f"load_weights: mode {mode!r} is not keep, recompute or drain")
        t_call = time.perf_counter()
        sd, source = read_weights(weights)
        pairs = self.weights.match(sd, source)
        fut: Future[HotLoadReport] = Future()
        with self._cv:
            self._check_open()
            last = self._hotloads[-1].version if self._hotloads else self._sched.version
            if version <= last:
                raise EngineError(
                    f"load_weights: version {version} must be newer than version {last}"
                )
            alive = len(self._sched.requests)  # generating, queued or between turns
            self._hotloads.append(HotLoad(pairs, int(version), mode, fut, t_call, alive))
            self._cv.notify_all()
        return fut

    def set_threads(self, n: int) -> None:
        """Run every forward from the next scheduler step on with ``n`` torch intra-op
        threads (a step already running keeps its count). The asynchronous RL loop lends
        the engine the learner's cores while the learner waits for a batch and takes them
        back when a step starts (``pipeline.loop.lend_cores``)."""
        if n < 1:
            raise EngineError(f"set_threads: n must be >= 1, got {n}")
        with self._cv:
            self._threads = n
            self._cv.notify_all()

    def stats(self) -> dict[str, float]:
        """The counters (:class:`~provrl.engine.scheduler.EngineCounters`) and gauges."""
        with self._cv:
            c = self._counters.as_dict()
            sched = self._sched
            states = [r.state for r in sched.requests.values()]
            elapsed = time.perf_counter() - self._t0
            n = c["kv_staleness_samples"]
            c.update(
                version=float(sched.version),
                replica=float(self.replica),
                active=float(states.count("active")),
                queued=float(states.count("queued")),
                idle=float(states.count("idle")),
                slots_used=float(len(sched.resident())),
                hotloads_pending=float(len(self._hotloads)),
                threads=float(self._threads_now),  # 0: never set (torch's default)
                tokens_per_s=c["tokens_generated"] / max(elapsed, 1e-9),
                busy_tokens_per_s=c["tokens_generated"] / max(c["busy_s"], 1e-9),
                kv_staleness_mean_abs=c["kv_staleness_sum_abs"] / n if n else float("nan"),
            )
        return c

    @property
    def weights_dtype(self) -> torch.dtype:
        """The dtype the engine computes in (what a publisher casts to when it
        fingerprints the weights it sends)."""
        return DTYPES[self.dtype]

    def weights_fingerprint(self) -> dict[str, str]:
        """HF parameter name → sha256 of the tensor this replica computes with
        (:mod:`provrl.engine.fingerprint`), read while no step or hot-load runs."""
        with self._cv:
            return fingerprint(self.weights.targets())

    def wait_idle(self, timeout: float | None = None) -> bool:
        """Block until no turn is queued or generating and no audit or hot-load is pending
        (True), or until ``timeout`` seconds passed (False)."""
        with self._cv:
            return self._cv.wait_for(
                lambda: self._error is not None or self._closed or not self._has_work(),
                timeout,
            )

    def load(self) -> int:
        """Turns generating or waiting for a slot (the router's placement signal)."""
        with self._cv:
            return sum(r.state != "idle" for r in self._sched.requests.values())

    def close(self) -> None:
        with self._cv:
            self._closed = True
            self._cv.notify_all()
        if threading.current_thread() is not self._thread:
            self._thread.join()
        with self._cv:
            self._fail_all(EngineError("engine closed"))

    def __enter__(self) -> LocalEngine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ validation
    def _check_open(self) -> None:
        if self._error is not None:
            raise EngineError(f"engine replica {self.replica} failed: {self._error!r}")
        if self._closed:
            raise EngineError(f"engine replica {self.replica} is closed")

    def _get(self, rid: str) -> Request:
        req = self._sched.requests.get(rid)
        if req is None or req.released:
            raise EngineError(f"unknown request id {rid!r} (never submitted, or released)")
        return req

    def _fail_all(self, err: BaseException) -> None:
        self._sched.fail_all(err if isinstance(err, EngineError) else EngineError(repr(err)))
        for h in self._hotloads:
            if not h.future.done():
                h.future.set_exception(EngineError(f"engine stopped before hot-load: {err!r}"))
        self._hotloads.clear()

    # ------------------------------------------------------------------ scheduler thread
    def _has_work(self) -> bool:
        return bool(self._closed or self._hotloads or self._audits or self._sched.has_work())

    def _forward(self, inputs: StepInputs) -> torch.Tensor:
        """One forward of this replica's weights over its KV cache → fp32 logits [R, V]."""
        return forward(self.weights, self.kv, self.rope, inputs, self._mlp)

    def _apply_threads(self) -> None:
        """Set the scheduler thread's torch intra-op count to the one asked for (lock held).
        The count is per calling thread (an OpenMP ICV): it is set here, on the thread that
        runs every forward, so the callers' threads keep theirs."""
        if self._threads and self._threads != self._threads_now:
            torch.set_num_threads(self._threads)
            self._threads_now = self._threads

    def _loop(self) -> None:
        sched = self._sched
        try:
            while True:
                with self._cv:
                    self._cv.wait_for(self._has_work)
                    if self._closed:
                        return
                    self._apply_threads()
                    self._run_audits()
                    self._hot_load()
                    draining = bool(self._hotloads) and self._hotloads[0].mode == "drain"
                    plan = sched.plan(admit=not draining)
                    if plan is None:
                        self._cv.notify_all()  # wake wait_idle()
                        if self._has_work():  # nothing runnable yet: do not spin
                            self._cv.wait(0.01)
                        continue
                t0 = time.perf_counter()
                logits = self._forward(plan.inputs)  # [R, V]
                temperature, top_k, top_p = plan.params
                out = sample(logits.cpu(), temperature, top_k, top_p, plan.u)
                with self._cv:
                    sched.apply(plan, out.token.tolist(), out.logprob.tolist(),
                                out.kept_mass.tolist())  # fmt: skip
                    self._counters.busy_s += time.perf_counter() - t0
                    self._cv.notify_all()
        except BaseException as e:  # never leave a caller waiting forever
            log.exception("engine replica %d failed", self.replica)
            with self._cv:
                self._error = e
                self._fail_all(e)

    def _hot_load(self) -> None:
        """Perform the hot-load at the head of the queue if it can run now (lock held)."""
        if not self._hotloads or not hotload.can_run(self._hotloads[0], self._sched):
            return  # drain: keep stepping the in-flight turns under the old weights
        h = self._hotloads.popleft()
        h.future.set_result(hotload.swap(h, self.weights, self._sched, self._forward))

    def _maybe_audit(self, req: Request) -> None:
        """Queue a staleness audit of a finished turn (lock held; :mod:`provrl.engine.audit`)."""
        a = audit.choose(req, self._sched.version, self.cfg, self._audit_rng)
        if a is not None:
            self._audits.append(a)

    def _run_audits(self) -> None:
        """log q_v(a_t | h_t) recomputed from scratch (fresh KV, weights v) vs recorded."""
        while self._audits:
            a = self._audits.popleft()
            if a.version != self._sched.version:
                continue  # the weights moved on: v_t can no longer be recomputed here
            step = audit.audit_step(a, self.cfg.max_seqs)
            logits = self._forward(step.build(self.cfg.device))  # [k, V]
            self.kv.trim(self.cfg.max_seqs, 0)
            fresh = behaviour_logprob(logits.cpu(), *audit.sampling_inputs(a)).logprob
            audit.record(self._counters, fresh, a.recorded)

"""The local PyTorch rollout engine: continuous batching, exact provenance, hot-load.

One background thread runs the scheduler; any number of agent-loop threads call
:meth:`LocalEngine.submit` / :meth:`~LocalEngine.submit_continue` and wait on futures.
Each scheduler step::

    ┌ under the lock ───────────────────────────────────────────────────────────────┐
    │ KV-staleness audits (weights are still the version that sampled the tokens)   │
    │ hot-load at the head of the queue: keep / recompute now, drain when idle      │
    │ admit queued requests into free KV slots (evict idle caches LRU; copy the     │
    │   longest shared prefix from a resident request: prefix cache)                │
    │ pack the running requests into slots 0…B-1 (swap KV) and build the step:      │
    │   B decode rows (one token each) + prefill chunks (≤ prefill_chunk tokens)    │
    └───────────────────────────────────────────────────────────────────────────────┘
      forward (llama.py) → logits of the rows that sample → sample (sampling.py)
    ┌ under the lock ───────────────────────────────────────────────────────────────┐
    │ append tokens with their stamps; end turns on stop id / stop string / length /│
    │   context / cancel; resolve their futures                                     │
    └───────────────────────────────────────────────────────────────────────────────┘

A request owns ``ids`` (everything in its context) and a slot whose KV is valid for
``ids[:n_cached]``. It needs ``ids[n_cached:]`` fed before it can sample: one token for a
decode row, more for a prefill (a new prompt, a continuation's tool output, or a KV that
was evicted or reset). Weight versions only increase, so the KV of a slot is ordered by
version and its oldest version ``kv_min`` is the version of position 0.
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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch

from provrl.engine.api import EngineError, HotLoadMode, HotLoadReport, TurnOutput
from provrl.engine.config import EngineConfig
from provrl.engine.llama import (
    Chunk,
    KVCache,
    LlamaWeights,
    Rope,
    StepInputs,
    forward,
    mlp_block,
)
from provrl.engine.sampling import behaviour_logprob, sample
from provrl.engine.stops import StopMatcher
from provrl.failpoints import failpoint
from provrl.provenance import SamplingParams

log = logging.getLogger(__name__)

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}

State = Literal["queued", "active", "idle"]


@dataclass(eq=False)
class _Request:
    rid: str
    ids: list[int]
    rng: np.random.Generator
    params: SamplingParams
    state: State = "queued"
    """queued: a turn waits for a KV slot · active: a turn holds a slot and generates ·
    idle: between turns (the KV is kept unless evicted)."""
    slot: int | None = None
    n_cached: int = 0
    kv_min: int = -1
    # the current turn
    future: Future[TurnOutput] | None = None
    turn_start: int = 0
    tokens: list[int] = field(default_factory=list)
    logprob: list[float] = field(default_factory=list)
    kept_mass: list[float] = field(default_factory=list)
    version: list[int] = field(default_factory=list)
    kv_lo: list[int] = field(default_factory=list)
    stop_ids: frozenset[int] = frozenset()
    stops: StopMatcher | None = None
    on_token: Callable[[str, int], None] | None = None
    cancelled: bool = False
    released: bool = False
    t_submit: float = 0.0
    t_start: float = 0.0
    t_first: float = 0.0
    last_used: float = 0.0

    @property
    def pending(self) -> int:
        """Tokens to feed before the next token can be sampled."""
        return len(self.ids) - self.n_cached


@dataclass
class _HotLoad:
    pairs: list[tuple[torch.Tensor, torch.Tensor]]
    version: int
    mode: HotLoadMode
    future: Future[HotLoadReport]
    t_call: float
    in_flight: int
    """Requests the engine held when load_weights was called."""


@dataclass
class _Audit:
    """Recompute a finished turn's stale-KV tokens from scratch under the same version."""

    ids: list[int]
    positions: list[int]  # indices into ids of the audited sampled tokens
    recorded: list[float]
    params: SamplingParams
    version: int


@dataclass
class _StepBuilder:
    """The index lists of one forward step, grown row by row (decode rows first)."""

    tokens: list[int] = field(default_factory=list)
    positions: list[int] = field(default_factory=list)
    slots: list[int] = field(default_factory=list)
    chunks: list[Chunk] = field(default_factory=list)
    logit_rows: list[int] = field(default_factory=list)

    def decode(self, slot: int, token: int, position: int) -> None:
        """One decode row that samples (call before any :meth:`chunk`)."""
        self.logit_rows.append(len(self.tokens))
        self.tokens.append(token)
        self.positions.append(position)
        self.slots.append(slot)

    def chunk(self, slot: int, ids: list[int], start: int, n: int) -> None:
        """Prefill ``ids[start:start+n]`` into ``slot`` at positions ``start … start+n-1``."""
        self.chunks.append(Chunk(slot, start, len(self.tokens), n))
        self.tokens.extend(ids[start : start + n])
        self.positions.extend(range(start, start + n))
        self.slots.extend([slot] * n)

    def build(self, device: str, n_decode: int = 0) -> StepInputs:
        """The lists as int64 tensors on ``device``; rows 0 … n_decode-1 are decode rows."""

        def t(xs: list[int]) -> torch.Tensor:
            return torch.tensor(xs, dtype=torch.int64, device=device)

        return StepInputs(
            t(self.tokens),
            t(self.positions),
            t(self.slots),
            n_decode,
            self.chunks,
            t(self.logit_rows),
        )


@dataclass
class _Plan:
    inputs: StepInputs
    rows: list[_Request]  # the request of each logit row
    fed: list[tuple[_Request, int]]  # (request, tokens fed this step)
    params: tuple[torch.Tensor, torch.Tensor, torch.Tensor]  # temperature, top_k, top_p
    u: torch.Tensor


def read_weights(weights: Mapping[str, Any] | str | os.PathLike[str]) -> tuple[Mapping[str, Any], str]:  # fmt: skip
    """A state dict from a mapping, a ``.safetensors`` file, or a directory of them."""
    if isinstance(weights, Mapping):
        return weights, "state dict"
    from provrl.models.checkpoint import CheckpointError, load_state_dict

    path = Path(weights)
    files = sorted(path.glob("*.safetensors")) if path.is_dir() else [path]
    if not files:
        raise EngineError(f"{path}: no *.safetensors weights in this directory")
    sd: dict[str, Any] = {}
    try:
        for f in files:
            sd.update(load_state_dict(f))
    except CheckpointError as e:
        raise EngineError(str(e)) from e
    return sd, str(path)


class LocalEngine:
    """A rollout engine replica over an HF Llama-family model (see the module docstring).

    The engine copies the model's weights once into its own fused layout, so the trainer
    may keep updating ``lm.model`` in place: new weights reach the engine only through
    :meth:`load_weights`, atomically, with a new version."""

    def __init__(
        self,
        lm: Any,
        cfg: EngineConfig | None = None,
        *,
        replica: int = 0,
        version: int = 0,
    ) -> None:
        self.cfg = cfg = cfg or EngineConfig()
        self.replica = replica
        self.tokenizer = lm.tokenizer
        self.name = lm.name
        dtype = DTYPES[cfg.dtype]
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
        # slot max_seqs is the audit's scratch slot
        self.kv = KVCache(self.shape, cfg.max_seqs + 1, cfg.max_context, cfg.device, dtype)
        from provrl.models.chat import stop_token_ids

        self.eos_ids = frozenset(stop_token_ids(self.tokenizer)) if cfg.eos_stops else frozenset()
        self._version = version
        self._seeds = np.random.SeedSequence(cfg.seed)
        self._ids = itertools.count()
        self._audit_rng = np.random.default_rng(cfg.seed + 1)

        self._cv = threading.Condition()
        self._requests: dict[str, _Request] = {}
        self._queue: deque[_Request] = deque()
        self._slot_owner: list[_Request | None] = [None] * cfg.max_seqs
        self._hotloads: deque[_HotLoad] = deque()
        self._audits: deque[_Audit] = deque()
        self._closed = False
        self._error: BaseException | None = None
        self._drain_started: float | None = None
        self._counters: dict[str, float] = dict.fromkeys(
            (
                "steps",
                "tokens_generated",
                "prefill_tokens",
                "prefix_hit_tokens",
                "evictions",
                "hotloads",
                "recomputed_tokens",
                "turns_finished",
                "kv_staleness_samples",
                "kv_staleness_sum_abs",
                "kv_staleness_max_abs",
                "kv_staleness_support_misses",
                "busy_s",
            ),
            0.0,
        )
        self._t0 = time.perf_counter()
        self._thread = threading.Thread(
            target=self._loop, name=f"provrl-engine-{replica}", daemon=True
        )
        self._thread.start()

    # ------------------------------------------------------------------ public API
    @property
    def version(self) -> int:
        return self._version

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
        self._check_params(rid, params)
        if not ids:
            raise EngineError(f"request {rid!r}: empty prompt")
        self._check_ids(rid, ids, "prompt_ids")
        if len(ids) >= self.cfg.max_context:
            raise EngineError(
                f"request {rid!r}: prompt has {len(ids)} tokens; max_context is "
                f"{self.cfg.max_context} (no room to generate)"
            )
        with self._cv:
            self._check_open()
            if rid in self._requests:
                raise EngineError(f"request {rid!r}: this request id is already in use")
            seed = params.seed if params.seed is not None else self._seeds.spawn(1)[0]
            req = _Request(rid, ids, np.random.default_rng(seed), params)
            self._requests[rid] = req
            fut = self._start_turn(req, params, on_token)
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
        self._check_params(request_id, params)
        self._check_ids(request_id, extra, "extra_ids")
        with self._cv:
            self._check_open()
            req = self._get(request_id)
            if req.state != "idle":
                raise EngineError(f"request {request_id!r}: its previous turn is still running")
            if len(req.ids) + len(extra) >= self.cfg.max_context:
                raise EngineError(
                    f"request {request_id!r}: context would be {len(req.ids) + len(extra)} "
                    f"tokens; max_context is {self.cfg.max_context} (no room to generate)"
                )
            req.ids.extend(extra)
            req.params = params
            if params.seed is not None:
                req.rng = np.random.default_rng(params.seed)
            return self._start_turn(req, params, on_token)

    def cancel(self, request_id: str) -> None:
        with self._cv:
            req = self._get(request_id)
            if req.state == "queued":
                self._queue.remove(req)
                self._finish(req, "cancelled")
            elif req.state == "active":
                req.cancelled = True
            self._cv.notify_all()

    def release(self, request_id: str) -> None:
        with self._cv:
            req = self._get(request_id)
            if req.state == "active":
                req.cancelled = req.released = True  # dropped at the next step boundary
            else:
                if req.state == "queued":
                    self._queue.remove(req)
                    self._finish(req, "cancelled")
                self._drop(req)
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
        in-flight turns finish (``drain``). No token is ever sampled from a mix of
        versions: the copy happens while no step runs."""
        if mode not in ("keep", "recompute", "drain"):
            raise EngineError(f"load_weights: mode {mode!r} is not keep, recompute or drain")
        t_call = time.perf_counter()
        sd, source = read_weights(weights)
        pairs = self.weights.match(sd, source)
        fut: Future[HotLoadReport] = Future()
        with self._cv:
            self._check_open()
            last = self._hotloads[-1].version if self._hotloads else self._version
            if version <= last:
                raise EngineError(
                    f"load_weights: version {version} must be newer than version {last}"
                )
            alive = len(self._requests)  # generating, queued or between turns
            self._hotloads.append(_HotLoad(pairs, int(version), mode, fut, t_call, alive))
            self._cv.notify_all()
        return fut.result()

    def stats(self) -> dict[str, float]:
        with self._cv:
            c = dict(self._counters)
            states = [r.state for r in self._requests.values()]
            elapsed = time.perf_counter() - self._t0
            n = c["kv_staleness_samples"]
            c.update(
                version=float(self._version),
                replica=float(self.replica),
                active=float(states.count("active")),
                queued=float(states.count("queued")),
                idle=float(states.count("idle")),
                slots_used=float(sum(o is not None for o in self._slot_owner)),
                hotloads_pending=float(len(self._hotloads)),
                tokens_per_s=c["tokens_generated"] / max(elapsed, 1e-9),
                busy_tokens_per_s=c["tokens_generated"] / max(c["busy_s"], 1e-9),
                kv_staleness_mean_abs=c["kv_staleness_sum_abs"] / n if n else float("nan"),
            )
        return c

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
            return sum(r.state != "idle" for r in self._requests.values())

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
    def _check_params(self, rid: str, p: SamplingParams) -> None:
        if p.max_new_tokens <= 0:
            raise EngineError(f"request {rid!r}: max_new_tokens={p.max_new_tokens} must be ≥ 1")
        if not p.temperature >= 0:
            raise EngineError(f"request {rid!r}: temperature={p.temperature} must be ≥ 0")
        if not 0 < p.top_p <= 1:
            raise EngineError(f"request {rid!r}: top_p={p.top_p} must be in (0, 1]")
        if p.top_k < 0:
            raise EngineError(f"request {rid!r}: top_k={p.top_k} must be ≥ 0")
        self._check_ids(rid, list(p.stop_token_ids), "stop_token_ids")

    def _check_ids(self, rid: str, ids: list[int], what: str) -> None:
        V = self.shape.vocab_size
        for i, t in enumerate(ids):
            if not 0 <= t < V:
                raise EngineError(
                    f"request {rid!r}: {what}[{i}] = {t} is outside the vocabulary [0, {V})"
                )

    def _check_open(self) -> None:
        if self._error is not None:
            raise EngineError(f"engine replica {self.replica} failed: {self._error!r}")
        if self._closed:
            raise EngineError(f"engine replica {self.replica} is closed")

    def _get(self, rid: str) -> _Request:
        req = self._requests.get(rid)
        if req is None or req.released:
            raise EngineError(f"unknown request id {rid!r} (never submitted, or released)")
        return req

    # ------------------------------------------------------------------ request life
    def _start_turn(
        self,
        req: _Request,
        p: SamplingParams,
        on_token: Callable[[str, int], None] | None = None,
    ) -> Future[TurnOutput]:
        """Begin a turn (lock held): the request queues for a slot."""
        fut: Future[TurnOutput] = Future()
        req.future = fut
        req.on_token = on_token
        req.turn_start = len(req.ids)
        req.tokens, req.logprob, req.kept_mass, req.version, req.kv_lo = [], [], [], [], []
        req.stop_ids = frozenset(p.stop_token_ids) | self.eos_ids
        req.stops = StopMatcher(self.tokenizer, p.stop) if p.stop else None
        req.cancelled = False
        req.t_submit = time.perf_counter()
        req.t_start = req.t_first = 0.0
        req.state = "queued"
        self._queue.append(req)
        self._cv.notify_all()
        return fut

    def _finish(self, req: _Request, reason: Any, match: str | int | None = None) -> None:
        """End the current turn (lock held) and resolve its future."""
        now = time.perf_counter()
        out = TurnOutput(
            request_id=req.rid,
            token_ids=list(req.tokens),
            logprob=np.asarray(req.logprob, np.float32),
            kept_mass=np.asarray(req.kept_mass, np.float32),
            version=np.asarray(req.version, np.int32),
            kv_min=np.asarray(req.kv_lo, np.int32),
            kv_max=np.asarray(req.version, np.int32),
            replica=self.replica,
            finish_reason=reason,
            stop_match=match,
            timings={
                "queue": (req.t_start or now) - req.t_submit,
                "prefill": (req.t_first - req.t_start) if req.t_first else 0.0,
                "decode": (now - req.t_first) if req.t_first else 0.0,
            },
        )
        req.state = "idle"
        req.last_used = now
        self._counters["turns_finished"] += 1
        fut, req.future = req.future, None
        self._maybe_audit(req)
        if fut is not None and not fut.done():
            fut.set_result(out)

    def _drop(self, req: _Request) -> None:
        """Forget a request and free its slot (lock held)."""
        if req.slot is not None:
            self._slot_owner[req.slot] = None
            req.slot = None
        req.released = True
        self._requests.pop(req.rid, None)

    def _evict(self, req: _Request) -> None:
        """Free an idle request's slot; its next turn re-prefills its whole context."""
        assert req.slot is not None
        self._slot_owner[req.slot] = None
        req.slot = None
        req.n_cached = 0
        self._counters["evictions"] += 1

    def _fail_all(self, err: BaseException) -> None:
        for req in list(self._requests.values()):
            if req.future is not None and not req.future.done():
                req.future.set_exception(
                    err if isinstance(err, EngineError) else EngineError(repr(err))
                )
        for h in self._hotloads:
            if not h.future.done():
                h.future.set_exception(EngineError(f"engine stopped before hot-load: {err!r}"))
        self._hotloads.clear()

    # ------------------------------------------------------------------ scheduler
    def _has_work(self) -> bool:
        return bool(
            self._closed
            or self._hotloads
            or self._audits
            or self._queue
            or any(r.state == "active" for r in self._requests.values())
        )

    def _loop(self) -> None:
        # torch's intra-op thread count is per calling thread (an OpenMP ICV): set it here, on
        # the scheduler thread that runs every forward, so the caller's threads keep theirs
        if self.cfg.threads:
            torch.set_num_threads(self.cfg.threads)
        try:
            while True:
                with self._cv:
                    self._cv.wait_for(self._has_work)
                    if self._closed:
                        return
                    self._run_audits()
                    self._hot_load()
                    plan = self._plan()
                    if plan is None:
                        self._cv.notify_all()  # wake wait_idle()
                        if self._has_work():  # nothing runnable yet: do not spin
                            self._cv.wait(0.01)
                        continue
                t0 = time.perf_counter()
                logits = forward(self.weights, self.kv, self.rope, plan.inputs, self._mlp)
                temperature, top_k, top_p = plan.params
                out = sample(logits.cpu(), temperature, top_k, top_p, plan.u)
                with self._cv:
                    self._apply(plan, out.token.tolist(), out.logprob.tolist(),
                                out.kept_mass.tolist())  # fmt: skip
                    self._counters["busy_s"] += time.perf_counter() - t0
                    self._cv.notify_all()
        except BaseException as e:  # never leave a caller waiting forever
            log.exception("engine replica %d failed", self.replica)
            with self._cv:
                self._error = e
                self._fail_all(e)

    def _free_slot(self) -> int | None:
        """A free slot, else the slot of the least recently used idle request (evicted)."""
        for s, owner in enumerate(self._slot_owner):
            if owner is None:
                return s
        idle = [r for r in self._slot_owner if r is not None and r.state == "idle"]
        if not idle:
            return None
        victim = min(idle, key=lambda r: r.last_used)
        slot = victim.slot
        self._evict(victim)
        return slot

    def _prefix_donor(
        self, req: _Request, ahead: set[_Request]
    ) -> tuple[_Request | None, int, int]:
        """(donor, usable, potential): the resident request whose cached KV shares the
        longest prefix with ``req.ids`` (``usable`` tokens), and the longest prefix shared
        with a request that is computing it right now (``ahead``: prefilling this step or
        part-way through its prefill), reachable by waiting a step."""
        best, usable, potential = None, 0, 0
        limit = len(req.ids) - 1  # at least one token must be fed to get logits
        m = self.cfg.prefix_cache_min_tokens
        head = req.ids[:m]
        for other in self._slot_owner:
            if other is None or other is req or other.ids[:m] != head:
                continue
            n = _common_prefix(req.ids, other.ids, limit)
            if min(n, other.n_cached) > usable:
                best, usable = other, min(n, other.n_cached)
            if other in ahead or (other.state == "active" and 0 < other.n_cached < n):
                potential = max(potential, n)
        return best, usable, potential

    def _admit(self) -> None:
        """Start queued turns: continuations that kept their KV slot at once, the others
        FIFO while a slot is free (or an idle cache can be evicted)."""
        no_slot = False
        for req in list(self._queue):
            if req.slot is None:
                s = None if no_slot else self._free_slot()
                if s is None:
                    no_slot = True
                    continue
                req.slot, req.n_cached = s, 0
                self._slot_owner[s] = req
            self._queue.remove(req)
            req.state = "active"
            req.t_start = time.perf_counter()

    def _take_prefix(self, req: _Request, ahead: set[_Request]) -> bool:
        """For a request with an empty KV: copy a shared prefix (True), or wait a step for
        a request that is computing that prefix right now (False)."""
        m = self.cfg.prefix_cache_min_tokens
        if not self.cfg.prefix_cache or req.n_cached or len(req.ids) <= m:
            return True
        donor, usable, potential = self._prefix_donor(req, ahead)
        if potential - usable >= m:
            return False
        if donor is not None and usable >= m:
            assert donor.slot is not None and req.slot is not None
            self.kv.move(donor.slot, req.slot, usable)
            req.n_cached = usable
            req.kv_min = donor.kv_min
            self._counters["prefix_hit_tokens"] += usable
        return True

    def _pack(self, decode: list[_Request]) -> None:
        """Move the decode requests into slots 0…B-1 (swapping KV with whatever is there)."""
        B = len(decode)
        misplaced = [r for r in decode if r.slot is not None and r.slot >= B]
        if not misplaced:
            return
        in_front = {r.slot for r in decode if r.slot is not None and r.slot < B}
        holes = [s for s in range(B) if s not in in_front]
        for r, s in zip(misplaced, holes, strict=True):
            assert r.slot is not None
            other = self._slot_owner[s]
            if other is None:
                self.kv.move(r.slot, s, r.n_cached)
                self._slot_owner[r.slot] = None
            else:
                self.kv.swap(r.slot, s, r.n_cached, other.n_cached)
                self._slot_owner[r.slot] = other
                other.slot = r.slot
            self._slot_owner[s] = r
            r.slot = s

    def _plan(self) -> _Plan | None:
        """Admit, pack and build the next step (lock held)."""
        for req in [r for r in self._requests.values() if r.state == "active" and r.cancelled]:
            self._finish(req, "cancelled")
            if req.released:
                self._drop(req)
        if not (self._hotloads and self._hotloads[0].mode == "drain"):
            self._admit()
        active = [r for r in self._requests.values() if r.state == "active"]
        if not active:
            return None
        decode = [r for r in active if r.pending == 1 and r.n_cached > 0]
        self._pack(decode)
        decode.sort(key=lambda r: r.slot if r.slot is not None else -1)
        budget = self.cfg.prefill_chunk
        chunks: list[tuple[_Request, int]] = []
        ahead: set[_Request] = set()
        for req in active:
            if budget <= 0:
                break
            if req.pending == 1 and req.n_cached > 0:
                continue
            if not self._take_prefix(req, ahead):
                continue
            ahead.add(req)
            n = min(req.pending, budget)
            chunks.append((req, n))
            budget -= n
        if not decode and not chunks:
            return None
        step = _StepBuilder()
        rows: list[_Request] = []
        fed: list[tuple[_Request, int]] = []
        for req in decode:
            assert req.slot is not None
            step.decode(req.slot, req.ids[-1], req.n_cached)
            rows.append(req)
            fed.append((req, 1))
        for req, n in chunks:
            assert req.slot is not None
            if req.n_cached == 0:
                req.kv_min = self._version
            step.chunk(req.slot, req.ids, req.n_cached, n)
            fed.append((req, n))
            if n == req.pending:
                step.logit_rows.append(len(step.tokens) - 1)
                rows.append(req)
        inputs = step.build(self.cfg.device, len(decode))
        params = (
            torch.tensor([r.params.temperature for r in rows], dtype=torch.float32),
            torch.tensor([r.params.top_k for r in rows], dtype=torch.int64),
            # float64, as support_excluded_mass uses: float32(0.9) = 0.89999998 < p
            torch.tensor([r.params.top_p for r in rows], dtype=torch.float64),
        )
        u = torch.tensor([r.rng.random() for r in rows], dtype=torch.float64)
        self._counters["prefill_tokens"] += sum(n for _, n in chunks)
        return _Plan(inputs, rows, fed, params, u)

    def _apply(self, plan: _Plan, tokens: list[int], logprob: list[float],
               kept: list[float]) -> None:  # fmt: skip
        """Record the sampled tokens and end the turns that are done (lock held)."""
        now = time.perf_counter()
        self._counters["steps"] += 1
        for req, n in plan.fed:
            req.n_cached += n
        v = self._version
        for req, a, lp, m in zip(plan.rows, tokens, logprob, kept, strict=True):
            if req.state != "active":
                continue
            if not req.t_first:
                req.t_first = now
            req.ids.append(a)
            req.tokens.append(a)
            req.logprob.append(lp)
            req.kept_mass.append(m)
            req.version.append(v)
            req.kv_lo.append(req.kv_min)
            self._counters["tokens_generated"] += 1
            if req.on_token is not None:
                req.on_token(req.rid, a)
            if a in req.stop_ids:
                self._finish(req, "eos" if a in self.eos_ids else "stop", a)
            elif req.stops is not None and (s := req.stops.match(req.tokens)) is not None:
                self._finish(req, "stop", s)
            elif len(req.tokens) >= req.params.max_new_tokens:
                self._finish(req, "length")
            elif len(req.ids) >= self.cfg.max_context:
                self._finish(req, "context")
            elif req.cancelled:
                self._finish(req, "cancelled")
            if req.released and req.state == "idle":
                self._drop(req)

    # ------------------------------------------------------------------ hot-load
    def _hot_load(self) -> None:
        """Perform the hot-load at the head of the queue if it can run now (lock held)."""
        if not self._hotloads:
            return
        h = self._hotloads[0]
        active = sum(r.state == "active" for r in self._requests.values())
        if h.mode == "drain" and active:
            return  # keep stepping the in-flight turns under the old weights
        self._hotloads.popleft()
        t0 = time.perf_counter()
        old = self._version
        failpoint("engine.hotload")  # crash tests: a kill while a hot-load is in flight
        self.weights.copy_pairs_(h.pairs)
        self._version = h.version
        recomputed = 0
        if h.mode == "recompute":
            recomputed = self._recompute_all()
        elif h.mode == "drain":
            for req in list(self._slot_owner):  # nothing is active now: idle or queued
                if req is not None:
                    self._evict(req)  # reset the caches: no old KV survives the swap
        t1 = time.perf_counter()
        self._counters["hotloads"] += 1
        self._counters["recomputed_tokens"] += recomputed
        since = h.t_call if h.mode == "drain" else t0
        report = HotLoadReport(h.mode, old, h.version, (t1 - since) * 1e3, h.in_flight, recomputed)
        h.future.set_result(report)

    def _recompute_all(self) -> int:
        """Re-prefill every resident KV under the current weights (lock held)."""
        todo = [r for r in self._slot_owner if r is not None and r.n_cached > 0]
        total = sum(r.n_cached for r in todo)
        queue = deque((r, 0) for r in todo)
        while queue:
            budget = max(self.cfg.prefill_chunk, 1)
            step = _StepBuilder()
            while queue and budget > 0:
                r, start = queue.popleft()
                n = min(r.n_cached - start, budget)
                assert r.slot is not None
                step.chunk(r.slot, r.ids, start, n)
                budget -= n
                if start + n < r.n_cached:
                    queue.appendleft((r, start + n))
            forward(self.weights, self.kv, self.rope, step.build(self.cfg.device), self._mlp)
        for r in todo:
            r.kv_min = self._version
        return total

    # ------------------------------------------------------------------ KV audit
    def _maybe_audit(self, req: _Request) -> None:
        """Queue a staleness audit of a finished turn's tokens that attended to old KV."""
        if self.cfg.audit_fraction <= 0:
            return
        stale = [
            i
            for i, (v, lo) in enumerate(zip(req.version, req.kv_lo, strict=True))
            if lo < v == self._version
        ]
        if not stale or self._audit_rng.random() >= self.cfg.audit_fraction:
            return
        stale = stale[: self.cfg.audit_max_tokens]
        end = req.turn_start + len(req.tokens)
        self._audits.append(
            _Audit(
                ids=req.ids[:end],
                positions=[req.turn_start + i for i in stale],
                recorded=[req.logprob[i] for i in stale],
                params=req.params,
                version=self._version,
            )
        )

    def _run_audits(self) -> None:
        """log q_v(a_t | h_t) recomputed from scratch (fresh KV, weights v) vs recorded."""
        while self._audits:
            a = self._audits.popleft()
            if a.version != self._version:
                continue  # the weights moved on: v_t can no longer be recomputed here
            n = max(a.positions)  # tokens ids[:n] are fed; row t-1 predicts ids[t]
            step = _StepBuilder()
            step.chunk(self.cfg.max_seqs, a.ids, 0, n)
            step.logit_rows = [t - 1 for t in a.positions]
            logits = forward(
                self.weights, self.kv, self.rope, step.build(self.cfg.device), self._mlp
            )
            k = len(a.positions)
            fresh = behaviour_logprob(
                logits.cpu(),
                torch.tensor([a.ids[t] for t in a.positions]),
                torch.full((k,), a.params.temperature),
                torch.full((k,), a.params.top_k, dtype=torch.int64),
                torch.full((k,), a.params.top_p, dtype=torch.float64),
            ).logprob
            diff = (fresh.double() - torch.tensor(a.recorded, dtype=torch.float64)).abs()
            finite = diff[torch.isfinite(diff)]
            c = self._counters
            c["kv_staleness_support_misses"] += int((~torch.isfinite(diff)).sum())
            c["kv_staleness_samples"] += int(finite.numel())
            c["kv_staleness_sum_abs"] += float(finite.sum())
            if finite.numel():
                c["kv_staleness_max_abs"] = max(c["kv_staleness_max_abs"], float(finite.max()))


def _common_prefix(a: list[int], b: list[int], limit: int) -> int:
    """Length of the longest common prefix of a and b, at most ``limit``."""
    n = min(len(a), len(b), limit)
    if a[:n] == b[:n]:
        return n
    lo, hi = 0, n  # a[:lo] == b[:lo], a[:hi] != b[:hi]
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid
    return lo

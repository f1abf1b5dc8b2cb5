"""The engine's bookkeeping: requests, KV slots, prefix reuse, and the plan of each step.

Pure bookkeeping — no thread, no lock, no forward: :class:`Scheduler` is driven by
:class:`provrl.engine.local.LocalEngine` (which holds the lock around every call) and can be
unit-tested on its own. One scheduler step is::

    plan()   admit queued turns into free slots (evict idle caches LRU); copy the longest
             shared prefix from a resident request (prefix cache); pack the decode requests
             into slots 0…B-1; build the step: B decode rows + prefill chunks
    ── the engine runs the forward and samples the rows of the plan ──
    apply()  append each sampled token with its stamps; end turns on stop id / stop
             string / length / context / cancel; resolve their futures

A request owns ``ids`` (everything in its context) and a slot whose KV is valid for
``ids[:n_cached]``. It needs ``ids[n_cached:]`` fed before it can sample: one token for a
decode row, more for a prefill (a new prompt, a continuation's tool output, or a KV that
was evicted or reset). Weight versions only increase, so the KV of a slot is ordered by
version and its oldest version ``Request.kv_min`` is the version of position 0; each sampled
token records the value it had then (``Turn.kv_min``, returned as ``TurnOutput.kv_min``).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

import numpy as np
import torch

from provrl.engine.api import FinishReason, TurnOutput
from provrl.engine.config import EngineConfig
from provrl.engine.llama import Chunk, KVCache, StepInputs
from provrl.engine.stops import StopMatcher
from provrl.provenance import SamplingParams

State = Literal["queued", "active", "idle"]


@dataclass
class EngineCounters:
    """Cumulative counters of one engine replica (``LocalEngine.stats()`` returns them as
    floats, under these names, with the gauges next to them)."""

    steps: int = 0
    """Forward steps that sampled (recompute and audit forwards are not counted)."""
    tokens_generated: int = 0
    prefill_tokens: int = 0
    """Context tokens fed by prefill chunks (prompts, tool outputs, evicted KV)."""
    prefix_hit_tokens: int = 0
    """Prefill tokens saved by copying a shared prefix from another slot."""
    evictions: int = 0
    hotloads: int = 0
    drains: int = 0
    """``drain`` hot-loads (strict on-policy): admission stopped, in-flight turns finished,
    caches reset, then the swap."""
    cache_resets: int = 0
    """Hot-loads after which no KV of an older version survives in the replica (each drain)."""
    drain_evictions: int = 0
    """KV caches (resident requests, the prefix cache's donors) dropped by drains; also
    counted in ``evictions``."""
    drain_wait_s: float = 0.0
    """Seconds drains waited, from ``load_weights`` to the swap, for in-flight turns."""
    recomputed_tokens: int = 0
    """KV positions re-prefilled by ``recompute`` hot-loads."""
    turns_finished: int = 0
    kv_staleness_samples: int = 0
    """Audited tokens (provrl.engine.audit) whose fresh logprob is finite."""
    kv_staleness_sum_abs: float = 0.0
    kv_staleness_max_abs: float = 0.0
    kv_staleness_support_misses: int = 0
    """Audited tokens outside the fresh distribution's top-k/top-p support."""
    busy_s: float = 0.0
    """Seconds the scheduler thread spent in sampling steps (forward + sample + apply)."""

    def as_dict(self) -> dict[str, float]:
        return {k: float(v) for k, v in asdict(self).items()}


@dataclass
class Turn:
    """What the current turn of a request sampled so far: one entry per token, the fields
    of :class:`~provrl.engine.api.TurnOutput`."""

    tokens: list[int] = field(default_factory=list)
    logprob: list[float] = field(default_factory=list)
    kept_mass: list[float] = field(default_factory=list)
    version: list[int] = field(default_factory=list)
    kv_min: list[int] = field(default_factory=list)


@dataclass(eq=False)
class Request:
    """One conversation: its context ids, its KV slot and its current turn."""

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
    """Oldest weight version in this request's KV (the version of position 0)."""
    # the current turn
    future: Future[TurnOutput] | None = None
    turn_start: int = 0
    turn: Turn = field(default_factory=Turn)
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
class StepBuilder:
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
        """The lists as int64 tensors on ``device`` (tokens, positions, slots: [N]; logit
        rows: [R]); rows 0 … n_decode-1 are decode rows."""

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
class Plan:
    """One sampling step: its inputs and, per logit row, the request that samples there."""

    inputs: StepInputs
    rows: list[Request]  # the request of each logit row (R of them)
    fed: list[tuple[Request, int]]  # (request, tokens fed this step)
    params: tuple[torch.Tensor, torch.Tensor, torch.Tensor]  # temperature, top_k, top_p: [R]
    u: torch.Tensor  # [R] float64 uniforms, one per sampled token


class Scheduler:
    """Requests, slots and step plans of one replica (see the module docstring).

    ``kv`` is the replica's cache (slots ``0 … cfg.max_seqs-1`` are the scheduler's; the
    engine may keep more for itself); ``on_finish`` is called with every request whose turn
    ends, before its future resolves (the engine queues KV audits there)."""

    def __init__(
        self,
        cfg: EngineConfig,
        kv: KVCache,
        tokenizer: Any,
        eos_ids: frozenset[int],
        counters: EngineCounters,
        replica: int = 0,
        version: int = 0,
        on_finish: Callable[[Request], None] | None = None,
    ) -> None:
        self.cfg, self.kv, self.tokenizer, self.eos_ids = cfg, kv, tokenizer, eos_ids
        self.counters, self.replica, self.version = counters, replica, version
        self.on_finish = on_finish
        self.requests: dict[str, Request] = {}
        self.queue: deque[Request] = deque()
        self.slot_owner: list[Request | None] = [None] * cfg.max_seqs

    # ------------------------------------------------------------------ queries
    def active(self) -> list[Request]:
        return [r for r in self.requests.values() if r.state == "active"]

    def has_work(self) -> bool:
        """A turn is queued or generating."""
        return bool(self.queue) or any(r.state == "active" for r in self.requests.values())

    def resident(self) -> list[Request]:
        """The requests that hold a KV slot, in slot order."""
        return [r for r in self.slot_owner if r is not None]

    # ------------------------------------------------------------------ request life
    def start_turn(
        self,
        req: Request,
        p: SamplingParams,
        on_token: Callable[[str, int], None] | None = None,
    ) -> Future[TurnOutput]:
        """Begin a turn: the request queues for a slot."""
        fut: Future[TurnOutput] = Future()
        req.future = fut
        req.on_token = on_token
        req.turn_start = len(req.ids)
        req.turn = Turn()
        req.stop_ids = frozenset(p.stop_token_ids) | self.eos_ids
        req.stops = StopMatcher(self.tokenizer, p.stop) if p.stop else None
        req.cancelled = False
        req.t_submit = time.perf_counter()
        req.t_start = req.t_first = 0.0
        req.state = "queued"
        self.queue.append(req)
        return fut

    def finish(self, req: Request, reason: FinishReason, match: str | int | None = None) -> None:
        """End the current turn and resolve its future."""
        now = time.perf_counter()
        t = req.turn
        out = TurnOutput(
            request_id=req.rid,
            token_ids=list(t.tokens),
            logprob=np.asarray(t.logprob, np.float32),
            kept_mass=np.asarray(t.kept_mass, np.float32),
            version=np.asarray(t.version, np.int32),
            kv_min=np.asarray(t.kv_min, np.int32),
            kv_max=np.asarray(t.version, np.int32),
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
        self.counters.turns_finished += 1
        fut, req.future = req.future, None
        if self.on_finish is not None:
            self.on_finish(req)
        if fut is not None and not fut.done():
            fut.set_result(out)

    def cancel(self, req: Request) -> None:
        """A queued turn ends now; a generating one at the next step boundary."""
        if req.state == "queued":
            self.queue.remove(req)
            self.finish(req, "cancelled")
        elif req.state == "active":
            req.cancelled = True

    def release(self, req: Request) -> None:
        """Forget ``req`` now, or at the next step boundary if its turn is generating."""
        if req.state == "active":
            req.cancelled = req.released = True  # dropped at the next step boundary
            return
        if req.state == "queued":
            self.queue.remove(req)
            self.finish(req, "cancelled")
        self.drop(req)

    def drop(self, req: Request) -> None:
        """Forget a request and free its slot (its KV pages go back to the OS)."""
        if req.slot is not None:
            self.slot_owner[req.slot] = None
            self.kv.trim(req.slot, 0)
            req.slot = None
        req.released = True
        self.requests.pop(req.rid, None)

    def evict(self, req: Request) -> None:
        """Free an idle request's slot; its next turn re-prefills its whole context."""
        assert req.slot is not None
        self.slot_owner[req.slot] = None
        self.kv.trim(req.slot, 0)
        req.slot = None
        req.n_cached = 0
        self.counters.evictions += 1

    def fail_all(self, err: BaseException) -> None:
        """Resolve every waiting turn's future with ``err``."""
        for req in list(self.requests.values()):
            if req.future is not None and not req.future.done():
                req.future.set_exception(err)

    # ------------------------------------------------------------------ slots
    def free_slot(self) -> int | None:
        """A free slot, else the slot of the least recently used idle request (evicted)."""
        for s, owner in enumerate(self.slot_owner):
            if owner is None:
                return s
        idle = [r for r in self.slot_owner if r is not None and r.state == "idle"]
        if not idle:
            return None
        victim = min(idle, key=lambda r: r.last_used)
        slot = victim.slot
        self.evict(victim)
        return slot

    def prefix_donor(self, req: Request, ahead: set[Request]) -> tuple[Request | None, int, int]:
        """(donor, usable, potential): the resident request whose cached KV shares the
        longest prefix with ``req.ids`` (``usable`` tokens), and the longest prefix shared
        with a request that is computing it right now (``ahead``: prefilling this step or
        part-way through its prefill), reachable by waiting a step."""
        best, usable, potential = None, 0, 0
        limit = len(req.ids) - 1  # at least one token must be fed to get logits
        m = self.cfg.prefix_cache_min_tokens
        head = req.ids[:m]
        for other in self.slot_owner:
            if other is None or other is req or other.ids[:m] != head:
                continue
            n = common_prefix(req.ids, other.ids, limit)
            if min(n, other.n_cached) > usable:
                best, usable = other, min(n, other.n_cached)
            if other in ahead or (other.state == "active" and 0 < other.n_cached < n):
                potential = max(potential, n)
        return best, usable, potential

    def admit(self) -> None:
        """Start queued turns: continuations that kept their KV slot at once, the others
        FIFO while a slot is free (or an idle cache can be evicted)."""
        no_slot = False
        for req in list(self.queue):
            if req.slot is None:
                s = None if no_slot else self.free_slot()
                if s is None:
                    no_slot = True
                    continue
                req.slot, req.n_cached = s, 0
                self.slot_owner[s] = req
            self.queue.remove(req)
            req.state = "active"
            req.t_start = time.perf_counter()

    def take_prefix(self, req: Request, ahead: set[Request]) -> bool:
        """For a request with an empty KV: copy a shared prefix (True), or wait a step for
        a request that is computing that prefix right now (False)."""
        m = self.cfg.prefix_cache_min_tokens
        if not self.cfg.prefix_cache or req.n_cached or len(req.ids) <= m:
            return True
        donor, usable, potential = self.prefix_donor(req, ahead)
        if potential - usable >= m:
            return False
        if donor is not None and usable >= m:
            assert donor.slot is not None and req.slot is not None
            self.kv.move(donor.slot, req.slot, usable)
            req.n_cached = usable
            req.kv_min = donor.kv_min
            self.counters.prefix_hit_tokens += usable
        return True

    def pack(self, decode: list[Request]) -> None:
        """Move the decode requests into slots 0…B-1 (swapping KV with whatever is there)."""
        B = len(decode)
        misplaced = [r for r in decode if r.slot is not None and r.slot >= B]
        if not misplaced:
            return
        in_front = {r.slot for r in decode if r.slot is not None and r.slot < B}
        holes = [s for s in range(B) if s not in in_front]
        for r, s in zip(misplaced, holes, strict=True):
            assert r.slot is not None
            other = self.slot_owner[s]
            if other is None:
                self.kv.move(r.slot, s, r.n_cached)
                self.kv.trim(r.slot, 0)
                self.slot_owner[r.slot] = None
            else:
                self.kv.swap(r.slot, s, r.n_cached, other.n_cached)
                if other.n_cached < r.n_cached:  # the shorter context moves in: trim the rest
                    self.kv.trim(r.slot, other.n_cached)
                else:
                    self.kv.trim(s, r.n_cached)
                self.slot_owner[r.slot] = other
                other.slot = r.slot
            self.slot_owner[s] = r
            r.slot = s

    # ------------------------------------------------------------------ one step
    def plan(self, admit: bool = True) -> Plan | None:
        """Admit (unless ``admit`` is False: a drain is waiting), pack and build the next
        step; None when no request can be fed."""
        for req in [r for r in self.requests.values() if r.state == "active" and r.cancelled]:
            self.finish(req, "cancelled")
            if req.released:
                self.drop(req)
        if admit:
            self.admit()
        active = self.active()
        if not active:
            return None
        # decode rows: requests whose KV holds all but the last sampled token
        decode = [r for r in active if r.pending == 1 and r.n_cached > 0]
        self.pack(decode)
        decode.sort(key=lambda r: r.slot if r.slot is not None else -1)
        # prefill chunks: the others, first come first served, within prefill_chunk tokens
        budget = self.cfg.prefill_chunk
        chunks: list[tuple[Request, int]] = []
        ahead: set[Request] = set()
        for req in active:
            if budget <= 0:
                break
            if req.pending == 1 and req.n_cached > 0:
                continue
            if not self.take_prefix(req, ahead):
                continue  # a request ahead is computing this prefix: copy it next step
            ahead.add(req)
            n = min(req.pending, budget)
            chunks.append((req, n))
            budget -= n
        if not decode and not chunks:
            return None
        step = StepBuilder()
        rows: list[Request] = []
        fed: list[tuple[Request, int]] = []
        for req in decode:
            assert req.slot is not None
            step.decode(req.slot, req.ids[-1], req.n_cached)
            rows.append(req)
            fed.append((req, 1))
        for req, n in chunks:
            assert req.slot is not None
            if req.n_cached == 0:
                req.kv_min = self.version
            step.chunk(req.slot, req.ids, req.n_cached, n)
            fed.append((req, n))
            if n == req.pending:  # the chunk completes the context: its last row samples
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
        self.counters.prefill_tokens += sum(n for _, n in chunks)
        return Plan(inputs, rows, fed, params, u)

    def apply(self, plan: Plan, tokens: list[int], logprob: list[float],
              kept: list[float]) -> None:  # fmt: skip
        """Record the sampled tokens (one per logit row) and end the turns that are done."""
        now = time.perf_counter()
        self.counters.steps += 1
        for req, n in plan.fed:
            req.n_cached += n
        v = self.version
        for req, a, lp, m in zip(plan.rows, tokens, logprob, kept, strict=True):
            if req.state != "active":
                continue
            if not req.t_first:
                req.t_first = now
            req.ids.append(a)
            t = req.turn
            t.tokens.append(a)
            t.logprob.append(lp)
            t.kept_mass.append(m)
            t.version.append(v)
            t.kv_min.append(req.kv_min)
            self.counters.tokens_generated += 1
            if req.on_token is not None:
                req.on_token(req.rid, a)
            if a in req.stop_ids:
                self.finish(req, "eos" if a in self.eos_ids else "stop", a)
            elif req.stops is not None and (s := req.stops.match(t.tokens)) is not None:
                self.finish(req, "stop", s)
            elif len(t.tokens) >= req.params.max_new_tokens:
                self.finish(req, "length")
            elif len(req.ids) >= self.cfg.max_context:
                self.finish(req, "context")
            elif req.cancelled:
                self.finish(req, "cancelled")
            if req.released and req.state == "idle":
                self.drop(req)


def common_prefix(a: list[int], b: list[int], limit: int) -> int:
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

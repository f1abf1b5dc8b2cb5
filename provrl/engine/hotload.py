"""Hot-load: swap a replica's weights for a newer version while requests are in flight.

``LocalEngine.load_weights`` reads and checks the weights in the caller's thread and
queues a :class:`HotLoad`; the scheduler thread performs it between two steps
(:func:`swap`), so no token is ever sampled from a mix of versions. The three modes differ
in what happens to the KV caches of the requests alive across the swap::

    keep       swap now; every KV is kept (tokens sampled later attend to KV computed
               under older versions: TurnOutput.kv_min < version records it)
    recompute  swap now, then re-prefill every resident KV under the new weights
               (kv_min = the new version again)
    drain      stop admitting; when no turn is generating, swap and evict every cache
               (strict on-policy: no old KV survives)

Counters (``LocalEngine.stats()``): ``hotloads`` every swap; a drain also adds 1 to
``drains`` and ``cache_resets``, the caches it dropped to ``drain_evictions`` and its wait
for the in-flight turns to ``drain_wait_s`` — how a strict on-policy run is checked to have
drained and reset every replica at every step.
"""

from __future__ import annotations

import os
import time
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from provrl.engine.api import EngineError, HotLoadMode, HotLoadReport
from provrl.engine.llama import LlamaWeights, StepInputs
from provrl.engine.scheduler import Scheduler, StepBuilder
from provrl.failpoints import failpoint
from provrl.models.checkpoint import CheckpointError, load_state_dict


@dataclass
class HotLoad:
    """A queued weight swap."""

    pairs: list[tuple[torch.Tensor, torch.Tensor]]  # (engine tensor, new value), checked
    version: int
    mode: HotLoadMode
    future: Future[HotLoadReport]
    t_call: float
    in_flight: int
    """Requests the engine held when load_weights was called."""


def read_weights(weights: Mapping[str, Any] | str | os.PathLike[str]) -> tuple[Mapping[str, Any], str]:  # fmt: skip
    """A state dict from a mapping, a ``.safetensors`` file, or a directory of them."""
    if isinstance(weights, Mapping):
        return weights, "state dict"

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


def can_run(h: HotLoad, sched: Scheduler) -> bool:
    """keep / recompute run at the next step boundary; drain once no turn is generating."""
    return not (h.mode == "drain" and sched.active())


def recompute_steps(sched: Scheduler) -> Iterator[StepBuilder]:
    """Prefill steps (≤ ``prefill_chunk`` tokens each) that recompute every resident KV
    ``ids[:n_cached]`` from position 0."""
    todo = [r for r in sched.resident() if r.n_cached > 0]
    queue = deque((r, 0) for r in todo)
    while queue:
        budget = max(sched.cfg.prefill_chunk, 1)
        step = StepBuilder()
        while queue and budget > 0:
            r, start = queue.popleft()
            n = min(r.n_cached - start, budget)
            assert r.slot is not None
            step.chunk(r.slot, r.ids, start, n)
            budget -= n
            if start + n < r.n_cached:
                queue.appendleft((r, start + n))
        yield step


def swap(
    h: HotLoad,
    weights: LlamaWeights,
    sched: Scheduler,
    run_step: Callable[[StepInputs], Any],
) -> HotLoadReport:
    """Perform ``h`` now (the scheduler thread, lock held, no step running): copy the new
    weights in, then recompute (``run_step`` runs a forward) or reset the caches as the mode
    says; returns the report for ``load_weights``' caller."""
    t0 = time.perf_counter()
    old = sched.version
    failpoint("engine.hotload")  # crash tests: a kill while a hot-load is in flight
    weights.copy_pairs_(h.pairs)
    sched.version = h.version
    recomputed = 0
    if h.mode == "recompute":
        resident = [r for r in sched.resident() if r.n_cached > 0]
        recomputed = sum(r.n_cached for r in resident)
        for step in recompute_steps(sched):
            run_step(step.build(sched.cfg.device))
        for r in resident:
            r.kv_min = h.version
    elif h.mode == "drain":
        resident = sched.resident()
        for req in resident:  # nothing is active now: idle or queued
            sched.evict(req)  # reset the caches: no old KV survives the swap
        c = sched.counters
        c.drains += 1
        c.cache_resets += 1
        c.drain_evictions += len(resident)
        c.drain_wait_s += t0 - h.t_call
    t1 = time.perf_counter()
    sched.counters.hotloads += 1
    sched.counters.recomputed_tokens += recomputed
    since = h.t_call if h.mode == "drain" else t0
    return HotLoadReport(h.mode, old, h.version, (t1 - since) * 1e3, h.in_flight, recomputed)

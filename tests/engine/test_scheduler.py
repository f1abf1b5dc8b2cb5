"""The scheduler's bookkeeping on its own: no thread, no lock, no model forward.

A step is planned, the test plays the sampler (it picks the token of every logit row), and
the scheduler applies it — so slot assignment, eviction, packing, prefix reuse, the plan's
rows and the per-token stamps are checked against hand-worked expectations."""

from __future__ import annotations

import numpy as np
import torch

from provrl.engine.config import EngineConfig
from provrl.engine.llama import KVCache, LlamaShape
from provrl.engine.scheduler import EngineCounters, Request, Scheduler, common_prefix
from provrl.provenance import SamplingParams

SHAPE = LlamaShape(
    vocab_size=100,
    hidden=8,
    n_layers=1,
    n_heads=2,
    n_kv_heads=1,
    head_dim=4,
    intermediate=16,
    eps=1e-5,
    tied=True,
)


def make(**cfg) -> Scheduler:
    c = EngineConfig(**{"max_seqs": 2, "max_context": 64, "prefill_chunk": 64, **cfg})
    kv = KVCache(SHAPE, c.max_seqs, c.max_context, "cpu", torch.float32)
    return Scheduler(c, kv, tokenizer=None, eos_ids=frozenset({99}), counters=EngineCounters())


def submit(s: Scheduler, rid: str, ids: list[int], max_new: int = 4, **params) -> Request:
    p = SamplingParams(temperature=1.0, max_new_tokens=max_new, **params)
    req = Request(rid, list(ids), np.random.default_rng(0), p)
    s.requests[rid] = req
    s.start_turn(req, p)
    return req


def step(s: Scheduler, token: int = 7):
    """Plan one step and sample ``token`` at every logit row."""
    plan = s.plan()
    assert plan is not None
    n = len(plan.rows)
    s.apply(plan, [token] * n, [-0.5] * n, [1.0] * n)
    return plan


def test_common_prefix():
    assert common_prefix([1, 2, 3, 4], [1, 2, 9], 10) == 2
    assert common_prefix([1, 2, 3], [1, 2, 3], 2) == 2
    assert common_prefix([5], [6], 3) == 0


def test_prefill_then_decode_with_stamps():
    s = make()
    a = submit(s, "a", [1, 2, 3, 4, 5], max_new=3)
    fut = a.future
    p = step(s)  # prefill of 5 tokens; its last row samples the first token
    assert [c.n for c in p.inputs.chunks] == [5] and p.inputs.n_decode == 0
    assert p.inputs.logit_rows.tolist() == [4] and a.n_cached == 5 and a.kv_min == 0
    s.version = 3  # a keep-mode hot-load: the KV (version 0) stays
    p = step(s)  # one decode row: the last sampled token, at position 5
    assert p.inputs.n_decode == 1 and p.inputs.positions.tolist() == [5]
    step(s)
    assert a.state == "idle" and a.turn.version == [0, 3, 3] and a.turn.kv_min == [0, 0, 0]
    out = fut.result(timeout=0)
    assert out.version.tolist() == [0, 3, 3] and out.kv_min.tolist() == [0, 0, 0]
    assert s.counters.tokens_generated == 3 and s.counters.prefill_tokens == 5


def test_finish_reasons_and_future():
    s = make()
    a = submit(s, "a", [1, 2, 3], max_new=10, stop_token_ids=(42,))
    fut = a.future
    step(s, token=5)
    step(s, token=42)  # a request stop id
    out = fut.result(timeout=0)
    assert out.finish_reason == "stop" and out.stop_match == 42 and out.token_ids == [5, 42]
    b = submit(s, "b", [1, 2, 3])
    fut = b.future
    step(s, token=99)  # the engine's EOS ids
    assert fut.result(timeout=0).finish_reason == "eos"
    c = submit(s, "c", [4, 5, 6], max_new=2)
    fut = c.future
    step(s)
    step(s)
    assert fut.result(timeout=0).finish_reason == "length"


def test_slots_queue_and_lru_eviction():
    s = make(max_seqs=2)
    a, b = submit(s, "a", [1, 2, 3], max_new=1), submit(s, "b", [4, 5, 6], max_new=1)
    c = submit(s, "c", [7, 8, 9], max_new=1)
    step(s)  # a and b take the two slots and finish; c waits for a slot
    assert a.state == b.state == "idle" and c.state == "queued"
    step(s)  # c evicts the least recently used idle cache (a finished first)
    assert c.slot is not None and a.slot is None and a.n_cached == 0 and b.slot is not None
    assert s.counters.evictions == 1


def test_decode_rows_are_packed_into_the_front_slots():
    s = make(max_seqs=2)
    a = submit(s, "a", [1, 2, 3], max_new=1)
    b = submit(s, "b", [4, 5, 6], max_new=5)
    step(s)  # a in slot 0 finishes, b in slot 1 keeps decoding
    assert (a.slot, b.slot) == (0, 1)
    p = step(s)
    assert b.slot == 0 and a.slot == 1  # b's KV swapped with a's idle one
    assert p.inputs.n_decode == 1 and p.inputs.slots.tolist() == [0]


def test_prefix_cache_waits_one_step_then_copies():
    s = make(prefix_cache_min_tokens=4)
    shared = list(range(10, 30))
    a = submit(s, "a", [*shared, 1], max_new=2)
    b = submit(s, "b", [*shared, 2], max_new=2)
    p = step(s)  # b waits: a is computing the 20 shared tokens in this very step
    assert [c.slot for c in p.inputs.chunks] == [a.slot] and b.n_cached == 0
    p = step(s)  # b copies a's 20 cached tokens and prefills only its own last token
    assert s.counters.prefix_hit_tokens == 20
    assert any(c.slot == b.slot and c.start == 20 and c.n == 1 for c in p.inputs.chunks)
    assert b.kv_min == a.kv_min == 0


def test_prefill_budget_splits_a_long_prompt():
    s = make(prefill_chunk=4)
    a = submit(s, "a", list(range(1, 11)), max_new=1)
    p = step(s)
    assert [c.n for c in p.inputs.chunks] == [4] and not p.rows  # no logits yet
    step(s)
    p = step(s)
    assert [c.n for c in p.inputs.chunks] == [2] and p.rows == [a]


def test_cancel_and_release():
    s = make(max_seqs=1)
    a = submit(s, "a", [1, 2, 3], max_new=5)
    b = submit(s, "b", [4, 5, 6], max_new=5)
    fut_b = b.future
    s.cancel(b)  # queued: ends at once
    assert fut_b.result(timeout=0).finish_reason == "cancelled" and b.state == "idle"
    step(s)
    s.release(a)  # generating: dropped at the next step boundary
    assert s.plan() is None
    assert "a" not in s.requests and s.slot_owner == [None]

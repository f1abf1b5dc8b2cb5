"""Router: least-loaded placement, affinity, replicas at different versions."""

from __future__ import annotations

import numpy as np
import pytest

from provrl.engine import Engine, EngineError, Router
from provrl.provenance import NO_VERSION, SamplingParams, TrajectoryBuilder

P = SamplingParams(temperature=1.0, max_new_tokens=40, seed=0)


def test_router_is_an_engine_and_spreads_load(make_engine, prompts):
    r = Router([make_engine(replica=0), make_engine(replica=1)])
    assert isinstance(r, Engine)
    futs = [r.submit(p, P) for p in prompts]  # eight different prompts, all in flight
    outs = [f.result(timeout=120) for f in futs]
    per_replica = np.bincount([o.replica for o in outs], minlength=2)
    assert per_replica.tolist() == [4, 4]
    for o in outs:
        assert r.replica_of(o.request_id) == o.replica


def test_continuation_goes_to_the_replica_holding_the_kv(make_engine, prompts):
    r = Router([make_engine(replica=0), make_engine(replica=1)])
    first = [r.submit(p, P).result(timeout=60) for p in prompts[:4]]
    for o in first:
        nxt = r.submit_continue(o.request_id, [42], P).result(timeout=60)
        assert nxt.replica == o.replica
        r.release(o.request_id)
    assert r.stats()["r0/prefill_tokens"] + r.stats()["r1/prefill_tokens"] > 0
    with pytest.raises(EngineError, match="unknown request id"):
        r.submit_continue(first[0].request_id, [1], P)


def test_same_prompt_prefers_the_replica_with_its_prefix(make_engine, prompts):
    r = Router([make_engine(replica=0), make_engine(replica=1)], max_imbalance=8)
    outs = [r.submit(prompts[3], P).result(timeout=60) for _ in range(3)]
    assert len({o.replica for o in outs}) == 1  # a GRPO group stays on one prefix cache


def test_replicas_at_different_versions_stamp_their_tokens(make_engine, tiny, prompts, helpers):
    r = Router([make_engine(replica=0), make_engine(replica=1)])
    rep = r.load_weights(helpers.perturbed(tiny, 0.05, 1), version=1, replicas=[1])
    assert rep.new_version == 1 and r.versions() == [0, 1] and r.version == 1
    futs = [r.submit(p, P) for p in prompts]
    trajs = []
    for i, (p, f) in enumerate(zip(prompts, futs, strict=True)):
        o = f.result(timeout=120)
        assert (o.version == o.replica).all()  # replica 1 runs version 1
        b = TrajectoryBuilder(f"t{i}", "task")
        b.add_prompt(p)
        b.add_sampled(o)
        trajs.append(b.build())  # validates the provenance invariant
    versions = {int(v) for t in trajs for v in t.version if v != NO_VERSION}
    assert versions == {0, 1}
    with pytest.raises(EngineError, match="no replica 5"):
        r.load_weights(tiny.model.state_dict(), version=2, replicas=[5])

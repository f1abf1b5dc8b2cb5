"""Engine replicas as Ray actors (one local Ray, ``num_cpus=2``, for the whole module): the
Engine protocol over actor handles, weights through the object store, and killed replicas
— their turns resubmitted exactly, or failed into aborted episodes, never lost or doubled."""

from __future__ import annotations

import os
import signal
import threading
import time

import numpy as np
import pytest

ray = pytest.importorskip("ray")

from provrl.distributed.config import RayConfig  # noqa: E402
from provrl.distributed.engine import RayEngine, connect  # noqa: E402
from provrl.engine import Engine, EngineConfig, EngineError, LocalEngine  # noqa: E402
from provrl.models import LoadedModel  # noqa: E402
from provrl.pipeline.engines import make_rollout_engine  # noqa: E402
from provrl.provenance import SamplingParams  # noqa: E402
from provrl.run_config import RunConfig  # noqa: E402

ENGINE = dict(max_seqs=16, max_context=1024, eos_stops=False)
LONG = 300  # tokens per turn in the kill tests: the kill lands while they generate


@pytest.fixture(scope="module")
def ray_session():
    assert connect(RayConfig(num_cpus=2, object_store_mb=256))
    yield
    ray.shutdown()


@pytest.fixture(scope="module")
def state(tiny):
    """The weights the module's engine holds: ``{"version": v, "sd": state dict}``."""
    return {"version": 0, "sd": tiny.model.state_dict()}


@pytest.fixture(scope="module")
def eng(ray_session, tiny):
    cfg = RunConfig(backend="ray", ray=RayConfig(replicas=2))
    e = make_rollout_engine(tiny, cfg, EngineConfig(**ENGINE), version=0)
    assert isinstance(e, RayEngine)
    yield e
    e.close()


def prompts(n: int, length: int = 6) -> list[list[int]]:
    rng = np.random.default_rng(1)
    return [[int(x) for x in rng.integers(10, 2000, length)] for _ in range(n)]


def params(i: int, n: int = 24) -> SamplingParams:
    return SamplingParams(temperature=1.0, max_new_tokens=n, seed=100 + i)


def reference(tiny, state, ps, n: int = 24):
    """The same turns on an in-process LocalEngine holding the same weights."""
    lm = tiny
    if state["version"]:
        model = type(tiny.model)(tiny.model.config)
        model.load_state_dict(state["sd"], strict=False)
        lm = LoadedModel(model, tiny.tokenizer, "ref", None, "ref")
    with LocalEngine(lm, EngineConfig(**ENGINE), version=state["version"]) as ref:
        return [ref.submit(p, params(i, n)).result(timeout=300) for i, p in enumerate(ps)]


def perturbed(tiny, scale: float, seed: int):
    import torch

    g = torch.Generator().manual_seed(seed)
    return {
        k: v.detach() + scale * v.detach().std() * torch.randn(v.shape, generator=g)
        for k, v in tiny.model.state_dict().items()
        if k != "lm_head.weight"
    }


def same_turns(a, b) -> None:
    for x, y in zip(a, b, strict=True):
        assert x.token_ids == y.token_ids
        np.testing.assert_allclose(x.logprob, y.logprob, atol=1e-4)
        assert (x.version == y.version).all() and (x.kv_min == y.kv_min).all()


def owned(eng, rid: str) -> bool:
    """Whether any replica client holds request ``rid``."""
    return any(c.owns(rid) for c in eng.clients)


def wait_for(cond, timeout: float = 600.0) -> None:
    t_end = time.perf_counter() + timeout
    while not cond():
        assert time.perf_counter() < t_end, "timed out"
        time.sleep(0.02)


def test_replicas_are_processes_and_sample_what_the_in_process_engine_samples(eng, tiny, state):
    assert isinstance(eng, Engine)
    pids = {i["pid"] for i in eng.replica_info()}
    assert len(pids) == 2 and os.getpid() not in pids
    ps = prompts(6)
    futs = [eng.submit(p, params(i), request_id=f"same{i}") for i, p in enumerate(ps)]
    outs = [f.result(timeout=300) for f in futs]
    assert {o.replica for o in outs} == {0, 1}  # routed over both actors
    for o in outs:
        assert eng.replica_of(o.request_id) == o.replica
        eng.release(o.request_id)
    same_turns(outs, reference(tiny, state, ps))


def test_a_continuation_goes_to_the_replica_holding_its_kv(eng):
    first = eng.submit(prompts(1)[0], params(0), request_id="cont").result(timeout=300)
    nxt = eng.submit_continue("cont", [42, 43], params(1)).result(timeout=300)
    assert nxt.replica == first.replica and len(nxt.token_ids) == 24
    eng.release("cont")
    with pytest.raises(EngineError, match="unknown request id"):
        eng.submit_continue("cont", [1], params(2))
    with pytest.raises(EngineError, match="already in use"):
        eng.submit([5, 6], params(0), request_id="dup")
        eng.submit([5, 6], params(0), request_id="dup")
    eng.release("dup")


def test_an_invalid_request_fails_its_future_with_the_engine_error(eng):
    fut = eng.submit([10**9], params(0), request_id="bad")
    with pytest.raises(EngineError, match="outside the vocabulary"):
        fut.result(timeout=300)
    eng.release("bad")


def test_each_version_is_published_once_and_stamps_every_token(eng, tiny, state):
    s0 = eng.stats()
    for schedule, mode in (("rolling", "keep"), ("all", "drain")):
        v = state["version"] + 1
        sd = perturbed(tiny, 0.05, v)
        rep = eng.load_weights(sd, v, mode, schedule=schedule)
        state.update(version=v, sd=sd)
        assert rep.new_version == v and eng.versions() == [v, v]
        assert [r.new_version for r in eng.last_reports] == [v, v]
        last = [e for e in eng.timeline() if e[2] == v]
        assert sorted(r for _, r, _ in last) == [0, 1]
    s1 = eng.stats()
    assert s1["published_versions"] - s0["published_versions"] == 2  # once per version
    assert s1["hotloads"] - s0["hotloads"] == 4  # … loaded by both replicas
    ps = prompts(4)
    outs = [eng.submit(p, params(i)).result(timeout=300) for i, p in enumerate(ps)]
    assert all((o.version == state["version"]).all() for o in outs)
    same_turns(outs, reference(tiny, state, ps))
    with pytest.raises(EngineError, match="must be newer"):
        eng.load_weights(state["sd"], state["version"] - 1)


def test_a_killed_replica_restarts_at_the_current_version_and_its_turns_are_resubmitted(
    eng, tiny, state
):
    s0 = eng.stats()
    ps = prompts(8)
    futs = [eng.submit(p, params(i, LONG), request_id=f"kill{i}") for i, p in enumerate(ps)]
    victim = eng.replica_of("kill0")
    wait_for(lambda: eng.stats()[f"r{victim}/tokens_generated"] > s0[f"r{victim}/tokens_generated"])
    t_kill = time.perf_counter()
    eng.kill_replica(victim)
    outs = [f.result(timeout=600) for f in futs]
    recovered = time.perf_counter() - t_kill
    s1 = eng.stats()
    on_victim = [o for o in outs if o.replica == victim]
    assert s1["deaths"] - s0["deaths"] == 1 and s1["restarts"] - s0["restarts"] == 1
    assert s1["turns_resubmitted"] - s0["turns_resubmitted"] == len(on_victim) > 0
    assert s1["turns_failed"] == s0["turns_failed"]
    assert eng.versions() == [state["version"]] * 2  # the new process loaded the current one
    assert 0 < s1["recover_s_last"] <= recovered
    # the resubmitted turns are exactly the turns an undisturbed engine samples
    same_turns(outs, reference(tiny, state, ps, LONG))
    for o in outs:
        eng.release(o.request_id)


def test_kill_9_of_an_idle_replica_reprefills_its_requests_next_turn(eng, tiny, state):
    first = eng.submit(prompts(1)[0], params(0), request_id="idle").result(timeout=300)
    client = eng.clients[first.replica]
    inc, s0 = client.incarnation, eng.stats()
    os.kill(client.info["pid"], signal.SIGKILL)  # as from outside: no Ray involved
    wait_for(lambda: client.incarnation == inc + 1)
    assert client.wait_ready(600)
    nxt = eng.submit_continue("idle", [42, 43], params(1)).result(timeout=300)
    s1 = eng.stats()
    assert s1["requests_reprefilled"] - s0["requests_reprefilled"] == 1
    assert s1["turns_resubmitted"] == s0["turns_resubmitted"]  # nothing was generating
    assert nxt.replica == first.replica and (nxt.kv_min == state["version"]).all()
    eng.release("idle")
    # the same two turns in one process: the re-prefilled context is the same context
    with LocalEngine(tiny if not state["version"] else _lm(tiny, state), EngineConfig(**ENGINE),
                     version=state["version"]) as ref:  # fmt: skip
        a = ref.submit(prompts(1)[0], params(0), request_id="idle").result(timeout=300)
        b = ref.submit_continue("idle", [42, 43], params(1)).result(timeout=300)
    same_turns([first, nxt], [a, b])


def _lm(tiny, state):
    model = type(tiny.model)(tiny.model.config)
    model.load_state_dict(state["sd"], strict=False)
    return LoadedModel(model, tiny.tokenizer, "ref", None, "ref")


@pytest.fixture(scope="module")
def agent_env(eng, tiny, small_world):
    from provrl.env.config import EnvConfig
    from provrl.rollout.setup import build_env

    cfg = EnvConfig()
    cfg.agent.max_new_tokens, cfg.agent.max_turns, cfg.agent.max_total_tokens = 200, 2, 900
    return build_env(eng, tiny, small_world, cfg)


def test_resubmit_off_a_killed_turn_becomes_an_aborted_episode(eng, agent_env, small_world):
    from provrl.env.build import load_split
    from provrl.rollout.agent import run_episode

    task = load_split(small_world, "train")[0]
    eng.cfg.resubmit = False
    s0 = eng.stats()
    try:
        box: dict = {}
        t = threading.Thread(
            target=lambda: box.update(traj=run_episode(agent_env, task, traj_id="abort", seed=1))
        )
        t.start()
        wait_for(lambda: owned(eng, "abort") or "traj" in box)
        victim = eng.replica_of("abort")
        wait_for(lambda: eng.stats().get(f"r{victim}/active", 0) > 0)
        eng.kill_replica(victim)
        t.join(600)
    finally:
        eng.cfg.resubmit = True
    traj, s1 = box["traj"], eng.stats()
    finish = traj.meta["finish"]
    assert finish.startswith("engine_rejected") and "died" in finish and "resubmit is off" in finish
    assert s1["turns_failed"] - s0["turns_failed"] == 1
    assert not owned(eng, "abort")  # released: nothing of it is left anywhere
    assert eng.clients[victim].wait_ready(600)


def test_the_collector_loses_and_doubles_no_episode_when_a_replica_dies(
    eng, agent_env, small_world, tmp_path
):
    from provrl.env.build import load_split
    from provrl.rollout.collector import Collector
    from provrl.trajlog import TrajectoryWriter, read_all

    tasks = load_split(small_world, "train")[:3]
    s0 = eng.stats()

    def kill_while_busy() -> None:
        # The kill lands while replica 1 holds a turn, so the test sees a resubmission
        # (killing at an arbitrary moment could find the replica idle between turns).
        assert eng.clients[1].wait_ready(600)
        wait_for(lambda: eng.clients[1].load() > 0)
        eng.kill_replica(1)

    killer = threading.Thread(target=kill_while_busy, daemon=True)
    log = tmp_path / "traj.jsonl"
    with (
        TrajectoryWriter(log) as w,
        Collector(agent_env, concurrency=8, seed=5, writer=w) as col,
    ):
        killer.start()
        groups = list(col.run(tasks, 4))
    killer.join(600)
    s1 = eng.stats()
    written = read_all(log)
    ids = [t.traj_id for t in written]
    assert len(groups) == 3 and len(ids) == 12 and len(set(ids)) == 12  # none lost, none twice
    assert not [t.meta["finish"] for t in written if t.meta["finish"].startswith("engine_")]
    assert s1["deaths"] - s0["deaths"] == 1
    affected = (s1["turns_resubmitted"] - s0["turns_resubmitted"]) + (
        s1["requests_reprefilled"] - s0["requests_reprefilled"]
    )
    assert affected >= 1

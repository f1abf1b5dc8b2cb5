"""The vLLM backend against the same checks as the local engine: token-in/token-out turns,
exact behaviour logprobs (teacher forcing), per-token versions through keep / recompute /
drain hot-loads, unknown fields marked unknown, bad input refused.

Runs only where vLLM is importable (its CPU build here: the separate ``.venv-vllm``, see
docs/engine.md §10): ``.venv-vllm/bin/python -m pytest tests/engine/test_vllm_backend.py``.
One engine (≈ 2–5 min to start on the shared 2-core machine) serves the whole module,
on ``tiny-h32`` (vLLM's CPU attention needs head sizes ≥ 32). Tests run in file order and
each hot-load test leaves the engine at a newer version.
"""

from __future__ import annotations

import copy
import threading
import time

import numpy as np
import pytest
import torch

pytest.importorskip("vllm")

from provrl.bench.engine import perturbed, vllm_tiny_model
from provrl.engine import EngineConfig, EngineError
from provrl.engine.sampling import behaviour_logprob
from provrl.engine.vllm_backend import VLLMEngine
from provrl.provenance import SamplingParams, TrajectoryBuilder
from provrl.train.logprobs import token_logprobs

TOL = 1e-4
PROMPTS = [[1, 504, 3203, 335, 253, 1001], [1, 1345, 281, 47, 2843], [1, 9, 81, 23, 1729, 3, 77]]


@pytest.fixture(scope="module")
def lm():
    return vllm_tiny_model(seed=0)


@pytest.fixture(scope="module")
def engine(lm):
    cfg = EngineConfig(backend="vllm", max_seqs=8, max_context=256, threads=1, seed=3,
                       eos_stops=False)  # fmt: skip
    e = VLLMEngine(lm, cfg)
    yield e
    e.close()


@pytest.fixture(scope="module")
def versions(lm):
    """Weights of versions 1, 2, 3 …: v0 = lm's, v_k = v0 + 1e-2·std noise (seed k); the
    tied head stays the embedding (engines ignore ``lm_head.weight`` of a tied model)."""
    base = {k: v.detach().clone() for k, v in lm.model.state_dict().items()}
    cache: dict[int, dict[str, torch.Tensor]] = {0: base}

    def get(v: int) -> dict[str, torch.Tensor]:
        if v not in cache:
            sd = perturbed(base, 1e-2, seed=v)
            sd["lm_head.weight"] = sd["model.embed_tokens.weight"]
            cache[v] = sd
        return cache[v]

    return get


def model_of(lm, sd):
    m = copy.deepcopy(lm.model)
    m.load_state_dict(sd)
    return m.eval()


@torch.no_grad()
def teacher_forced(model, context: list[int], tokens: list[int]) -> np.ndarray:
    ids = torch.tensor([context + tokens])
    return token_logprobs(model, ids)[0, len(context) :].numpy()


def as_trajectory(prompt, out):
    b = TrajectoryBuilder(out.request_id, "task")
    b.add_prompt(prompt)
    b.add_sampled(out)
    return b.build()  # validates the provenance invariant


def test_turns_match_teacher_forcing(engine, lm):
    futs = [engine.submit(p, SamplingParams(max_new_tokens=24, seed=i)) for i, p in enumerate(PROMPTS)]  # fmt: skip
    for p, f in zip(PROMPTS, futs, strict=True):
        out = f.result(timeout=600)
        assert out.finish_reason == "length" and len(out.token_ids) == 24
        ref = teacher_forced(lm.model, p, out.token_ids)
        assert np.abs(out.logprob - ref).max() < TOL
        assert (out.version == 0).all() and (out.kv_min == 0).all() and (out.kv_max == 0).all()
        assert (out.kept_mass == 1.0).all() and out.replica == 0
        as_trajectory(p, out)
        engine.release(out.request_id)
    s = engine.stats()
    assert s["tokens_generated"] >= 72 and s["kv_unknown_tokens"] == 0


def test_same_seed_same_tokens(engine):
    a = engine.submit(PROMPTS[0], SamplingParams(max_new_tokens=12, seed=42)).result(600)
    b = engine.submit(PROMPTS[0], SamplingParams(max_new_tokens=12, seed=42)).result(600)
    assert a.token_ids == b.token_ids
    np.testing.assert_array_equal(a.logprob, b.logprob)


def test_greedy_and_truncated_sampling(engine, lm):
    p = PROMPTS[1]
    g = engine.submit(p, SamplingParams(temperature=0.0, max_new_tokens=10)).result(600)
    with torch.no_grad():
        logits = lm.model(torch.tensor([p + g.token_ids])).logits[0, len(p) - 1 : -1].float()
    assert g.token_ids == logits.argmax(-1).tolist()
    assert (g.logprob == 0).all()  # greedy: point mass, as the local engine records
    m = torch.softmax(logits.double(), -1).gather(-1, torch.tensor(g.token_ids)[:, None])
    np.testing.assert_allclose(g.kept_mass, m.squeeze(-1).numpy(), atol=TOL)

    params = SamplingParams(temperature=0.8, top_p=0.9, top_k=50, max_new_tokens=16, seed=5)
    t = engine.submit(p, params).result(600)
    with torch.no_grad():
        logits = lm.model(torch.tensor([p + t.token_ids])).logits[0, len(p) - 1 : -1].float()
    n = len(t.token_ids)
    ref = behaviour_logprob(logits, torch.tensor(t.token_ids), torch.full((n,), 0.8),
                            torch.full((n,), 50), torch.full((n,), 0.9, dtype=torch.float64))  # fmt: skip
    # the same truncation rule (top-k, then the head whose mass reaches p) and log q
    np.testing.assert_allclose(t.logprob, ref.logprob.numpy(), atol=TOL)
    assert np.isnan(t.kept_mass).all()  # vLLM does not return the mass it cut: unknown
    traj = as_trajectory(p, t)
    assert np.isnan(traj.kept_mass[traj.is_action]).all()
    for o in (g, t):
        engine.release(o.request_id)


def test_multi_turn_continue_reuses_the_prefix(engine, lm):
    p = PROMPTS[2] * 20  # 140 tokens: more than one KV block (128 on vLLM's CPU build)
    first = engine.submit(p, SamplingParams(max_new_tokens=8, seed=1), request_id="mt").result(600)
    hits = engine.stats()["prefix_hit_tokens"]
    tool = [5, 6, 7, 8]
    second = engine.submit_continue("mt", tool, SamplingParams(max_new_tokens=8, seed=2)).result(600)  # fmt: skip
    assert engine.stats()["prefix_hit_tokens"] > hits  # the first turn's KV, not re-prefilled
    ctx = p + first.token_ids + tool
    assert np.abs(second.logprob - teacher_forced(lm.model, ctx, second.token_ids)).max() < TOL
    b = TrajectoryBuilder("mt", "task")
    b.add_prompt(p)
    b.add_sampled(first)
    b.next_turn()
    b.add_observation(tool)
    b.add_sampled(second)
    assert b.build().token_id.tolist() == ctx + second.token_ids
    engine.release("mt")
    with pytest.raises(EngineError, match="unknown request id"):
        engine.submit_continue("mt", tool, SamplingParams())


def test_prompts_beyond_one_step_budget(engine, lm):
    """8 seeded 140-token prompts (> one step's token budget together): on vLLM's CPU build
    a split prefill of a seeded request killed the engine (chunked prefill is off there)."""
    prompts = [[1, *range(100 + 140 * i, 100 + 140 * i + 139)] for i in range(8)]
    futs = [engine.submit(p, SamplingParams(max_new_tokens=4, seed=i)) for i, p in enumerate(prompts)]  # fmt: skip
    for p, f in zip(prompts, futs, strict=True):
        o = f.result(600)
        assert len(o.token_ids) == 4
        assert np.abs(o.logprob - teacher_forced(lm.model, p, o.token_ids)).max() < TOL
        engine.release(o.request_id)


def test_stop_strings_and_stop_ids(engine, lm):
    p = PROMPTS[0]
    free = engine.submit(p, SamplingParams(temperature=0.0, max_new_tokens=12)).result(600)
    engine.release(free.request_id)
    k = next(i for i in range(2, 12) if lm.tokenizer.decode([free.token_ids[i]]).strip())
    stop = lm.tokenizer.decode([free.token_ids[k]]).strip()
    j = next(i for i in range(12) if stop in lm.tokenizer.decode(free.token_ids[: i + 1]))
    s = engine.submit(p, SamplingParams(temperature=0.0, max_new_tokens=12, stop=(stop,))).result(600)  # fmt: skip
    assert (s.finish_reason, s.stop_match) == ("stop", stop)
    assert s.token_ids == free.token_ids[: j + 1]  # ends at the token that completed it
    engine.release(s.request_id)
    tid = free.token_ids[3]
    first = free.token_ids.index(tid)
    t = engine.submit(p, SamplingParams(temperature=0.0, max_new_tokens=12, stop_token_ids=(tid,))).result(600)  # fmt: skip
    assert (t.finish_reason, t.stop_match) == ("stop", tid)
    assert t.token_ids == free.token_ids[: first + 1]  # the stop id is part of the turn
    engine.release(t.request_id)


def test_bad_requests_are_refused(engine, versions):
    V = engine.vocab_size
    bad = [
        (lambda: engine.submit([], SamplingParams()), "empty prompt"),
        (lambda: engine.submit([1, V], SamplingParams()), "outside the vocabulary"),
        (lambda: engine.submit([1], SamplingParams(max_new_tokens=0)), "max_new_tokens"),
        (lambda: engine.submit([1], SamplingParams(temperature=1e-7)), "greedy threshold"),
        (lambda: engine.submit([1], SamplingParams(top_p=0.0)), "top_p"),
        (lambda: engine.submit([1] * 256, SamplingParams()), "no room to generate"),
        (lambda: engine.submit_continue("nope", [1], SamplingParams()), "unknown request id"),
        (lambda: engine.load_weights(versions(1), 0, "keep"), "must be newer"),
        (lambda: engine.load_weights(versions(1), 99, "fast"), "not keep, recompute or drain"),
        (lambda: engine.load_weights({"x": torch.zeros(1)}, 99), "missing"),
        (
            lambda: engine.load_weights({**versions(1), "model.norm.weight": torch.zeros(3)}, 99),
            "has shape",
        ),
        (lambda: engine.load_weights({**versions(1), "extra.w": torch.zeros(1)}, 99), "unexpected"),
    ]
    for call, msg in bad:
        with pytest.raises(EngineError, match=msg):
            call()
    f = engine.submit(PROMPTS[0], SamplingParams(max_new_tokens=64, seed=1), request_id="dup")
    with pytest.raises(EngineError, match="already in use"):
        engine.submit([1, 2], SamplingParams(), request_id="dup")
    with pytest.raises(EngineError, match="still running"):
        engine.submit_continue("dup", [3], SamplingParams())
    engine.cancel("dup")
    out = f.result(600)
    assert out.finish_reason in ("cancelled", "length")
    engine.release("dup")
    assert engine.version == 0  # no bad call changed anything


def _start_when_sampling(engine, n: int, new_tokens: int, seed0: int):
    """Submit ``n`` requests; return (futures, event set once every request has ≥ 4 tokens)."""
    counts: dict[str, int] = {}
    ready = threading.Event()
    lock = threading.Lock()

    def on_token(rid: str, _tok: int) -> None:
        with lock:
            counts[rid] = counts.get(rid, 0) + 1
            if len(counts) == n and min(counts.values()) >= 4:
                ready.set()

    futs = [
        engine.submit(
            PROMPTS[i % 3],
            SamplingParams(max_new_tokens=new_tokens, seed=seed0 + i),
            on_token=on_token,
        )
        for i in range(n)
    ]
    assert ready.wait(600)
    return futs


def test_keep_hotload_in_flight_stamps_versions(engine, lm, versions):
    futs = _start_when_sampling(engine, 4, 96, seed0=100)
    rep = engine.load_weights(versions(1), 1, "keep")
    assert (rep.mode, rep.old_version, rep.new_version) == ("keep", 0, 1) and rep.in_flight >= 4
    outs = [f.result(600) for f in futs]
    assert all(o.finish_reason == "length" and len(o.token_ids) == 96 for o in outs)  # none dropped
    old_model = lm.model
    mixed = 0
    for i, o in enumerate(outs):
        assert set(o.version.tolist()) <= {0, 1} and (np.diff(o.version) >= 0).all()
        assert (o.kv_max == o.version).all() and (o.kv_min == 0).all()  # exact: KV began at v0
        old = o.version == 0
        mixed += int((~old).sum())
        ref = teacher_forced(old_model, PROMPTS[i % 3], o.token_ids)
        assert np.abs(o.logprob[old] - ref[old]).max() < TOL  # v0 tokens: exactly v0's q
        as_trajectory(PROMPTS[i % 3], o)
        engine.release(o.request_id)
    assert mixed > 0 and engine.version == 1
    # a new request after the swap: new salt, no v0 prefix reused, every stamp is v1
    new = engine.submit(PROMPTS[0], SamplingParams(max_new_tokens=8, seed=9)).result(600)
    assert (new.version == 1).all() and (new.kv_min == 1).all()
    v1 = model_of(lm, versions(1))
    assert np.abs(new.logprob - teacher_forced(v1, PROMPTS[0], new.token_ids)).max() < TOL
    engine.release(new.request_id)


def test_recompute_hotload_resubmits_with_the_prefix(engine, lm, versions):
    v1, v2 = model_of(lm, versions(1)), model_of(lm, versions(2))
    before = engine.stats()["resubmitted"]
    futs = _start_when_sampling(engine, 3, 96, seed0=200)
    rep = engine.load_weights(versions(2), 2, "recompute")
    assert rep.mode == "recompute" and rep.recomputed_tokens > 0
    outs = [f.result(600) for f in futs]
    assert engine.stats()["resubmitted"] > before
    for i, o in enumerate(outs):
        assert o.finish_reason == "length" and len(o.token_ids) == 96
        p = PROMPTS[i % 3]
        old, new = o.version == 1, o.version == 2
        assert old.any() and new.any() and (old | new).all()
        assert (o.kv_min[old] == 1).all() and (o.kv_min[new] == 2).all()  # fresh KV after
        # every token is exactly the q of the weights it is stamped with, on fresh KV
        assert np.abs(o.logprob[old] - teacher_forced(v1, p, o.token_ids)[old]).max() < TOL
        assert np.abs(o.logprob[new] - teacher_forced(v2, p, o.token_ids)[new]).max() < TOL
        as_trajectory(p, o)
        engine.release(o.request_id)


def test_drain_hotload_finishes_in_flight_turns_first(engine, lm, versions):
    futs = _start_when_sampling(engine, 3, 64, seed0=300)
    late: list = []

    def submit_late() -> None:
        while not engine.stats()["swapping"]:  # once the drain has begun
            time.sleep(0.005)
        late.append(engine.submit(PROMPTS[1], SamplingParams(max_new_tokens=8, seed=1)))

    t = threading.Thread(target=submit_late)
    t.start()
    rep = engine.load_weights(versions(3), 3, "drain")
    t.join()
    assert rep.mode == "drain" and rep.new_version == 3
    for f in futs:  # in flight at the call: finished entirely under the old version
        o = f.result(600)
        assert o.finish_reason == "length"
        assert (o.version == rep.old_version).all() and (o.kv_min == rep.old_version).all()
        engine.release(o.request_id)
    o = late[0].result(600)  # submitted during the drain: waits, then runs under v3
    assert (o.version == 3).all() and (o.kv_min == 3).all()
    v3 = model_of(lm, versions(3))
    assert np.abs(o.logprob - teacher_forced(v3, PROMPTS[1], o.token_ids)).max() < TOL
    engine.release(o.request_id)


def test_load_weights_from_a_safetensors_dir(engine, lm, versions, tmp_path):
    from safetensors.torch import save_file

    sd = {k: v for k, v in versions(4).items() if k != "lm_head.weight"}
    save_file(sd, str(tmp_path / "model.safetensors"))
    rep = engine.load_weights(tmp_path, 4, "keep")
    assert rep.new_version == 4
    o = engine.submit(PROMPTS[2], SamplingParams(max_new_tokens=8, seed=3)).result(600)
    v4 = model_of(lm, versions(4))
    assert (o.version == 4).all()
    assert np.abs(o.logprob - teacher_forced(v4, PROMPTS[2], o.token_ids)).max() < TOL
    engine.release(o.request_id)
    assert engine.stats()["hotloads"] >= 1

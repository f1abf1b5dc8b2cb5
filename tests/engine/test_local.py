"""LocalEngine: continuous batching, exact behaviour logprobs, turns, stops, bad requests."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import torch

from provrl.engine import Engine, EngineError, LocalEngine, generate
from provrl.models import stop_token_ids
from provrl.provenance import SamplingParams, TrajectoryBuilder

GREEDY = SamplingParams(temperature=0.0, max_new_tokens=12)


def test_is_an_engine(make_engine):
    assert isinstance(make_engine(), Engine)


def test_continuous_batching_gives_the_one_at_a_time_greedy_tokens(make_engine, tiny, prompts):
    """Eight requests of different lengths arriving together (four slots: they also queue)
    produce exactly the tokens each produces alone, and alone equals HF generate."""
    alone = make_engine(max_seqs=1, prefix_cache=False)
    solo = [generate(alone, p, GREEDY).token_ids for p in prompts]
    together = make_engine(max_seqs=4)
    futs = [together.submit(p, GREEDY) for p in prompts]
    assert [f.result(timeout=120).token_ids for f in futs] == solo
    assert together.stats()["prefix_hit_tokens"] > 0  # the shared system prompt was copied
    x = torch.tensor([prompts[0]])
    with torch.no_grad():
        hf = tiny.model.generate(
            x, attention_mask=torch.ones_like(x), max_new_tokens=GREEDY.max_new_tokens,
            do_sample=False, eos_token_id=list(stop_token_ids(tiny.tokenizer)),
            pad_token_id=tiny.tokenizer.pad_token_id,
        )  # fmt: skip
    assert solo[0] == hf[0, x.shape[1] :].tolist()


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_recorded_logprobs_equal_teacher_forcing(make_engine, tiny, prompts, temperature, teacher):
    eng = make_engine()
    params = SamplingParams(temperature=temperature, max_new_tokens=24, seed=5)
    futs = [eng.submit(p, params) for p in prompts]
    for p, f in zip(prompts, futs, strict=True):
        out = f.result(timeout=120)
        ref = teacher(tiny.model, p + out.token_ids, temperature)[len(p) :]
        np.testing.assert_allclose(out.logprob, ref.numpy(), atol=1e-4, rtol=0)
        assert (out.kept_mass == 1.0).all() and (out.version == 0).all()
        assert (out.kv_min == 0).all() and (out.kv_max == 0).all() and out.replica == 0


def test_truncated_sampling_records_log_q_and_kept_mass(make_engine, tiny, prompts):
    """top-k/top-p: log q = log π_τ(a) − log m with m the kept mass, checked against the
    teacher-forced π_τ and a hand-built support at every position."""
    eng = make_engine()
    params = SamplingParams(temperature=0.8, top_k=40, top_p=0.9, max_new_tokens=16, seed=1)
    p = prompts[2]
    out = generate(eng, p, params)
    ids = torch.tensor([p + out.token_ids])
    with torch.no_grad():
        logits = tiny.model(ids).logits[0, len(p) - 1 : -1].double() / 0.8
    probs = torch.softmax(logits, -1)
    for t, a in enumerate(out.token_ids):
        ps, idx = torch.sort(probs[t], descending=True)
        top = ps[:40] / ps[:40].sum()
        keep = (top.cumsum(0) - top) < 0.9
        assert a in idx[:40][keep].tolist()
        m = float(ps[:40][keep].sum())
        assert out.kept_mass[t] == pytest.approx(m, abs=1e-5)
        assert out.logprob[t] == pytest.approx(float(torch.log(probs[t, a])) - np.log(m), abs=1e-4)
    assert (out.kept_mass < 1).all()


def test_same_seed_same_tokens(make_engine, prompts):
    eng = make_engine()
    p = SamplingParams(temperature=1.0, max_new_tokens=10, seed=42)
    assert generate(eng, prompts[0], p).token_ids == generate(eng, prompts[0], p).token_ids


def test_multi_turn_continue_keeps_the_cache_and_stays_exact(make_engine, tiny, prompts, teacher):
    eng = make_engine()
    params = SamplingParams(temperature=1.0, max_new_tokens=8, seed=3)
    first = eng.submit(prompts[0], params).result(timeout=60)
    prefill_before = eng.stats()["prefill_tokens"]
    tool = tiny.tokenizer.encode("<information>Paris</information>", add_special_tokens=False)
    second = eng.submit_continue(first.request_id, tool, params).result(timeout=60)
    # only the tool output and the previous turn's last token were prefilled
    assert eng.stats()["prefill_tokens"] - prefill_before == len(tool) + 1
    ids = prompts[0] + first.token_ids + tool + second.token_ids
    ref = teacher(tiny.model, ids)
    np.testing.assert_allclose(second.logprob, ref[-len(second.token_ids) :].numpy(), atol=1e-4)
    # the two turns assemble into a valid trajectory
    b = TrajectoryBuilder("t", "task")
    b.add_prompt(prompts[0])
    for turn, extra in ((first, None), (second, tool)):
        if extra is not None:
            b.add_observation(extra)
        b.add_sampled(turn)
    assert b.build().token_id.tolist() == ids
    eng.release(first.request_id)
    with pytest.raises(EngineError, match="unknown request id"):
        eng.submit_continue(first.request_id, tool, params)


def test_evicted_cache_is_recomputed_exactly(make_engine, tiny, prompts, teacher):
    """Two slots, four conversations: continuing an evicted one re-prefills its context."""
    eng = make_engine(max_seqs=2)
    params = SamplingParams(temperature=1.0, max_new_tokens=6, seed=0)
    outs = [eng.submit(p, params).result(timeout=60) for p in prompts[:4]]
    assert eng.stats()["evictions"] >= 2
    nxt = eng.submit_continue(outs[0].request_id, [13, 14], params).result(timeout=60)
    ids = prompts[0] + outs[0].token_ids + [13, 14] + nxt.token_ids
    ref = teacher(tiny.model, ids)[-len(nxt.token_ids) :]
    np.testing.assert_allclose(nxt.logprob, ref.numpy(), atol=1e-4)


def test_stop_strings_and_stop_ids_end_the_turn(make_engine, tiny, prompts):
    eng = make_engine()
    free = generate(eng, prompts[1], SamplingParams(temperature=0.0, max_new_tokens=20))
    assert free.finish_reason == "length"
    # a stop string = the decoded text of the 6th token: the turn ends exactly there
    text = tiny.tokenizer.decode(free.token_ids[5:6])
    first = next(i for i in range(20) if text in tiny.tokenizer.decode(free.token_ids[: i + 1]))
    out = generate(
        eng, prompts[1], SamplingParams(temperature=0.0, max_new_tokens=20, stop=(text,))
    )
    assert out.finish_reason == "stop" and out.stop_match == text
    assert out.token_ids == free.token_ids[: first + 1]
    stop_id = free.token_ids[3]
    out = generate(eng, prompts[1], SamplingParams(temperature=0.0, max_new_tokens=20,
                                                   stop_token_ids=(stop_id,)))  # fmt: skip
    assert out.finish_reason == "stop" and out.stop_match == stop_id
    assert out.token_ids == free.token_ids[: free.token_ids.index(stop_id) + 1]


def test_eos_ends_a_turn_unless_disabled(make_engine, tiny, prompts):
    """The tokenizer's EOS / <|im_end|> ids end a turn with finish_reason 'eos'; with
    eos_stops=False they do not. (The random tiny model rarely samples them, so the test
    declares the 3rd greedy token an EOS id.)"""
    eng = make_engine()
    assert eng.eos_ids == frozenset(stop_token_ids(tiny.tokenizer))
    free = generate(eng, prompts[4], SamplingParams(temperature=0.0, max_new_tokens=30))
    eng.eos_ids = frozenset({free.token_ids[2]})
    out = generate(eng, prompts[4], SamplingParams(temperature=0.0, max_new_tokens=30))
    assert out.finish_reason == "eos" and out.stop_match == free.token_ids[2]
    assert out.token_ids == free.token_ids[: free.token_ids.index(free.token_ids[2]) + 1]
    no_eos = make_engine(eos_stops=False)
    assert no_eos.eos_ids == frozenset()
    out = generate(no_eos, prompts[4], SamplingParams(temperature=0.0, max_new_tokens=30))
    assert out.finish_reason == "length" and len(out.token_ids) == 30


def test_context_limit_ends_the_turn(make_engine, prompts):
    n = len(prompts[0])
    eng = make_engine(max_context=n + 5)
    out = generate(eng, prompts[0], SamplingParams(temperature=1.0, max_new_tokens=50, seed=0))
    assert out.finish_reason == "context" and len(out.token_ids) == 5


def test_streaming_callback_sees_every_token(make_engine, prompts):
    eng = make_engine()
    seen: list[int] = []
    fut = eng.submit(prompts[0], SamplingParams(temperature=1.0, max_new_tokens=9, seed=0),
                     on_token=lambda rid, t: seen.append(t))  # fmt: skip
    assert fut.result(timeout=60).token_ids == seen


def test_malformed_requests_are_rejected_without_disturbing_others(
    make_engine, tiny, prompts, teacher
):
    eng = make_engine(max_context=128)
    good = SamplingParams(temperature=1.0, max_new_tokens=40, seed=9)
    futs = [eng.submit(p, good) for p in prompts[:3]]  # running while the bad ones arrive
    V = eng.shape.vocab_size
    bad = [
        (lambda: eng.submit([], good), "empty prompt"),
        (lambda: eng.submit([1, V + 5, 2], good), r"prompt_ids\[1\] = 49157 is outside"),
        (lambda: eng.submit([1, -1], good), r"prompt_ids\[1\] = -1 is outside"),
        (lambda: eng.submit([1, 2], SamplingParams(max_new_tokens=0)), "max_new_tokens=0"),
        (lambda: eng.submit([1, 2], SamplingParams(max_new_tokens=-3)), "max_new_tokens=-3"),
        (lambda: eng.submit([5] * 128, good), "prompt has 128 tokens; max_context is 128"),
        (lambda: eng.submit([1], SamplingParams(top_p=0.0)), "top_p=0.0"),
        (lambda: eng.submit([1], SamplingParams(temperature=-1.0)), "temperature=-1.0"),
        (lambda: eng.submit([1], SamplingParams(stop_token_ids=(V,))), "stop_token_ids"),
        (lambda: eng.submit_continue("nope", [1], good), "unknown request id 'nope'"),
        (lambda: eng.cancel("nope"), "unknown request id"),
        (lambda: eng.release("nope"), "unknown request id"),
    ]
    for call, msg in bad:
        with pytest.raises(EngineError, match=msg):
            call()
    with pytest.raises(EngineError, match="already in use"):
        eng.submit([1, 2], good, request_id=futs[0].result(timeout=60).request_id)
    with pytest.raises(EngineError, match="context would be"):
        eng.submit_continue(futs[1].result(timeout=60).request_id, [7] * 120, good)
    for p, f in zip(prompts[:3], futs, strict=True):
        out = f.result(timeout=60)
        assert out.finish_reason == "length" and len(out.token_ids) == 40
        ref = teacher(tiny.model, p + out.token_ids)[len(p) :]
        np.testing.assert_allclose(out.logprob, ref.numpy(), atol=1e-4)
    assert eng.stats()["idle"] == 3


def test_continue_while_running_is_rejected(make_engine, prompts):
    eng = make_engine()
    fut = eng.submit(prompts[0], SamplingParams(temperature=1.0, max_new_tokens=200, seed=0),
                     request_id="busy")  # fmt: skip
    with pytest.raises(EngineError, match="still running"):
        eng.submit_continue("busy", [1], GREEDY)
    eng.cancel("busy")
    assert fut.result(timeout=60).finish_reason in ("cancelled", "length", "eos")


def test_cancel_and_release(make_engine, prompts):
    eng = make_engine(max_seqs=1)
    long = SamplingParams(temperature=1.0, max_new_tokens=200, seed=0)
    running = eng.submit(prompts[0], long, request_id="a")
    queued = eng.submit(prompts[1], long, request_id="b")  # waits: one slot
    eng.cancel("b")
    out_b = queued.result(timeout=60)
    assert out_b.finish_reason == "cancelled" and out_b.token_ids == []
    eng.release("a")  # releasing a running request cancels it first
    out_a = running.result(timeout=60)
    assert out_a.finish_reason in ("cancelled", "eos", "length")
    with pytest.raises(EngineError, match="unknown request id 'a'"):
        eng.cancel("a")
    assert eng.stats()["slots_used"] == 0 or eng.wait_idle(10)


def test_many_threads_submit_at_once(make_engine, tiny, prompts):
    eng = make_engine(max_seqs=4)
    params = SamplingParams(temperature=1.0, max_new_tokens=5)

    def conversation(i: int) -> int:
        out = eng.submit(prompts[i % 8], params).result(timeout=120)
        out2 = eng.submit_continue(out.request_id, [100 + i], params).result(timeout=120)
        eng.release(out.request_id)
        return len(out.token_ids) + len(out2.token_ids)

    with ThreadPoolExecutor(12) as pool:
        total = sum(pool.map(conversation, range(24)))
    assert total == eng.stats()["tokens_generated"]
    assert eng.wait_idle(10) and eng.stats()["slots_used"] == 0


def test_failure_in_the_scheduler_fails_the_futures(make_engine, prompts, monkeypatch):
    eng: LocalEngine = make_engine()
    import provrl.engine.local as local

    boom = threading.Event()

    def broken(*a, **k):
        boom.set()
        raise RuntimeError("kaboom")

    monkeypatch.setattr(local, "forward", broken)
    fut = eng.submit(prompts[0], GREEDY)
    with pytest.raises(EngineError, match="kaboom"):
        fut.result(timeout=60)
    assert boom.is_set()
    with pytest.raises(EngineError, match="failed"):
        eng.submit(prompts[0], GREEDY)


@pytest.mark.slow
def test_compiled_mlp_gives_the_same_tokens(make_engine, prompts, tiny, teacher):
    """EngineConfig.compile (torch.compile of the MLP block; ~35 s warm-up on CPU)."""
    eng = make_engine(compile=True)
    out = generate(eng, prompts[0], SamplingParams(temperature=1.0, max_new_tokens=8, seed=0))
    ref = teacher(tiny.model, prompts[0] + out.token_ids)[len(prompts[0]) :]
    np.testing.assert_allclose(out.logprob, ref.numpy(), atol=1e-4)


def test_engine_threads_apply_to_its_scheduler_thread_only(tiny):
    """EngineConfig.threads is set on the scheduler thread: the caller keeps its own count
    (torch's intra-op count is per thread), so a trainer thread beside it is unaffected."""
    import torch

    from provrl.engine import EngineConfig, LocalEngine

    before = torch.get_num_threads()
    eng = LocalEngine(tiny, EngineConfig(max_seqs=2, max_context=64, threads=1))
    try:
        assert torch.get_num_threads() == before
        assert eng._thread.is_alive()
    finally:
        eng.close()


def test_set_threads_applies_from_the_next_step_on_the_scheduler_thread(make_engine, prompts):
    """LocalEngine.set_threads (the async loop lending the learner's cores): every forward
    after the call runs with the new count on the scheduler thread; the caller keeps its own."""
    eng = make_engine(threads=1)
    seen: list[int] = []
    forward = eng._forward

    def spy(inputs):
        seen.append(torch.get_num_threads())
        return forward(inputs)

    eng._forward = spy
    caller = torch.get_num_threads()
    params = SamplingParams(temperature=1.0, max_new_tokens=3, seed=0)
    generate(eng, prompts[0], params)
    first = len(seen)
    assert eng.stats()["threads"] == 1
    eng.set_threads(2)
    generate(eng, prompts[1], params)
    assert seen[:first] == [1] * first and seen[first:] == [2] * (len(seen) - first)
    assert eng.stats()["threads"] == 2 and torch.get_num_threads() == caller
    with pytest.raises(EngineError, match="n must be >= 1"):
        eng.set_threads(0)

"""Hot-load: keep / recompute / drain keep every request, stamp versions, never mix weights."""

from __future__ import annotations

import inspect
import threading
import time

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from provrl.engine import EngineError, LocalEngine
from provrl.models import LoadedModel
from provrl.models.loading import tiny_config
from provrl.provenance import SamplingParams

LONG = SamplingParams(temperature=1.0, max_new_tokens=48)


def wait_tokens(eng: LocalEngine, n: float, timeout: float = 60) -> None:
    """Block until the engine has generated at least ``n`` tokens in total."""
    end = time.time() + timeout
    while eng.stats()["tokens_generated"] < n:
        assert time.time() < end, "engine made no progress"
        time.sleep(0.002)


def params(i: int) -> SamplingParams:
    return SamplingParams(temperature=1.0, max_new_tokens=48, seed=100 + i)


def check_exact(outs, prompts, models, teacher, *, only_pure_kv: bool) -> int:
    """Every token's logprob equals a teacher-forced forward of the model of its version
    (tokens whose KV mixes versions are skipped when ``only_pure_kv``). Returns #checked."""
    checked = 0
    for p, o in zip(prompts, outs, strict=True):
        ids = p + o.token_ids
        for v in set(o.version.tolist()):
            sel = (o.version == v) & ((o.kv_min == v) | (not only_pure_kv))
            if not sel.any():
                continue
            ref = teacher(models[v].model, ids)[len(p) :].numpy()
            np.testing.assert_allclose(o.logprob[sel], ref[sel], atol=1e-4, rtol=0)
            checked += int(sel.sum())
    return checked


def test_keep_swaps_between_steps_and_keeps_the_old_kv(
    make_engine, tiny, prompts, helpers, teacher
):
    eng = make_engine(audit_fraction=1.0)
    new = helpers.perturbed(tiny, 0.05, seed=1)
    futs = [eng.submit(p, params(i)) for i, p in enumerate(prompts[:6])]
    wait_tokens(eng, 30)
    rep = eng.load_weights(new, version=1, mode="keep")
    assert (rep.mode, rep.old_version, rep.new_version, rep.in_flight) == ("keep", 0, 1, 6)
    assert rep.update_ms > 0 and rep.recomputed_tokens == 0 and eng.version == 1
    outs = [f.result(timeout=120) for f in futs]
    assert all(o.finish_reason == "length" and len(o.token_ids) == 48 for o in outs)
    both = 0
    for o in outs:
        assert (np.diff(o.version) >= 0).all()  # never back to the old version
        assert (o.kv_min == 0).all()  # the prompt's KV is from version 0 throughout
        assert (o.kv_max == o.version).all()
        both += int(0 < (o.version == 1).sum() < len(o.version))
    assert both >= 1  # the swap really happened mid-turn
    models = {0: tiny, 1: helpers.with_state(tiny, new, "v1")}
    assert check_exact(outs, prompts[:6], models, teacher, only_pure_kv=True) > 0
    # the next turn of a kept request: new version, old KV
    nxt = eng.submit_continue(outs[0].request_id, [10, 11], params(0)).result(timeout=60)
    assert (nxt.version == 1).all() and (nxt.kv_min == 0).all()
    # a new request copies the shared system prompt's (old) KV: its stamps say so …
    fresh = eng.submit(prompts[7], params(7)).result(timeout=60)
    assert (fresh.version == 1).all() and (fresh.kv_min == 0).all()
    # … unless the prefix cache is off
    cold = make_engine(prefix_cache=False)
    cold.load_weights(new, version=1)
    assert (cold.submit(prompts[7], params(7)).result(timeout=60).kv_min == 1).all()
    # the KV-staleness audit compared post-swap tokens against a from-scratch recompute
    eng.wait_idle(60)
    s = eng.stats()
    assert s["kv_staleness_samples"] > 0 and 0 < s["kv_staleness_mean_abs"] < 1.0


def cached_execution_logprobs(models, prompt, out) -> np.ndarray:
    """log q of a keep-mode turn's tokens as the engine computed them, rebuilt with plain HF
    forwards: a token stamped v is sampled from logits of a step run under v, and that step
    computed the KV of its input — so the KV of position j comes from the version of token
    j + 1, the prompt's (prefilled before the swap) from version 0. Version-0 positions
    run through model 0, the rest through model 1 on top of model 0's cache."""
    ids = torch.tensor([prompt + out.token_ids])
    n_old = int((out.version == 0).sum())  # the swap came after these tokens (versions rise)
    m = len(prompt) + n_old - 1  # positions whose KV is version 0
    with torch.no_grad():
        first = models[0].model(input_ids=ids[:, :m], use_cache=True)
        # transformers renamed past_key_values to cache (both in, and out) during 5.x
        name = "cache" if "cache" in inspect.signature(models[1].model.forward).parameters else "past_key_values"  # fmt: skip
        rest = models[1].model(input_ids=ids[:, m:], **{name: getattr(first, name)})
        logits = torch.cat([first.logits[0], rest.logits[0]]).double()
    lp = torch.log_softmax(logits[:-1], -1).gather(-1, ids[0, 1:, None])[:, 0]
    return lp[len(prompt) - 1 :].numpy()  # token t of the turn is predicted at position t-1


def test_keep_tokens_after_a_swap_are_the_cached_execution_and_the_audit_measures_them(
    make_engine, tiny, prompts, helpers, teacher
):
    """The tokens ``check_exact(only_pure_kv=True)`` skips: sampled under v1 while attending
    to v0 KV. Their recorded log q must be the mixed-KV execution (rebuilt independently),
    and the KV-staleness audit's figures must be |log q_fresh − log q_recorded| over exactly
    these tokens, with log q_fresh a from-scratch v1 forward."""
    eng = make_engine(audit_fraction=1.0, audit_max_tokens=64)
    new = helpers.perturbed(tiny, 0.05, seed=1)
    futs = [eng.submit(p, params(i)) for i, p in enumerate(prompts[:6])]
    wait_tokens(eng, 30)
    eng.load_weights(new, version=1, mode="keep")
    outs = [f.result(timeout=120) for f in futs]
    eng.wait_idle(60)
    models = {0: tiny, 1: helpers.with_state(tiny, new, "v1")}
    stale_diffs = []
    for p, o in zip(prompts[:6], outs, strict=True):
        assert (o.kv_min == 0).all() and (np.diff(o.version) >= 0).all()
        np.testing.assert_allclose(o.logprob, cached_execution_logprobs(models, p, o), atol=1e-4)
        stale = o.version == 1  # kv_min 0 < version 1: attended to older KV
        fresh = teacher(models[1].model, p + o.token_ids)[len(p) :].numpy()
        stale_diffs += np.abs(fresh[stale] - o.logprob[stale]).tolist()
    s = eng.stats()
    assert s["kv_staleness_samples"] == len(stale_diffs) > 0
    assert s["kv_staleness_support_misses"] == 0
    assert s["kv_staleness_mean_abs"] == pytest.approx(np.mean(stale_diffs), abs=1e-4)
    assert s["kv_staleness_max_abs"] == pytest.approx(max(stale_diffs), abs=1e-4)
    assert np.mean(stale_diffs) > 1e-3  # stale KV really differs from a recompute here


def test_audit_sees_no_staleness_when_the_weights_do_not_change(make_engine, tiny, prompts):
    eng = make_engine(audit_fraction=1.0)
    futs = [eng.submit(p, params(i)) for i, p in enumerate(prompts[:4])]
    wait_tokens(eng, 20)
    eng.load_weights(tiny.model.state_dict(), version=1, mode="keep")
    [f.result(timeout=120) for f in futs]
    eng.wait_idle(60)
    s = eng.stats()
    assert s["kv_staleness_samples"] > 0 and s["kv_staleness_max_abs"] < 1e-4


def test_recompute_collapses_kv_versions_and_stays_exact(
    make_engine, tiny, prompts, helpers, teacher
):
    eng = make_engine()
    new = helpers.perturbed(tiny, 0.05, seed=2)
    futs = [eng.submit(p, params(i)) for i, p in enumerate(prompts[:6])]
    wait_tokens(eng, 30)
    rep = eng.load_weights(new, version=3, mode="recompute")
    assert rep.in_flight == 6 and rep.recomputed_tokens >= sum(len(p) for p in prompts[:6])
    outs = [f.result(timeout=120) for f in futs]
    assert all(o.finish_reason == "length" for o in outs)
    for o in outs:
        assert set(o.version.tolist()) <= {0, 3}
        assert (o.kv_min == o.version).all() and (o.kv_max == o.version).all()
    models = {0: tiny, 3: helpers.with_state(tiny, new, "v3")}
    n = check_exact(outs, prompts[:6], models, teacher, only_pure_kv=False)
    assert n == sum(len(o.token_ids) for o in outs)  # every token, old or new version


def test_drain_finishes_in_flight_turns_on_the_old_weights(
    make_engine, tiny, prompts, helpers, teacher
):
    eng = make_engine()
    new = helpers.perturbed(tiny, 0.05, seed=3)
    done = eng.submit(prompts[6], SamplingParams(max_new_tokens=2, seed=6)).result(timeout=60)
    futs = [eng.submit(p, params(i)) for i, p in enumerate(prompts[:4])]
    wait_tokens(eng, 10)
    reports = []
    loader = threading.Thread(target=lambda: reports.append(eng.load_weights(new, 1, "drain")))
    loader.start()
    while eng.stats()["hotloads_pending"] < 1 and loader.is_alive():
        time.sleep(0.001)
    late = eng.submit(prompts[5], params(5))  # arrives during the drain: waits for v1
    cont = eng.submit_continue(done.request_id, [9], params(6))  # queued with its old KV
    loader.join(120)
    (rep,) = reports
    assert rep.mode == "drain" and rep.in_flight == 5  # 4 generating + 1 between turns
    c = eng.stats()  # one drain, which reset the caches of all 5 (finished, idle, queued)
    assert (c["hotloads"], c["drains"], c["cache_resets"], c["drain_evictions"]) == (1, 1, 1, 5)
    assert c["drain_wait_s"] > 0 and c["evictions"] >= 5
    outs = [f.result(timeout=10) for f in futs]
    assert all(o.finish_reason == "length" and (o.version == 0).all() for o in outs)
    late_out = late.result(timeout=60)
    assert (late_out.version == 1).all() and (late_out.kv_min == 1).all()
    cont_out = cont.result(timeout=60)  # its old KV was dropped: re-prefilled under v1
    assert (cont_out.version == 1).all() and (cont_out.kv_min == 1).all()
    models = {0: tiny, 1: helpers.with_state(tiny, new, "v1")}
    check_exact(outs, prompts[:4], models, teacher, only_pure_kv=False)
    check_exact([late_out], prompts[5:6], models, teacher, only_pure_kv=False)
    # caches were reset: the next turn of an old conversation is recomputed under v1
    nxt = eng.submit_continue(outs[0].request_id, [10], params(0)).result(timeout=60)
    assert (nxt.kv_min == 1).all()
    ids = prompts[0] + outs[0].token_ids + [10] + nxt.token_ids
    ref = teacher(models[1].model, ids)[-len(nxt.token_ids) :].numpy()
    np.testing.assert_allclose(nxt.logprob, ref, atol=1e-4)


# --------------------------------------------------------------------------- atomicity
def signature_model(tokenizer) -> LoadedModel:
    """An untied tiny Llama (its lm_head is free to carry a version signature)."""
    from transformers import LlamaForCausalLM

    cfg = tiny_config(len(tokenizer), tokenizer.bos_token_id, tokenizer.eos_token_id,
                      tokenizer.pad_token_id)  # fmt: skip
    cfg.tie_word_embeddings = False
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg).eval()
    return LoadedModel(model, tokenizer, "untied", None, "untied")


def signed_state(base: dict[str, torch.Tensor], v: int) -> tuple[dict, set[int]]:
    """Version v: every tensor shifted by v-specific noise, and an lm_head that is zero
    except rows (a, b) = (+c·u, −c·u), so a greedy token of version v is a or b."""
    g = torch.Generator().manual_seed(1000 + v)
    sd = {k: t + 0.02 * torch.randn(t.shape, generator=g) for k, t in base.items()}
    u = torch.randn(sd["lm_head.weight"].shape[1], generator=g)
    a, b = 1000 + 2 * v, 1001 + 2 * v
    head = torch.zeros_like(sd["lm_head.weight"])
    head[a], head[b] = 50 * u / u.norm(), -50 * u / u.norm()
    sd["lm_head.weight"] = head
    return sd, {a, b}


def test_no_token_is_sampled_from_half_updated_weights(tiny, prompts):
    """Versions are told apart by their output tokens. While 8 greedy requests run, a thread
    swaps through 7 versions (keep, recompute, drain). Every token must belong to the
    signature of the version it is stamped with: a step on a mix of two versions'
    tensors, or a stamp from the wrong version, would show up as a foreign token."""
    lm = signature_model(tiny.tokenizer)
    base = {k: v.detach().clone() for k, v in lm.model.state_dict().items()}
    states = [signed_state(base, v) for v in range(8)]
    lm.model.load_state_dict(states[0][0])
    from provrl.engine import EngineConfig

    eng = LocalEngine(lm, EngineConfig(max_seqs=8, max_context=512, eos_stops=False))
    try:
        greedy = SamplingParams(temperature=0.0, max_new_tokens=150)
        futs = [eng.submit(p, greedy) for p in prompts]
        modes = ["keep", "recompute", "keep", "keep", "recompute", "keep", "drain"]
        reports = []
        for v, mode in enumerate(modes, start=1):
            wait_tokens(eng, 60 * v)
            reports.append(eng.load_weights(states[v][0], version=v, mode=mode))
        outs = [f.result(timeout=120) for f in futs]
    finally:
        eng.close()
    seen = set()
    for o in outs:
        assert o.finish_reason == "length"
        for tok, v in zip(o.token_ids, o.version.tolist(), strict=True):
            assert tok in states[v][1], f"token {tok} stamped v{v}, signature {states[v][1]}"
            seen.add(v)
    assert len(seen) >= 5  # the requests really lived through many versions
    assert all(r.in_flight == 8 for r in reports)


# --------------------------------------------------------------------------- sources, errors
def test_load_from_safetensors_file_and_directory(
    make_engine, tiny, prompts, helpers, tmp_path, teacher
):
    new = helpers.perturbed(tiny, 0.05, seed=4)
    new = {k: v.contiguous() for k, v in new.items() if k != "lm_head.weight"}
    save_file(new, str(tmp_path / "model.safetensors"))
    shards = tmp_path / "sharded"
    shards.mkdir()
    keys = sorted(new)
    save_file({k: new[k] for k in keys[:7]}, str(shards / "a.safetensors"))
    save_file({k: new[k] for k in keys[7:]}, str(shards / "b.safetensors"))
    ref_model = helpers.with_state(tiny, new, "new").model
    for version, source in ((1, tmp_path / "model.safetensors"), (2, shards)):
        eng = make_engine()
        rep = eng.load_weights(source, version=version)
        assert rep.new_version == version == eng.version
        out = eng.submit(prompts[0], params(0)).result(timeout=60)
        ref = teacher(ref_model, prompts[0] + out.token_ids)[len(prompts[0]) :].numpy()
        np.testing.assert_allclose(out.logprob, ref, atol=1e-4)


def test_bad_hot_loads_are_rejected_and_change_nothing(make_engine, tiny, prompts, tmp_path):
    eng = make_engine()
    sd = tiny.model.state_dict()
    with pytest.raises(EngineError, match="must be newer"):
        eng.load_weights(sd, version=0)
    with pytest.raises(EngineError, match="mode 'hot'"):
        eng.load_weights(sd, version=1, mode="hot")  # type: ignore[arg-type]
    bad = dict(sd)
    bad["model.norm.weight"] = torch.ones(7)
    with pytest.raises(EngineError, match=r"model\.norm\.weight"):
        eng.load_weights(bad, version=1)
    with pytest.raises(EngineError, match="no such file"):
        eng.load_weights(tmp_path / "missing.safetensors", version=1)
    (tmp_path / "junk.safetensors").write_bytes(b"not a safetensors file")
    with pytest.raises(EngineError, match=r"junk\.safetensors"):
        eng.load_weights(tmp_path / "junk.safetensors", version=1)
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(EngineError, match=r"no \*\.safetensors"):
        eng.load_weights(empty, version=1)
    assert eng.version == 0
    out = eng.submit(prompts[0], params(0)).result(timeout=60)
    assert out.finish_reason == "length" and (out.version == 0).all()


def test_top_p_reaches_the_sampler_and_the_audit_in_float64(
    make_engine, tiny, prompts, monkeypatch
):
    """Issue 13: the engine rounded top_p to float32 (p = 0.9 → 0.89999998) in _plan and
    _run_audits, so a nucleus could stop short of p while the diagnostics use float64."""
    import provrl.engine.local as local

    seen: dict[str, list[torch.Tensor]] = {"sample": [], "audit": []}
    real_sample, real_audit = local.sample, local.behaviour_logprob

    def spy_sample(logits, temperature, top_k, top_p, u):
        seen["sample"].append(top_p)
        return real_sample(logits, temperature, top_k, top_p, u)

    def spy_audit(logits, tokens, temperature, top_k, top_p):
        seen["audit"].append(top_p)
        return real_audit(logits, tokens, temperature, top_k, top_p)

    monkeypatch.setattr(local, "sample", spy_sample)
    monkeypatch.setattr(local, "behaviour_logprob", spy_audit)
    eng = make_engine(audit_fraction=1.0)
    p = SamplingParams(temperature=1.0, top_p=0.9, max_new_tokens=32, seed=1)
    futs = [eng.submit(q, p) for q in prompts[:2]]
    wait_tokens(eng, 10)
    eng.load_weights(tiny.model.state_dict(), version=1, mode="keep")
    [f.result(timeout=120) for f in futs]
    eng.wait_idle(60)
    assert seen["sample"] and seen["audit"]
    for top_p in seen["sample"] + seen["audit"]:
        assert top_p.dtype == torch.float64 and bool((top_p == 0.9).all())


@pytest.mark.parametrize("mode", ["keep", "recompute", "drain"])
def test_load_weights_async_from_on_token_swaps_at_that_token(make_engine, tiny, prompts, helpers, mode):  # fmt: skip
    """Called on the scheduler thread after the 5th token, the swap lands right there:
    tokens 0-4 under v0 and the rest under v1 (keep, recompute); drain finishes the turn."""
    eng = make_engine(eos_stops=False)
    new = helpers.perturbed(tiny, 0.05, seed=1)
    got: list = []
    refused: list = []

    def on_token(rid: str, tok: int) -> None:
        got.append(tok)
        if len(got) == 5:
            with pytest.raises(EngineError, match="load_weights_async"):
                eng.load_weights(new, version=1, mode=mode)  # would wait for itself
            refused.append(True)
            got.append(eng.load_weights_async(new, version=1, mode=mode))

    out = eng.submit(prompts[0], SamplingParams(max_new_tokens=12, seed=3), on_token=on_token).result(timeout=120)  # fmt: skip
    rep = got[5].result(timeout=120)
    assert refused and (rep.mode, rep.new_version, eng.version) == (mode, 1, 1)
    split = 12 if mode == "drain" else 5
    assert out.version.tolist() == [0] * split + [1] * (12 - split)
    kv_min = out.version.tolist() if mode == "recompute" else [0] * 12
    assert out.kv_min.tolist() == kv_min

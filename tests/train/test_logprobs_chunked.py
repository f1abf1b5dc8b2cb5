"""Chunked teacher-forced logprobs: same values and gradients as the full log-softmax."""

from __future__ import annotations

import copy

import pytest
import torch

from provrl.objectives.diagnostics import support_excluded_mass
from provrl.train.logprobs import token_logprobs, token_logprobs_chunked


@pytest.fixture(scope="module")
def ragged():
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 49152, (3, 12), generator=g)
    attn = torch.ones(3, 12, dtype=torch.bool)
    attn[1, 8:] = False
    attn[2, 5:] = False
    return ids, attn


def test_values_match_the_full_log_softmax(tiny, ragged):
    ids, attn = ragged
    pos = attn.clone()
    pos[:, 0] = False
    with torch.no_grad():
        full = token_logprobs(tiny.model, ids, attn, temperature=0.7)
        for chunk in (1, 5, 4096):
            out = token_logprobs_chunked(tiny.model, ids, attn, temperature=0.7, chunk_tokens=chunk)
            torch.testing.assert_close(out.logprobs[pos], full[pos], atol=1e-5, rtol=0)
            assert torch.equal(out.logprobs[~pos], torch.zeros(int((~pos).sum())))


def test_gradients_match_the_full_log_softmax(tiny, ragged):
    ids, attn = ragged
    pos = attn.clone()
    pos[:, 0] = False
    model = copy.deepcopy(tiny.model)
    weights = torch.randn(ids.shape, generator=torch.Generator().manual_seed(1))
    grads = []
    for fn in (
        lambda: token_logprobs(model, ids, attn),
        lambda: token_logprobs_chunked(model, ids, attn, chunk_tokens=4).logprobs,
    ):
        model.zero_grad()
        (fn() * weights * pos).sum().backward()
        grads.append(torch.cat([p.grad.flatten() for p in model.parameters()]))
    # float32 accumulation order differs (chunks, recompute): compare at float32 noise level
    torch.testing.assert_close(grads[1], grads[0], rtol=0, atol=1e-5 * float(grads[0].abs().max()))


def test_positions_per_row_temperature_entropy_and_support(tiny, ragged):
    ids, attn = ragged
    pos = torch.zeros_like(attn)
    pos[0, 3:7] = True
    pos[2, 2:5] = True
    temp = torch.tensor([0.5, 1.0, 2.0])
    with torch.no_grad():
        out = token_logprobs_chunked(
            tiny.model,
            ids,
            attn,
            positions=pos,
            temperature=temp,
            chunk_tokens=3,
            with_entropy=True,
            top_p=torch.tensor([0.9, 1.0, 1.0], dtype=torch.float64),
            top_k=torch.tensor([0, 0, 50]),
        )
        logits = tiny.model(input_ids=ids, attention_mask=attn.long()).logits.double()
    for b, t in pos.nonzero().tolist():
        z = logits[b, t - 1] / temp[b]
        logp = torch.log_softmax(z, -1)
        assert float(out.logprobs[b, t]) == pytest.approx(float(logp[ids[b, t]]), abs=1e-5)
        assert out.entropy is not None and out.excluded_mass is not None
        ent = float(-(logp.exp() * logp).sum())
        assert float(out.entropy[b, t]) == pytest.approx(ent, abs=1e-4)
        top_p, top_k = (0.9, 0) if b == 0 else (1.0, 50)
        exc = float(support_excluded_mass(z, top_p=top_p, top_k=top_k))
        assert float(out.excluded_mass[b, t]) == pytest.approx(exc, abs=1e-5)
    assert out.excluded_mass is not None and float(out.excluded_mass[2, 3]) > 0.9  # top-50 of 49k
    assert torch.equal(out.logprobs[~pos], torch.zeros(int((~pos).sum())))


def test_rejects_undefined_positions_and_bad_temperature(tiny, ragged):
    ids, attn = ragged
    with pytest.raises(ValueError, match="position 0"):
        token_logprobs_chunked(tiny.model, ids, attn, positions=attn)
    with pytest.raises(ValueError, match="temperature"):
        token_logprobs_chunked(tiny.model, ids, attn, temperature=torch.tensor([1.0, 0.0, 1.0]))


@pytest.mark.slow
def test_logprob_benchmark_runs_and_measures_both_methods():
    from provrl.bench.logprobs import run_logprob_benchmark

    r = run_logprob_benchmark("tiny", batch=2, seq_len=128, chunk_tokens=64, repeats=1)
    assert r["full_s"] > 0 and r["chunked_s"] > 0 and r["time_ratio"] > 0
    assert r["full_peak_mib"] > r["chunked_peak_mib"] > 0

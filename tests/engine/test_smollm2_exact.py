"""SmolLM2-135M in the default suite: a few sequences, each action token's recorded log q
against a plain transformers forward of the same ids — untruncated at T = 1, and top-p 0.9 at
T = 0.7 with the truncation written out here (the slow test in test_bench.py runs 8 × 48).
Costs one model load (≈ 15 s on 2 cores) and 3 × 2 short turns."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from provrl.bench.engine import bench_prompts
from provrl.engine import EngineConfig, LocalEngine
from provrl.provenance import SamplingParams

TOL = 1e-4
NEW_TOKENS = 12


def top_p_log_q(logits: torch.Tensor, token: int, temperature: float, top_p: float):
    """log q(token) and the kept mass after temperature and top-p (keep the most likely
    tokens while the mass before each is below p; renormalise), in float64."""
    p = torch.softmax(logits.double() / temperature, -1)
    ps, order = p.sort(descending=True)
    keep_sorted = (ps.cumsum(-1) - ps) < top_p
    keep = torch.zeros_like(keep_sorted).scatter(-1, order, keep_sorted)
    kept = float(p[keep].sum())
    return (float(p[token].log()) - np.log(kept) if keep[token] else -np.inf), kept


@pytest.fixture(scope="module")
def smollm2():
    from provrl.models import load_model

    lm = load_model("smollm2-135m")
    with LocalEngine(lm, EngineConfig(max_seqs=4, max_context=256, eos_stops=False)) as eng:
        yield lm, eng


@pytest.mark.parametrize(("temperature", "top_p"), [(1.0, 1.0), (0.7, 0.9)])
def test_smollm2_recorded_logprobs_are_exact(smollm2, temperature, top_p):
    lm, eng = smollm2
    prompts = bench_prompts(lm.tokenizer, 3)
    params = SamplingParams(temperature=temperature, top_p=top_p, max_new_tokens=NEW_TOKENS, seed=1)
    outs = [f.result() for f in [eng.submit(p, params) for p in prompts]]
    for o in outs:
        eng.release(o.request_id)
    worst = 0.0
    for p, o in zip(prompts, outs, strict=True):
        assert len(o.token_ids) == NEW_TOKENS
        ids = torch.tensor([p + list(o.token_ids)])
        with torch.no_grad():
            logits = lm.model(input_ids=ids).logits[0].float()
        for j, a in enumerate(o.token_ids):
            ref, kept = top_p_log_q(logits[len(p) + j - 1], a, temperature, top_p)
            worst = max(worst, abs(ref - float(o.logprob[j])))
            assert abs(kept - float(o.kept_mass[j])) <= TOL
    assert worst <= TOL, f"max |log q − teacher forcing| = {worst:.2e}"

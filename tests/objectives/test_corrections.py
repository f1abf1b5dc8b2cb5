"""Each correction against a hand computation on a 2 × 4 batch.

Row 0 has actions at t = 1, 2, 3; row 1 at t = 1, 2 (t = 3 is padding). Probabilities:

    row 0: q = (.5, .25, .8), π_prox = π_θ = (.6, .2, .8) → ρ = (1.2, 0.8, 1.0), w = 0.96
    row 1: q = (.1, .5),      π_prox = π_θ = (.4, .5)     → ρ = (4.0, 1.0),      w = 4.0
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from provrl.objectives.corrections import (
    CORRECTIONS,
    correct,
    decoupled,
    geo_mask,
    geometric_mean_log_ratio,
    gspo,
    icepop,
    on_policy,
    seq_mis,
    seq_tis,
    sequence_log_weight,
    tis,
    token_is,
    token_ratio,
)

NAN = math.nan
MASK = torch.tensor([[False, True, True, True], [False, True, True, False]])
Q = torch.tensor([[NAN, 0.5, 0.25, 0.8], [NAN, 0.1, 0.5, NAN]])
P = torch.tensor([[NAN, 0.6, 0.2, 0.8], [NAN, 0.4, 0.5, NAN]])
LOGQ = Q.log()
LOGPROX = P.log()


def logp() -> torch.Tensor:
    return P.log().clone().requires_grad_(True)


def on_mask(x: torch.Tensor) -> list[float]:
    return [round(float(v), 5) for v in x.detach()[MASK]]


def test_on_policy_ratio_is_one_with_score_function_gradient():
    lp = logp()
    c = on_policy(lp, LOGPROX, MASK)
    assert on_mask(c.ratio) == [1.0] * 5 and on_mask(c.weight) == [1.0] * 5
    c.ratio[MASK].sum().backward()
    assert lp.grad is not None
    assert on_mask(lp.grad) == [1.0] * 5  # d r/d log π = r = 1
    assert torch.equal(lp.grad[~MASK], torch.zeros(3))


def test_token_is_ratio_against_recorded_behaviour():
    c = token_is(logp(), LOGQ, MASK)
    assert on_mask(c.ratio) == [1.2, 0.8, 1.0, 4.0, 1.0]
    assert on_mask(c.weight) == [1.0] * 5
    assert torch.equal(c.ratio[~MASK], torch.ones(3))


def test_tis_truncates_the_behaviour_weight():
    c = tis(logp(), LOGPROX, LOGQ, MASK, cap=2.0)
    assert on_mask(c.ratio) == [1.0] * 5
    assert on_mask(c.weight) == [1.2, 0.8, 1.0, 2.0, 1.0]
    assert on_mask(tis(logp(), LOGPROX, LOGQ, MASK, cap=None).weight) == [1.2, 0.8, 1.0, 4.0, 1.0]


def test_icepop_masks_tokens_outside_the_band():
    c = icepop(logp(), LOGPROX, LOGQ, MASK, low=0.9, high=2.0)
    assert c.mask.tolist() == [[False, True, False, True], [False, False, True, False]]
    assert c.weight[c.mask].tolist() == pytest.approx([1.2, 1.0, 1.0])
    assert torch.equal(c.weight[~c.mask], torch.zeros(5))


def test_seq_tis_uses_the_exact_product_and_truncates():
    c = seq_tis(logp(), LOGPROX, LOGQ, MASK, cap=2.0)
    assert on_mask(c.weight) == [0.96, 0.96, 0.96, 2.0, 2.0]
    assert on_mask(seq_tis(logp(), LOGPROX, LOGQ, MASK, cap=None).weight)[3] == 4.0


def test_seq_mis_drops_whole_sequences():
    c = seq_mis(logp(), LOGPROX, LOGQ, MASK, low=0.5, high=2.0)
    assert c.mask.tolist() == [[False, True, True, True], [False, False, False, False]]
    assert on_mask(c.weight) == [0.96, 0.96, 0.96, 0.0, 0.0]


def test_geometric_mean_mask():
    g = geometric_mean_log_ratio(LOGPROX, LOGQ, MASK).exp()
    assert g.tolist() == pytest.approx([0.96 ** (1 / 3), 2.0])
    c = geo_mask(logp(), LOGPROX, LOGQ, MASK, low=0.5, high=1.5)
    assert c.mask[0].tolist() == MASK[0].tolist() and not c.mask[1].any()
    assert on_mask(c.weight) == [1.0, 1.0, 1.0, 0.0, 0.0]


def test_decoupled_weight_is_prox_over_behaviour_and_drops_above_cap():
    c = decoupled(logp(), LOGPROX, LOGQ, MASK, cap=2.0)
    assert c.mask[1].tolist() == [False, False, True, False]
    assert on_mask(c.weight) == [1.2, 0.8, 1.0, 0.0, 1.0]
    assert on_mask(c.ratio) == [1.0] * 5


def test_decoupled_trust_region_is_around_prox_not_behaviour():
    lp = (P * torch.tensor([[1, 1.5, 1, 1], [1, 1, 1, 1]])).log()  # π_θ moved on one token
    c = decoupled(lp, LOGPROX, LOGQ, MASK, cap=None)
    assert on_mask(c.ratio) == [1.5, 1.0, 1.0, 1.0, 1.0]
    assert on_mask(c.weight) == [1.2, 0.8, 1.0, 4.0, 1.0]


def test_gspo_sequence_ratio_and_its_gradient():
    lp = logp()
    c = gspo(lp, LOGQ, MASK)
    s0, s1 = 0.96 ** (1 / 3), 2.0
    assert on_mask(c.ratio) == [round(s0, 5)] * 3 + [s1] * 2
    # d s/d log π_t = s / |τ| for each action token; the loss sees s once per token
    c.ratio[0, 1].backward()
    assert lp.grad is not None
    assert lp.grad[0, 1:].tolist() == pytest.approx([s0 / 3] * 3)
    assert torch.equal(lp.grad[1], torch.zeros(4))


def test_dispatch_covers_every_correction_and_rejects_unknown():
    for name in CORRECTIONS:
        c = correct(name, logp(), LOGPROX, LOGQ, MASK, cap=2.0, low=0.5, high=2.0)
        assert c.ratio.shape == c.weight.shape == c.mask.shape == MASK.shape
        assert not (c.mask & ~MASK).any()
    with pytest.raises(ValueError, match="unknown correction 'ppo'"):
        correct("ppo", logp(), LOGPROX, LOGQ, MASK)


def test_log_space_weight_equals_exact_product_on_short_sequences():
    rng = np.random.default_rng(0)
    for _ in range(20):
        T = int(rng.integers(1, 8))
        p = rng.uniform(0.05, 1.0, size=(1, T))
        q = rng.uniform(0.05, 1.0, size=(1, T))
        m = rng.random((1, T)) < 0.7
        exact = float(np.prod(np.where(m, p / q, 1.0)))
        log_w = sequence_log_weight(
            torch.tensor(np.log(p)), torch.tensor(np.log(q)), torch.tensor(m)
        )
        assert math.exp(float(log_w)) == pytest.approx(exact, rel=1e-12)


def test_log_space_weight_survives_where_the_product_underflows():
    T = 2000
    logp_ = torch.full((1, T), math.log(1e-3), dtype=torch.float32)
    logq_ = torch.full((1, T), math.log(2e-3), dtype=torch.float32)
    m = torch.ones(1, T, dtype=torch.bool)
    assert float(torch.prod(logp_.exp()) / torch.prod(logq_.exp())) != pytest.approx(0.5**T)
    log_w = sequence_log_weight(logp_, logq_, m)
    assert float(log_w) == pytest.approx(T * math.log(0.5), rel=1e-6)


def test_ratio_never_overflows_and_ignores_nans_off_mask():
    lp = torch.tensor([[0.0, -1.0, NAN]], requires_grad=True)
    lq = torch.tensor([[-500.0, -1.0, -1.0]])
    m = torch.tensor([[True, True, False]])
    r = token_ratio(lp, lq, m, clamp=20.0)
    assert r.tolist()[0][:2] == pytest.approx([math.exp(20.0), 1.0])
    assert r[0, 2] == 1.0
    r.sum().backward()
    assert lp.grad is not None and torch.isfinite(lp.grad).all()

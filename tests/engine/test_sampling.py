"""The sampler: exact log q(a) and kept mass on fixed logits, and frequencies that match q."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy.stats import chisquare

from provrl.engine.sampling import behaviour_logprob, kept_set, sample

LOGITS = torch.tensor([2.0, 1.0, 0.5, 0.0, -1.0, -3.0])


def hand_q(logits: list[float], t: float, k: int, p: float) -> tuple[dict[int, float], float]:
    """q and kept mass by the definition, in plain Python (no torch)."""
    z = [x / t for x in logits]
    m = max(z)
    e = [math.exp(x - m) for x in z]
    s = sum(e)
    pi = [x / s for x in e]
    order = sorted(range(len(pi)), key=lambda i: -pi[i])
    top = order[:k] if k else order
    mass_k = sum(pi[i] for i in top)
    kept, before = [], 0.0
    for i in top:
        if before < p * mass_k or p >= 1:
            kept.append(i)
        before += pi[i]
    mass = sum(pi[i] for i in kept)
    return {i: pi[i] / mass for i in kept}, mass


def run(logits: torch.Tensor, t: float, k: int, p: float, u: float):
    R = logits.shape[0]
    return sample(
        logits,
        torch.full((R,), t),
        torch.full((R,), k, dtype=torch.int64),
        torch.full((R,), p),
        torch.full((R,), u, dtype=torch.float64),
    )


@pytest.mark.parametrize(
    "t,k,p",
    [(1.0, 0, 1.0), (0.7, 0, 1.0), (1.0, 3, 1.0), (1.0, 0, 0.8), (1.3, 4, 0.6), (0.5, 2, 0.99)],
)
def test_logprob_and_kept_mass_match_hand_computation(t, k, p):
    q, mass = hand_q(LOGITS.tolist(), t, k, p)
    # Inversion order: vocabulary order for untruncated rows, descending probability for
    # truncated ones. u at the middle of token a's cumulative-q interval must draw a.
    order = sorted(q) if (k == 0 and p >= 1) else sorted(q, key=lambda i: -q[i])
    cum = np.cumsum([q[i] for i in order])
    mids = torch.tensor(cum - np.array([q[i] for i in order]) / 2, dtype=torch.float64)
    n = len(order)
    out = sample(
        LOGITS.repeat(n, 1),
        torch.full((n,), t),
        torch.full((n,), k, dtype=torch.int64),
        torch.full((n,), p),
        mids,
    )
    assert out.token.tolist() == order  # every token of S, and only those, can be drawn
    for a, lp, m in zip(order, out.logprob.tolist(), out.kept_mass.tolist(), strict=True):
        assert lp == pytest.approx(math.log(q[a]), abs=1e-6)
        assert m == pytest.approx(mass, abs=1e-6)


def test_greedy_records_zero_logprob_and_the_argmax_mass():
    out = run(LOGITS[None], 0.0, 0, 1.0, 0.5)
    assert out.token.item() == 0 and out.logprob.item() == 0.0
    assert out.kept_mass.item() == pytest.approx(torch.softmax(LOGITS, -1)[0].item(), abs=1e-7)


def test_untruncated_temperature_one_keeps_all_mass():
    out = run(torch.randn(4, 1000), 1.0, 0, 1.0, 0.3)
    assert torch.all(out.kept_mass == 1.0)


def test_wide_nucleus_widens_the_head_until_it_fits():
    """Flat logits over 20 000 tokens: the nucleus needs > 4096 tokens, so kept_set widens
    its top-k head several times; the result equals a full sort."""
    g = torch.Generator().manual_seed(0)
    z = torch.randn(3, 20_000, generator=g) * 0.1
    ks = kept_set(z, torch.zeros(3, dtype=torch.int64), torch.tensor([0.5, 0.9, 0.999]))
    p = torch.softmax(z.double(), -1)
    ps, _ = torch.sort(p, -1, descending=True)
    before = ps.cumsum(-1) - ps
    for r, top_p in enumerate([0.5, 0.9, 0.999]):
        expect = ps[r][before[r] < top_p].sum()
        assert ks.kept_mass[r].item() == pytest.approx(expect.item(), rel=1e-9)
        assert int(ks.keep[r].sum()) == int((before[r] < top_p).sum()) > 4096 * (r > 0)


@pytest.mark.parametrize("t,k,p", [(1.0, 0, 1.0), (0.8, 0, 0.9), (1.0, 3, 1.0), (1.5, 4, 0.7)])
def test_frequencies_match_q_chi_square(t, k, p):
    q, _ = hand_q(LOGITS.tolist(), t, k, p)
    n = 6000
    rng = np.random.default_rng(1234)
    u = torch.from_numpy(rng.random(n))
    out = sample(
        LOGITS.repeat(n, 1),
        torch.full((n,), t),
        torch.full((n,), k, dtype=torch.int64),
        torch.full((n,), p),
        u,
    )
    tokens = sorted(q)
    counts = np.bincount(out.token.numpy(), minlength=len(LOGITS))
    assert counts[[i for i in range(len(LOGITS)) if i not in q]].sum() == 0
    stat = chisquare(counts[tokens], f_exp=[q[i] * n for i in tokens])
    assert stat.pvalue > 1e-3


def test_behaviour_logprob_reproduces_sample():
    g = torch.Generator().manual_seed(3)
    logits = torch.randn(32, 500, generator=g) * 3
    temp = torch.tensor([0.0, 0.7, 1.0, 1.2] * 8)
    top_k = torch.tensor([0, 0, 5, 40] * 8)
    top_p = torch.tensor([1.0, 0.9, 1.0, 0.8] * 8)
    out = sample(logits, temp, top_k, top_p, torch.rand(32, generator=g, dtype=torch.float64))
    again = behaviour_logprob(logits, out.token, temp, top_k, top_p)
    torch.testing.assert_close(again.logprob, out.logprob, atol=1e-5, rtol=0)
    torch.testing.assert_close(again.kept_mass, out.kept_mass, atol=1e-6, rtol=0)
    outside = behaviour_logprob(logits[2:3], torch.tensor([int(logits[2].argmin())]),
                                temp[2:3], top_k[2:3], top_p[2:3])  # fmt: skip
    assert outside.logprob.item() == float("-inf")


def test_a_nucleus_reaches_p_exactly_at_the_float32_boundary():
    """π(top) = 0.89999999 lies between float32(0.9) = 0.899999976 and 0.9: the nucleus
    for p = 0.9 needs a second token. With p rounded to float32 it stopped at mass
    0.89999999 < p; in float64 it matches support_excluded_mass (float64 too)."""
    from provrl.objectives.diagnostics import support_excluded_mass

    probs = torch.tensor([0.89999999, 0.06, 0.04000001], dtype=torch.float64)
    z = probs.log().float()[None]
    kept64 = kept_set(z, torch.tensor([0]), torch.tensor([0.9], dtype=torch.float64))
    kept32 = kept_set(z, torch.tensor([0]), torch.tensor([0.9], dtype=torch.float32))
    assert int(kept64.keep.sum()) == 2 and float(kept64.kept_mass[0]) >= 0.9
    assert int(kept32.keep.sum()) == 1 and float(kept32.kept_mass[0]) < 0.9  # the old bug
    excluded = float(support_excluded_mass(z.double(), top_p=0.9))
    assert excluded == pytest.approx(1 - float(kept64.kept_mass[0]), abs=1e-12)

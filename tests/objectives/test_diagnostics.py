"""Diagnostics against hand computations and against transformers' own top-k/top-p."""

from __future__ import annotations

import math

import pytest
import torch

from provrl.objectives.diagnostics import (
    behaviour_kl,
    effective_sample_size,
    exact_sequence_log_weight,
    lag_summary,
    nonfinite_count,
    ratio_quantiles,
    support_excluded_mass,
    trajectory_ess,
    truncation_stats,
    tv_estimate,
    version_lag_histogram,
)

MASK = torch.tensor([[False, True, True], [False, True, False]])
LOGQ = torch.tensor([[0.0, math.log(0.5), math.log(0.2)], [0.0, math.log(0.4), 0.0]])
LOGP = torch.tensor([[0.0, math.log(0.25), math.log(0.2)], [0.0, math.log(0.8), 0.0]])
# ratios π/q on the three action tokens: 0.5, 1.0, 2.0


def test_behaviour_kl_hand_values():
    d = behaviour_kl(LOGP, LOGQ, MASK)
    ell = [math.log(0.5), 0.0, math.log(2.0)]  # log π/q
    k1 = [-x for x in ell]
    k3 = [math.exp(x) - 1 - x for x in ell]
    assert d["kl_q_pi_k1"] == pytest.approx(sum(k1) / 3, abs=1e-6)
    assert d["kl_q_pi_k3"] == pytest.approx(sum(k3) / 3)
    assert d["kl_q_pi_k3_max"] == pytest.approx(max(k3))
    assert d["kl_q_pi_seq_max"] == pytest.approx(max((k3[0] + k3[1]) / 2, k3[2]))


def test_tv_estimate_hand_values():
    d = tv_estimate(LOGP, LOGQ, MASK)
    assert d["tv"] == pytest.approx((0.25 + 0 + 0.5) / 3)
    assert d["tv_seq_max"] == pytest.approx(0.5)


def test_tv_estimate_is_unbiased_for_the_exact_tv():
    g = torch.Generator().manual_seed(0)
    q = torch.tensor([0.5, 0.3, 0.2], dtype=torch.float64)
    p = torch.tensor([0.2, 0.3, 0.5], dtype=torch.float64)
    a = torch.multinomial(q, 100_000, replacement=True, generator=g)
    m = torch.ones(1, a.numel(), dtype=torch.bool)
    est = tv_estimate(p.log()[a][None], q.log()[a][None], m)["tv"]
    assert est == pytest.approx(0.5 * float((p - q).abs().sum()), abs=0.01)


def test_ratio_quantiles():
    d = ratio_quantiles(LOGP, LOGQ, MASK, qs=(0.5,))
    assert d["ratio_q50"] == pytest.approx(1.0)
    assert d["ratio_min"] == pytest.approx(0.5) and d["ratio_max"] == pytest.approx(2.0)


def test_effective_sample_size():
    assert effective_sample_size(torch.zeros(8))["ess"] == pytest.approx(8.0)
    w = torch.tensor([1.0, 1.0, 2.0])
    d = effective_sample_size(w.log())
    assert d["ess"] == pytest.approx(16 / 6) and d["ess_frac"] == pytest.approx(16 / 18)
    lopsided = effective_sample_size(torch.tensor([0.0, -800.0, -900.0]))  # no underflow issue
    assert lopsided["ess"] == pytest.approx(1.0)
    # rows' w(τ): row 0 = 0.5 · 1.0, row 1 = 2.0
    assert trajectory_ess(LOGP, LOGQ, MASK)["ess"] == pytest.approx(2.5**2 / (0.25 + 4))


def test_zero_probability_and_nan_tokens_are_exact_in_the_sequence_weight():
    """A π = 0 token makes w(τ) = 0 (the row still counts in N); a NaN or q = 0 token makes
    it undefined (counted, left out) — neither is the product of the other tokens."""
    lp = LOGP.clone().repeat(3, 1)  # rows 0-1: as above; rows 2-5: the same with one edge each
    lq = LOGQ.clone().repeat(3, 1)
    m = MASK.repeat(3, 1)
    lp[2, 2] = -math.inf  # π = 0 on one action: w = 0, not 0.5
    lq[3, 1] = math.nan  # undefined
    lq[4, 2] = -math.inf  # q = 0 for a sampled token: undefined (w = ∞)
    lp[5, 0] = math.nan  # not an action: ignored
    lw = exact_sequence_log_weight(lp, lq, m)
    assert lw[2] == -math.inf and math.isnan(lw[3]) and math.isnan(lw[4])
    assert float(lw[5]) == pytest.approx(math.log(2.0))
    d = trajectory_ess(lp, lq, m)
    assert d["num_w_zero"] == 1 and d["num_w_undefined"] == 2
    w = [0.5, 2.0, 0.0, 2.0]  # the defined weights, the zero included in N
    ess = sum(w) ** 2 / sum(x * x for x in w)
    assert d["ess"] == pytest.approx(ess) and d["ess_frac"] == pytest.approx(ess / 4)
    assert effective_sample_size(torch.tensor([-math.inf, -math.inf]))["ess"] == 0.0


def test_support_excluded_mass_hand_values():
    logits = torch.tensor([0.5, 0.3, 0.15, 0.05]).log()
    assert float(support_excluded_mass(logits, top_p=0.75)) == pytest.approx(0.2)
    assert float(support_excluded_mass(logits, top_p=0.85)) == pytest.approx(0.05)
    assert float(support_excluded_mass(logits, top_k=1)) == pytest.approx(0.5)
    assert float(support_excluded_mass(logits, top_k=3, top_p=0.9)) == pytest.approx(0.05)
    assert float(support_excluded_mass(logits)) == 0.0
    assert float(support_excluded_mass(logits, top_p=1e-9)) == pytest.approx(0.5)  # ≥ 1 kept
    # temperature sharpens before truncation
    hot = support_excluded_mass(logits, top_p=0.75, temperature=0.5)
    p = torch.softmax(logits / 0.5, -1)
    assert float(hot) == pytest.approx(float(p[2:].sum()))  # p = (.68, .25, .06, .01)


@pytest.mark.parametrize(("top_p", "top_k"), [(0.9, 0), (0.5, 0), (1.0, 7), (0.8, 20)])
def test_support_matches_transformers_samplers(top_p, top_k):
    from transformers import TopKLogitsWarper, TopPLogitsWarper

    g = torch.Generator().manual_seed(0)
    logits = 2.0 * torch.randn(16, 50, generator=g)
    warped = logits.clone()
    if top_k:
        warped = TopKLogitsWarper(top_k=top_k)(None, warped)
    if top_p < 1:
        warped = TopPLogitsWarper(top_p=top_p)(None, warped)
    kept = torch.isfinite(warped)
    expected = torch.where(kept, 0.0, torch.softmax(logits.double(), -1)).sum(-1)
    got = support_excluded_mass(logits, top_p=top_p, top_k=top_k)
    torch.testing.assert_close(got, expected)


def test_support_per_row_parameters():
    logits = torch.tensor([[0.5, 0.3, 0.15, 0.05], [0.5, 0.3, 0.15, 0.05]]).log()
    got = support_excluded_mass(logits, top_p=torch.tensor([1.0, 0.75]), top_k=torch.tensor([1, 0]))
    assert got.tolist() == pytest.approx([0.5, 0.2])


def test_truncation_stats():
    km = torch.tensor([[1.0, 0.9, 1.0], [1.0, 0.7, 1.0]])
    d = truncation_stats(km, MASK)
    assert d["truncated_frac"] == pytest.approx(2 / 3)
    assert d["q_excluded_mass"] == pytest.approx(0.4 / 3)


def test_version_lag_histogram_and_summary():
    versions = torch.tensor([[-1, 5, 4], [-1, 3, -1]])
    hist = version_lag_histogram(versions, MASK, current_version=5)
    assert hist == {0: 1, 1: 1, 2: 1}
    s = lag_summary(hist, max_listed=2)
    assert s["lag_mean"] == pytest.approx(1.0) and s["lag_max"] == 2
    assert s["lag_frac_0"] == pytest.approx(1 / 3) and s["lag_frac_ge2"] == pytest.approx(1 / 3)


def test_nonfinite_count_and_empty_inputs():
    x = torch.tensor([[0.0, math.nan, math.inf], [0.0, 1.0, math.nan]])
    assert nonfinite_count(MASK, x=x) == {"nonfinite_x": 2.0}
    none = torch.zeros_like(MASK)
    assert behaviour_kl(LOGP, LOGQ, none)["kl_q_pi_k3"] == 0.0
    assert ratio_quantiles(LOGP, LOGQ, none) == {}
    # NaN tokens are skipped by the estimates rather than poisoning them
    lq = LOGQ.clone()
    lq[0, 1] = math.nan
    assert math.isfinite(behaviour_kl(LOGP, lq, MASK)["kl_q_pi_k3"])


def test_support_skips_rows_without_truncation():
    """Rows sampled with top_p = 1 and no top-k exclude nothing: exactly 0, and mixed with
    truncating rows each row keeps its own value (the fast path sorts only those)."""
    g = torch.Generator().manual_seed(1)
    logits = 2.0 * torch.randn(3, 4, 50, generator=g)
    tp = torch.tensor([[1.0, 0.9, 1.0, 1.0]] * 3)
    tk = torch.tensor([[0, 0, 7, 50]] * 3)
    got = support_excluded_mass(logits, top_p=tp, top_k=tk)
    assert got.shape == (3, 4) and got.dtype == torch.float64
    for i in range(3):
        for j in range(4):
            one = support_excluded_mass(logits[i, j], top_p=float(tp[i, j]), top_k=int(tk[i, j]))
            assert float(got[i, j]) == float(one)
    assert got[:, 0].eq(0).all() and got[:, 3].eq(0).all() and got[:, 1:3].gt(0).all()
    assert support_excluded_mass(logits).eq(0).all()

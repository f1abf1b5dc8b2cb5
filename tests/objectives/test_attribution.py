"""The attribution table's pure functions against hand-computed values."""

from __future__ import annotations

import math

import pytest
import torch

from provrl.objectives.attribution import attribution_row, clip_share, log_weight_errors


def test_errors_by_hand():
    logq = torch.tensor([[-1.0, -2.0, 0.0], [-0.5, -0.5, -0.5]])
    logb = torch.tensor([[-1.5, -2.0, 0.0], [-0.5, -1.0, -0.7]])
    mask = torch.tensor([[True, True, False], [True, True, True]])
    e_tok, e_traj = log_weight_errors(logq, logb, mask)
    assert e_tok.tolist() == pytest.approx([0.5, 0.0, 0.0, 0.5, 0.2])
    assert e_traj.tolist() == pytest.approx([0.5, 0.7])


def test_both_minus_inf_is_no_error():
    q = torch.tensor([[-math.inf, -1.0]])
    e_tok, _ = log_weight_errors(q, q.clone(), torch.tensor([[True, True]]))
    assert e_tok.tolist() == [0.0, 0.0]


def test_clip_share():
    assert clip_share(torch.log(torch.tensor([1.0, 3.0, 2.5, 0.1])), 2.0) == 0.5
    assert clip_share(torch.zeros(0), 2.0) == 0.0


def test_the_exact_row_has_no_error_and_on_policy_weights_are_one():
    logp = torch.tensor([[-1.0, -1.0], [-2.0, -0.1]])
    logq = torch.tensor([[-0.2, -1.5], [-1.0, -0.1]])
    mask = torch.ones(2, 2, dtype=torch.bool)
    exact = attribution_row(logp, logq, logq, mask)
    assert exact["token_abs_err_max"] == 0.0 and exact["traj_abs_err_max"] == 0.0
    # ρ = π/q per token: e^{-0.8}, e^{0.5}, e^{-1}, 1 — none above 2; w(τ) = e^{-0.3}, e^{-1}
    assert exact["clip_share_token"] == 0.0
    ess = math.exp(-0.3) + math.exp(-1.0)
    ess = ess**2 / (math.exp(-0.6) + math.exp(-2.0))
    assert exact["ess_frac"] == pytest.approx(ess / 2)
    on = attribution_row(logp, logq, logp, mask)
    assert on["ess_frac"] == pytest.approx(1.0) and on["clip_share_traj"] == 0.0
    # its error is log q − log π per token: |0.8|, |−0.5|, |1.0|, 0
    assert on["token_abs_err_mean"] == pytest.approx((0.8 + 0.5 + 1.0) / 4)
    assert on["traj_abs_err_max"] == pytest.approx(1.0)

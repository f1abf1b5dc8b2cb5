"""Loss aggregation, PPO clip, KL estimators, NaN/inf safety, exact gradient accumulation."""

from __future__ import annotations

import math

import pytest
import torch
from pydantic import ValidationError

from provrl.objectives.config import ObjectiveConfig
from provrl.objectives.corrections import CORRECTIONS
from provrl.objectives.kl import kl_estimate
from provrl.objectives.losses import (
    SEQUENCE_CORRECTIONS,
    aggregate,
    aggregate_loss,
    clipped_surrogate,
    loss_token_weights,
    policy_loss,
)

MASK = torch.tensor([[False, True, True, True], [False, True, False, False]])


def test_token_weights_of_the_three_aggregations():
    tm = loss_token_weights(MASK, "token_mean")
    assert tm[MASK].tolist() == pytest.approx([0.25] * 4)
    sm = loss_token_weights(MASK, "seq_mean_token_mean")
    assert sm[MASK].tolist() == pytest.approx([1 / 6, 1 / 6, 1 / 6, 1 / 2])
    dr = loss_token_weights(MASK, "seq_sum_norm", norm_tokens=10)
    assert dr[MASK].tolist() == pytest.approx([1 / 20] * 4)
    for w in (tm, sm, dr):
        assert torch.equal(w[~MASK], torch.zeros(4))
    with pytest.raises(ValueError, match="norm_tokens"):
        loss_token_weights(MASK, "seq_sum_norm")


def test_aggregate_loss_hand_values():
    v = torch.tensor([[9.0, 1.0, 2.0, 3.0], [9.0, 10.0, 9.0, 9.0]])
    assert float(aggregate_loss(v, MASK, "token_mean")) == pytest.approx(16 / 4)
    assert float(aggregate_loss(v, MASK, "seq_mean_token_mean")) == pytest.approx((2 + 10) / 2)
    assert float(aggregate_loss(v, MASK, "seq_sum_norm", norm_tokens=8)) == pytest.approx(16 / 16)


def test_aggregate_ignores_nan_off_the_weights():
    v = torch.tensor([[math.nan, 1.0, math.inf, 3.0]])
    w = torch.tensor([[0.0, 0.5, 0.0, 0.5]])
    assert float(aggregate(v, w)) == 2.0


def test_clipped_surrogate_hand_values():
    r = torch.tensor([0.5, 1.0, 1.5, 0.5, 1.5])
    a = torch.tensor([1.0, -1.0, 1.0, -1.0, -1.0])
    obj, clipped = clipped_surrogate(r, a, 0.2, 0.2)
    assert obj.tolist() == pytest.approx([0.5, -1.0, 1.2, -0.8, -1.5])
    assert clipped.tolist() == [False, False, True, True, False]
    obj_hi, _ = clipped_surrogate(r, a, 0.2, 0.28)  # clip-higher
    assert obj_hi[2] == pytest.approx(1.28)
    obj_none, clipped_none = clipped_surrogate(r, a, None, None)
    assert torch.equal(obj_none, r * a) and not clipped_none.any()


def test_clip_zeroes_the_gradient_outside_the_region():
    r = torch.tensor([1.5, 0.5], requires_grad=True)
    obj, _ = clipped_surrogate(r, torch.tensor([1.0, -1.0]), 0.2, 0.2)
    obj.sum().backward()
    assert r.grad is not None and r.grad.tolist() == [0.0, 0.0]


def test_kl_estimators_hand_values():
    lp = torch.tensor([math.log(0.5)])
    lref = torch.tensor([math.log(0.25)])  # ℓ = log(1/2)
    ell = math.log(0.5)
    assert float(kl_estimate(lp, lref, "k1")) == pytest.approx(-ell)
    assert float(kl_estimate(lp, lref, "k2")) == pytest.approx(0.5 * ell**2)
    assert float(kl_estimate(lp, lref, "k3")) == pytest.approx(0.5 - 1 - ell)
    with pytest.raises(ValueError, match="k4"):
        kl_estimate(lp, lref, "k4")  # type: ignore[arg-type]


def test_k1_and_k3_are_unbiased_for_the_exact_kl():
    g = torch.Generator().manual_seed(0)
    p = torch.tensor([0.5, 0.3, 0.2], dtype=torch.float64)
    r = torch.tensor([0.2, 0.3, 0.5], dtype=torch.float64)
    exact = float((p * (p / r).log()).sum())
    a = torch.multinomial(p, 200_000, replacement=True, generator=g)
    for kind in ("k1", "k3"):
        est = kl_estimate(p.log()[a], r.log()[a], kind)  # type: ignore[arg-type]
        se = float(est.std()) / math.sqrt(a.numel())
        assert abs(float(est.mean()) - exact) < 4 * se, kind
    assert (kl_estimate(p.log()[a], r.log()[a], "k3") >= 0).all()


def _inputs(seed: int = 0, B: int = 4, T: int = 6):
    g = torch.Generator().manual_seed(seed)
    mask = torch.rand(B, T, generator=g) < 0.7
    mask[:, 0] = False
    logq = -torch.rand(B, T, generator=g) * 3
    logprox = logq + 0.3 * torch.randn(B, T, generator=g)
    logprox = logprox.clamp(max=0)
    adv = torch.randn(B, 1, generator=g).expand(B, T) * mask
    ref = logprox - 0.1 * torch.rand(B, T, generator=g)
    return mask, logq, logprox, adv.contiguous(), ref


@pytest.mark.parametrize("correction", CORRECTIONS)
def test_zero_advantages_give_exactly_zero_policy_gradient(correction):
    mask, logq, logprox, _, _ = _inputs()
    lp = (logprox + 0.05).clone().requires_grad_(True)
    cfg = ObjectiveConfig(correction=correction, mask_low=0.01, mask_high=100.0)
    out = policy_loss(
        lp, logprox, logq, torch.zeros_like(lp), mask, loss_token_weights(mask, "token_mean"), cfg
    )
    out.loss.backward()
    assert lp.grad is not None and torch.equal(lp.grad, torch.zeros_like(lp))


@pytest.mark.parametrize("correction", CORRECTIONS)
def test_nan_and_inf_inputs_are_counted_masked_and_never_propagate(correction):
    mask, logq, logprox, adv, ref = _inputs()
    cfg = ObjectiveConfig(correction=correction, kl_coef=0.1, mask_low=0.01, mask_high=100.0)
    w = loss_token_weights(mask, "token_mean")
    rows, cols = mask.nonzero(as_tuple=True)
    bad = [(int(rows[0]), int(cols[0])), (int(rows[1]), int(cols[1])), (int(rows[2]), int(cols[2]))]
    lq, lpx, a = logq.clone(), logprox.clone(), adv.clone()
    lq[bad[0]] = math.nan
    lpx[bad[1]] = -math.inf
    a[bad[2]] = math.inf
    lp = logprox.clone().requires_grad_(True)
    out = policy_loss(lp, lpx, lq, a, mask, w, cfg, logp_ref=ref)
    out.loss.backward()
    assert math.isfinite(float(out.loss.detach())) and out.num_nonfinite == 3
    assert lp.grad is not None and torch.isfinite(lp.grad).all()
    # Same as removing those tokens from the mask by hand (with the same normaliser ω) —
    # for a sequence-level correction, their whole trajectories: w(τ) of a trajectory with
    # a π = 0 token is 0 and with a NaN undefined, never the product of the other tokens.
    clean = mask.clone()
    for b in bad:
        if correction in SEQUENCE_CORRECTIONS:
            clean[b[0]] = False
        else:
            clean[b] = False
    n_rows = len({b[0] for b in bad})
    assert out.num_seq_dropped == (n_rows if correction in SEQUENCE_CORRECTIONS else 0)
    lp2 = logprox.clone().requires_grad_(True)
    ref_out = policy_loss(
        lp2, logprox, logq, adv, clean, torch.where(clean, w, 0.0), cfg, logp_ref=ref
    )
    ref_out.loss.backward()
    torch.testing.assert_close(out.loss.detach(), ref_out.loss.detach())
    torch.testing.assert_close(lp.grad, lp2.grad)
    assert out.num_nonfinite + out.num_masked - ref_out.num_masked == mask.sum() - clean.sum()


@pytest.mark.parametrize("correction", SEQUENCE_CORRECTIONS)
def test_a_zero_probability_token_zeroes_its_sequence_weight(correction):
    """Issue 13: with π = 0 on one token, seq_tis gave w(τ) = Π of the other ratios (weight
    sum 2e where the exact value is 0). Two rows, each e·(π=0 token)."""
    mask = torch.ones(2, 2, dtype=torch.bool)
    logq = torch.full((2, 2), -1.0)
    logprox = torch.tensor([[0.0, -math.inf], [-math.inf, 0.0]])  # log ρ = 1 and −inf per row
    adv = torch.ones(2, 2)
    cfg = ObjectiveConfig(correction=correction, is_cap=None, mask_low=0.0, mask_high=1e9)
    lp = logprox.clone().requires_grad_(True)
    out = policy_loss(lp, logprox, logq, adv, mask, loss_token_weights(mask, "token_mean"), cfg)
    out.loss.backward()
    assert out.num_seq_dropped == 2 and out.weight_sum == 0.0 and out.num_nonfinite == 2
    assert out.num_masked == 2 and float(out.loss.detach()) == 0.0
    assert lp.grad is not None and torch.equal(lp.grad, torch.zeros_like(lp))


@pytest.mark.parametrize("aggregation", ["token_mean", "seq_mean_token_mean", "seq_sum_norm"])
def test_micro_batch_accumulation_is_exact(aggregation):
    mask, logq, logprox, adv, _ = _inputs(seed=3, B=6)
    cfg = ObjectiveConfig(correction="tis", aggregation=aggregation, norm_tokens=8)
    w = loss_token_weights(mask, aggregation, norm_tokens=8)
    lp = (logprox + 0.1).clone().requires_grad_(True)
    full = policy_loss(lp, logprox, logq, adv, mask, w, cfg)
    full.loss.backward()
    assert lp.grad is not None
    g_full = lp.grad.clone()
    lp.grad = None
    total = torch.zeros(())
    for rows in (torch.tensor([0, 1]), torch.tensor([2, 3, 4]), torch.tensor([5])):
        part = policy_loss(lp[rows], logprox[rows], logq[rows], adv[rows], mask[rows], w[rows], cfg)
        part.loss.backward()
        total = total + part.loss.detach()
    torch.testing.assert_close(total, full.loss.detach())
    torch.testing.assert_close(lp.grad, g_full)


def test_kl_penalty_requires_reference_logprobs_and_adds_beta_times_kl():
    mask, logq, logprox, adv, ref = _inputs()
    w = loss_token_weights(mask, "token_mean")
    with pytest.raises(ValueError, match="logp_ref"):
        policy_loss(logprox, logprox, logq, adv, mask, w, ObjectiveConfig(kl_coef=0.5))
    base = policy_loss(logprox, logprox, logq, adv, mask, w, ObjectiveConfig())
    pen = policy_loss(
        logprox, logprox, logq, adv, mask, w, ObjectiveConfig(kl_coef=0.5), logp_ref=ref
    )
    k3 = kl_estimate(logprox, ref, "k3")
    expected_kl = float((k3 * w)[mask].sum())
    assert pen.kl_loss == pytest.approx(expected_kl, rel=1e-5)
    assert float(pen.loss) == pytest.approx(float(base.loss) + 0.5 * expected_kl, rel=1e-5)


def test_config_validation_names_the_problem():
    with pytest.raises(ValidationError, match="norm_tokens"):
        ObjectiveConfig(aggregation="seq_sum_norm")
    with pytest.raises(ValidationError, match="correction"):
        ObjectiveConfig(correction="vtrace")  # type: ignore[arg-type]
    with pytest.raises(ValidationError, match="mask_low"):
        ObjectiveConfig(mask_low=3.0, mask_high=2.0)
    with pytest.raises(ValidationError, match="extra"):
        ObjectiveConfig(clip=0.2)  # type: ignore[call-arg]

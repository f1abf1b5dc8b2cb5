"""Advantages: GRPO (with / without std), RLOO, batch normalisation, zero-signal groups."""

from __future__ import annotations

import math

import pytest
import torch

from provrl.objectives.advantages import (
    batch_normalise,
    group_advantages,
    rloo_advantages,
    zero_signal_fraction,
)

R = torch.tensor([1.0, 0.0, 0.0, 1.0, 0.5, 0.2, 0.2, 0.2])
G = torch.tensor([7, 7, 7, 7, 3, 9, 9, 9])  # arbitrary ids: groups {0..3}, {4}, {5,6,7}


def test_grpo_with_std_matches_hand_computation():
    a = group_advantages(R, G, std_normalise=True, eps=0.0)
    # group 7: mean 0.5, unbiased std sqrt(((.5)^2*4)/3) = sqrt(1/3)
    s = math.sqrt(1 / 3)
    expected = torch.tensor([0.5 / s, -0.5 / s, -0.5 / s, 0.5 / s, 0.0, 0.0, 0.0, 0.0])
    torch.testing.assert_close(a, expected)


def test_dr_grpo_drops_the_std():
    a = group_advantages(R, G, std_normalise=False)
    torch.testing.assert_close(a, torch.tensor([0.5, -0.5, -0.5, 0.5, 0, 0, 0, 0.0]))


def test_rloo_matches_leave_one_out_mean():
    r = torch.tensor([1.0, 0.0, 2.0, 4.0])
    g = torch.zeros(4, dtype=torch.long)
    a = rloo_advantages(r, g)
    expected = torch.tensor([1 - 2.0, 0 - 7 / 3, 2 - 5 / 3, 4 - 1.0])
    torch.testing.assert_close(a, expected)
    # equivalently G/(G-1) (r_i - mean)
    torch.testing.assert_close(a, 4 / 3 * (r - r.mean()))


def test_all_equal_groups_are_exactly_zero_despite_round_off():
    # mean([0.1]*3) != 0.1 in floating point; a naive (r - mean)/(std + eps) is ~1e-11/1e-6.
    r = torch.tensor([0.1, 0.1, 0.1, 0.7, 0.7], dtype=torch.float64)
    g = torch.tensor([0, 0, 0, 1, 1])
    for a in (
        group_advantages(r, g, std_normalise=True),
        group_advantages(r, g, std_normalise=False),
        rloo_advantages(r, g),
    ):
        assert torch.equal(a, torch.zeros_like(r))


def test_batch_normalise_scale_keeps_zeros_and_whiten_centres():
    a = torch.tensor([1.0, -1.0, 0.0, 0.0, 3.0, -3.0])
    s = batch_normalise(a, center=False, eps=0.0)
    torch.testing.assert_close(s, a / a.std())
    assert s[2] == 0 and s[3] == 0
    w = batch_normalise(torch.tensor([1.0, 2.0, 3.0]), center=True, eps=0.0)
    torch.testing.assert_close(w, torch.tensor([-1.0, 0.0, 1.0]))
    flat = batch_normalise(torch.tensor([0.0, 0.0, 0.0]))
    assert torch.equal(flat, torch.zeros(3))


def test_zero_signal_fraction_counts_groups_and_trajectories():
    z = zero_signal_fraction(R, G)
    assert z["num_groups"] == 3
    assert z["zero_signal_group_frac"] == pytest.approx(2 / 3)  # {4} and {5,6,7}
    assert z["zero_signal_traj_frac"] == pytest.approx(4 / 8)


def test_bad_rewards_are_named():
    with pytest.raises(ValueError, match="trajectory 1"):
        group_advantages(torch.tensor([0.0, math.nan]), torch.tensor([0, 0]))
    with pytest.raises(ValueError, match="same length"):
        rloo_advantages(torch.zeros(3), torch.zeros(2, dtype=torch.long))

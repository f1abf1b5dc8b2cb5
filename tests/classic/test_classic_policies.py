"""Policy log-probs, KL and entropy against torch.distributions; sampling; spaces."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch
from torch.distributions import Categorical, Normal, kl_divergence

from provrl.classic.policies import CategoricalPolicy, GaussianPolicy, make_policy


def test_categorical_matches_torch_distributions():
    torch.manual_seed(0)
    pi = CategoricalPolicy(4, 3, [8], "tanh")
    s = torch.randn(16, 4)
    with torch.no_grad():
        for p in pi.parameters():
            p.add_(torch.randn_like(p))  # move away from the near-uniform init
        d = pi(s)
        d2 = pi(s + 0.3)
    a = torch.randint(0, 3, (16,))
    ref, ref2 = Categorical(logits=d), Categorical(logits=d2)
    assert torch.allclose(pi.log_prob(d, a), ref.log_prob(a), atol=1e-6)
    assert torch.allclose(pi.kl(d, d2), kl_divergence(ref, ref2), atol=1e-6)
    assert torch.allclose(pi.entropy(d), ref.entropy(), atol=1e-6)
    assert torch.equal(pi.mode(d), d.argmax(-1))


def test_gaussian_matches_torch_distributions():
    torch.manual_seed(1)
    pi = GaussianPolicy(3, 2, [8], "tanh", log_std_init=-0.5)
    s = torch.randn(10, 3)
    with torch.no_grad():
        d = pi(s)
        pi.log_std.add_(torch.tensor([0.3, -0.2]))
        for p in pi.mu.parameters():
            p.add_(0.5 * torch.randn_like(p))
        d2 = pi(s)
    a = torch.randn(10, 2)
    mu, std = d[:, :2], d[:, 2:].exp()
    mu2, std2 = d2[:, :2], d2[:, 2:].exp()
    assert torch.allclose(pi.log_prob(d, a), Normal(mu, std).log_prob(a).sum(-1), atol=1e-5)
    ref_kl = kl_divergence(Normal(mu, std), Normal(mu2, std2)).sum(-1)
    assert torch.allclose(pi.kl(d, d2), ref_kl, atol=1e-5)
    assert torch.allclose(pi.entropy(d), Normal(mu, std).entropy().sum(-1), atol=1e-5)
    assert torch.equal(pi.mode(d), mu)


def test_sampling_follows_the_distribution():
    g = torch.Generator().manual_seed(0)
    cat = CategoricalPolicy(1, 3, [4], "tanh")
    d = torch.log(torch.tensor([[0.2, 0.5, 0.3]])).expand(20000, 3)
    counts = torch.bincount(cat.sample(d, g), minlength=3).float() / 20000
    assert torch.allclose(counts, torch.tensor([0.2, 0.5, 0.3]), atol=0.015)
    gauss = GaussianPolicy(1, 1, [4], "tanh", 0.0)
    d = torch.tensor([[2.0, np.log(0.5)]]).expand(20000, 2)
    x = gauss.sample(d, g)
    assert abs(float(x.mean()) - 2.0) < 0.02 and abs(float(x.std()) - 0.5) < 0.02


def test_make_policy_picks_by_action_space_and_rejects_others():
    box = gym.spaces.Box(-1, 1, (4,))
    assert isinstance(make_policy(box, gym.spaces.Discrete(2), [8]), CategoricalPolicy)
    assert isinstance(make_policy(box, gym.spaces.Box(-2, 2, (1,)), [8]), GaussianPolicy)
    with pytest.raises(ValueError, match="action space"):
        make_policy(box, gym.spaces.MultiBinary(3), [8])
    with pytest.raises(ValueError, match="observation space"):
        make_policy(gym.spaces.Discrete(5), gym.spaces.Discrete(2), [8])
    with pytest.raises(ValueError, match="activation"):
        make_policy(box, gym.spaces.Discrete(2), [8], activation="gelu")


def test_bounded_mean_stays_inside_the_action_box_and_keeps_the_formulas():
    low, high = torch.tensor([-2.0, 0.0]), torch.tensor([2.0, 1.0])
    torch.manual_seed(2)
    pi = GaussianPolicy(3, 2, [8], "tanh", 0.0, mean_bounds=(low, high))
    with torch.no_grad():
        pi.mu[-1].weight.mul_(1000.0)  # drive f(s) far beyond the bounds
        s = 10 * torch.randn(256, 3)
        d = pi(s)
        f = pi.mu(s)
    mu = pi.mode(d)
    assert torch.allclose(mu, torch.tensor([0.0, 0.5]) + torch.tensor([2.0, 0.5]) * torch.tanh(f))
    assert (mu >= low).all() and (mu <= high).all()
    assert (mu[:, 0].abs() > 1.99).any()  # saturates towards a bound, never past it
    a = torch.randn(256, 2)
    ref = Normal(mu, d[:, 2:].exp())
    assert torch.allclose(pi.log_prob(d, a), ref.log_prob(a).sum(-1), atol=1e-5)


def test_make_policy_bounded_mean_needs_finite_bounds():
    obs = gym.spaces.Box(-1, 1, (3,))
    pi = make_policy(obs, gym.spaces.Box(-2, 2, (1,)), [8], bounded_mean=True)
    assert isinstance(pi, GaussianPolicy) and pi.bounded
    assert float(pi.half_range[0]) == 2.0 and float(pi.centre[0]) == 0.0
    with pytest.raises(ValueError, match="finite bounds"):
        make_policy(obs, gym.spaces.Box(-np.inf, np.inf, (1,)), [8], bounded_mean=True)
    assert not make_policy(obs, gym.spaces.Box(-np.inf, np.inf, (1,)), [8]).bounded

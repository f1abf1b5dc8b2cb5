"""Small MLP policies and value functions for gymnasium control.

Both policies expose the same five methods over a *distribution-parameter tensor* ``d``
returned by ``forward(obs)``, so the trainer never branches on the action space:

==========  ===================================  ========================================
method      categorical (Discrete)               diagonal Gaussian (Box)
==========  ===================================  ========================================
forward     d = log π(·|s) = log_softmax(f(s))   d = [μ(s), log σ] (σ state-independent)
log_prob    d[a]                                 −½ Σ ((a−μ)/σ)² − Σ log σ − (k/2) log 2π
kl          Σ_a π_old (log π_old − log π_new)    Σ log σ₁/σ₀ + (σ₀² + (μ₀−μ₁)²)/(2σ₁²) − ½
sample      a ~ Categorical(π)                   a = μ + σ ε, ε ~ N(0, I)
mode        argmax_a π(a|s)                      μ(s)
==========  ===================================  ========================================

``kl(d_old, d_new)`` is KL(π_old ‖ π_new) per state, the quantity TRPO's trust region
bounds on average. Initialisation follows the common on-policy recipe (orthogonal weights,
gain √2 in hidden layers, 0.01 on the policy head, 1 on the value head).
"""

from __future__ import annotations

import itertools
import math

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from provrl.objectives.trpo import categorical_kl

Tensor = torch.Tensor
ACTIVATIONS: dict[str, type[nn.Module]] = {"tanh": nn.Tanh, "relu": nn.ReLU}


def mlp(sizes: list[int], activation: str = "tanh", out_gain: float = 1.0) -> nn.Sequential:
    """Linear layers ``sizes[0] → … → sizes[-1]`` with ``activation`` between them."""
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation {activation!r}: expected one of {sorted(ACTIVATIONS)}")
    layers: list[nn.Module] = []
    for i, (n_in, n_out) in enumerate(itertools.pairwise(sizes)):
        last = i == len(sizes) - 2
        lin = nn.Linear(n_in, n_out)
        nn.init.orthogonal_(lin.weight, gain=out_gain if last else math.sqrt(2))
        nn.init.zeros_(lin.bias)
        layers.append(lin)
        if not last:
            layers.append(ACTIVATIONS[activation]())
    return nn.Sequential(*layers)


class CategoricalPolicy(nn.Module):
    """π_θ(a|s) = softmax(f_θ(s))_a for a Discrete action space."""

    def __init__(self, obs_dim: int, n_actions: int, hidden: list[int], activation: str):
        super().__init__()
        self.net = mlp([obs_dim, *hidden, n_actions], activation, out_gain=0.01)

    def forward(self, obs: Tensor) -> Tensor:
        return torch.log_softmax(self.net(obs), dim=-1)

    def log_prob(self, d: Tensor, act: Tensor) -> Tensor:
        return d.gather(-1, act.long().unsqueeze(-1)).squeeze(-1)

    def kl(self, d_old: Tensor, d_new: Tensor) -> Tensor:
        return categorical_kl(d_old, d_new)

    def entropy(self, d: Tensor) -> Tensor:
        return -(d.exp() * d).sum(-1)

    def sample(self, d: Tensor, generator: torch.Generator | None = None) -> Tensor:
        return torch.multinomial(d.exp(), 1, generator=generator).squeeze(-1)

    def mode(self, d: Tensor) -> Tensor:
        return d.argmax(-1)


class GaussianPolicy(nn.Module):
    """π_θ(a|s) = N(μ_θ(s), diag σ²) with a learned state-independent log σ (Box actions).

    With ``mean_bounds = (low, high)`` the mean is kept inside the action box,
    μ_θ(s) = c + h · tanh(f_θ(s)) with c = (high + low)/2, h = (high − low)/2; otherwise
    μ_θ(s) = f_θ(s). Samples are still clipped to the box by the trainer. A bounded mean
    cannot drift beyond a bound, where every sample would clip to the same action and the
    policy gradient in that state would vanish (docs/trpo.md, "Pendulum across seeds")."""

    centre: Tensor  # c (buffer)
    half_range: Tensor  # h (buffer)

    def __init__(
        self,
        obs_dim: int,
        act_dim: int,
        hidden: list[int],
        activation: str,
        log_std_init: float,
        mean_bounds: tuple[Tensor, Tensor] | None = None,
    ):
        super().__init__()
        self.act_dim = act_dim
        self.mu = mlp([obs_dim, *hidden, act_dim], activation, out_gain=0.01)
        self.log_std = nn.Parameter(torch.full((act_dim,), float(log_std_init)))
        self.bounded = mean_bounds is not None
        low, high = mean_bounds if mean_bounds is not None else (torch.zeros(1), torch.ones(1))
        self.register_buffer("centre", ((high + low) / 2).float().expand(act_dim).clone())
        self.register_buffer("half_range", ((high - low) / 2).float().expand(act_dim).clone())

    def forward(self, obs: Tensor) -> Tensor:
        mu = self.mu(obs)
        if self.bounded:
            mu = self.centre + self.half_range * torch.tanh(mu)
        return torch.cat([mu, self.log_std.expand_as(mu)], dim=-1)

    def _split(self, d: Tensor) -> tuple[Tensor, Tensor]:
        return d[..., : self.act_dim], d[..., self.act_dim :]

    def log_prob(self, d: Tensor, act: Tensor) -> Tensor:
        mu, log_std = self._split(d)
        z = (act - mu) * torch.exp(-log_std)
        return (-0.5 * z.pow(2) - log_std).sum(-1) - 0.5 * self.act_dim * math.log(2 * math.pi)

    def kl(self, d_old: Tensor, d_new: Tensor) -> Tensor:
        mu0, log_std0 = self._split(d_old)
        mu1, log_std1 = self._split(d_new)
        var_ratio = torch.exp(2 * (log_std0 - log_std1))
        mahal = (mu0 - mu1).pow(2) * torch.exp(-2 * log_std1)
        return (log_std1 - log_std0 + 0.5 * (var_ratio + mahal) - 0.5).sum(-1)

    def entropy(self, d: Tensor) -> Tensor:
        _, log_std = self._split(d)
        return (log_std + 0.5 * math.log(2 * math.pi * math.e)).sum(-1)

    def sample(self, d: Tensor, generator: torch.Generator | None = None) -> Tensor:
        mu, log_std = self._split(d)
        eps = torch.randn(mu.shape, generator=generator, dtype=mu.dtype)
        return mu + torch.exp(log_std) * eps

    def mode(self, d: Tensor) -> Tensor:
        return self._split(d)[0]


Policy = CategoricalPolicy | GaussianPolicy


def make_policy(
    observation_space: gym.Space,
    action_space: gym.Space,
    hidden: list[int],
    activation: str = "tanh",
    log_std_init: float = 0.0,
    bounded_mean: bool = False,
) -> Policy:
    """The policy for a gymnasium (Box observation, Discrete | Box action) environment.

    ``bounded_mean`` (Box actions only) keeps the Gaussian mean inside the action bounds."""
    if not isinstance(observation_space, gym.spaces.Box) or len(observation_space.shape) != 1:
        raise ValueError(f"observation space {observation_space}: expected a flat Box")
    obs_dim = observation_space.shape[0]
    if isinstance(action_space, gym.spaces.Discrete):
        return CategoricalPolicy(obs_dim, int(action_space.n), hidden, activation)
    if isinstance(action_space, gym.spaces.Box) and len(action_space.shape) == 1:
        bounds = None
        if bounded_mean:
            low, high = action_space.low, action_space.high
            if not (np.isfinite(low).all() and np.isfinite(high).all()):
                raise ValueError(f"action space {action_space}: bounded_mean needs finite bounds")
            bounds = (torch.as_tensor(low), torch.as_tensor(high))
        act_dim = action_space.shape[0]
        return GaussianPolicy(obs_dim, act_dim, hidden, activation, log_std_init, bounds)
    raise ValueError(f"action space {action_space}: expected Discrete or a flat Box")


def make_value_function(obs_dim: int, hidden: list[int], activation: str = "tanh") -> nn.Module:
    """V_φ(s): an MLP with a scalar head (call ``.forward(obs).squeeze(-1)``)."""
    return mlp([obs_dim, *hidden, 1], activation, out_gain=1.0)

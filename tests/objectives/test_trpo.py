"""TRPO step: CG, Fisher-vector products, line search, NPG, and one step on a causal LM."""

from __future__ import annotations

import copy

import pytest
import torch
from pydantic import ValidationError

from provrl.objectives.trpo import (
    TRPOConfig,
    categorical_kl,
    conjugate_gradient,
    fisher_vector_product,
    flat_concat,
    flat_grad,
    max_step_length,
    npg_step,
    set_flat_,
    subsample_index,
    trpo_step,
)


# ----------------------------------------------------------------------------- helpers
def spd_matrix(n: int, seed: int, cond: float = 50.0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    q, _ = torch.linalg.qr(torch.randn(n, n, generator=g, dtype=torch.float64))
    eig = torch.logspace(0, torch.log10(torch.tensor(cond)).item(), n, dtype=torch.float64)
    return q @ torch.diag(eig) @ q.T


class ToyPolicy(torch.nn.Module):
    """A tiny categorical policy π_θ(a|s) = softmax(W₂ tanh(W₁ s))."""

    def __init__(self, obs_dim: int = 3, hidden: int = 4, n_actions: int = 3, seed: int = 0):
        super().__init__()
        torch.manual_seed(seed)
        self.net = torch.nn.Sequential(
            torch.nn.Linear(obs_dim, hidden), torch.nn.Tanh(), torch.nn.Linear(hidden, n_actions)
        )

    def forward(self, s: torch.Tensor) -> torch.Tensor:
        return torch.log_softmax(self.net(s), dim=-1)


def toy_problem(seed: int, n: int = 64, scale: float = 1.0):
    """A policy, states, actions sampled from it, advantages, and the two closures."""
    g = torch.Generator().manual_seed(seed)
    pi = ToyPolicy(seed=seed).double()
    with torch.no_grad():
        for p in pi.parameters():
            p.mul_(scale)
    s = torch.randn(n, 3, generator=g, dtype=torch.float64)
    with torch.no_grad():
        logp_old = pi(s)
    a = torch.multinomial(logp_old.exp(), 1, generator=g).squeeze(-1)
    adv = torch.randn(n, generator=g, dtype=torch.float64)
    logq = logp_old.gather(-1, a[:, None]).squeeze(-1)

    def surrogate() -> torch.Tensor:
        logp = pi(s).gather(-1, a[:, None]).squeeze(-1)
        return (torch.exp(logp - logq) * adv).mean()

    def mean_kl() -> torch.Tensor:
        return categorical_kl(logp_old, pi(s)).mean()

    return pi, s, logp_old, surrogate, mean_kl


# ----------------------------------------------------------------------------- CG
def test_conjugate_gradient_solves_known_spd_system():
    A = spd_matrix(20, seed=1)
    b = torch.randn(20, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    res = conjugate_gradient(lambda v: A @ v, b, iters=60, residual_tol=1e-24)
    x_exact = torch.linalg.solve(A, b)
    assert torch.allclose(res.x, x_exact, rtol=1e-8, atol=1e-10)
    assert res.residual < 1e-20


def test_conjugate_gradient_exact_in_n_steps_on_diagonal_system():
    # a diagonal system with 3 distinct eigenvalues is solved exactly in 3 iterations
    A = torch.diag(torch.tensor([1.0, 1.0, 2.0, 2.0, 5.0], dtype=torch.float64))
    b = torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0], dtype=torch.float64)
    res = conjugate_gradient(lambda v: A @ v, b, iters=10, residual_tol=1e-20)
    assert res.iters == 3
    assert torch.allclose(res.x, b / torch.diagonal(A))


def test_conjugate_gradient_respects_iters_and_tolerance():
    A = spd_matrix(30, seed=3, cond=1e4)
    b = torch.ones(30, dtype=torch.float64)
    assert conjugate_gradient(lambda v: A @ v, b, iters=4).iters == 4
    loose = conjugate_gradient(lambda v: A @ v, b, iters=200, residual_tol=1e-2)
    tight = conjugate_gradient(lambda v: A @ v, b, iters=200, residual_tol=1e-20)
    assert loose.residual < 1e-2 <= conjugate_gradient(lambda v: A @ v, b, loose.iters - 1).residual
    assert loose.iters < tight.iters and tight.residual < 1e-20


# ----------------------------------------------------------------------------- FVP
def explicit_fisher(pi: ToyPolicy, s: torch.Tensor) -> torch.Tensor:
    """F = mean_s Σ_a π(a|s) ∇log π(a|s) ∇log π(a|s)ᵀ, by per-(s, a) score vectors."""
    params = list(pi.parameters())
    n = sum(p.numel() for p in params)
    F = torch.zeros(n, n, dtype=torch.float64)
    logp = pi(s)
    for i in range(s.shape[0]):
        for a in range(logp.shape[1]):
            score = flat_grad(logp[i, a], params, retain_graph=True)
            F += logp[i, a].exp().detach() * torch.outer(score, score)
    return F / s.shape[0]


def test_fisher_vector_product_equals_explicit_fisher_times_v():
    pi, s, _, _, mean_kl = toy_problem(seed=0, n=16)
    params = list(pi.parameters())
    F = explicit_fisher(pi, s)
    g = torch.Generator().manual_seed(5)
    for damping in (0.0, 0.1):
        v = torch.randn(F.shape[0], generator=g, dtype=torch.float64)
        fvp = fisher_vector_product(mean_kl, params, v, damping=damping)
        assert torch.allclose(fvp, F @ v + damping * v, rtol=1e-9, atol=1e-12)


def test_fisher_is_psd_and_cg_on_fvp_matches_dense_solve():
    pi, s, _, surrogate, mean_kl = toy_problem(seed=1, n=32)
    params = list(pi.parameters())
    F = explicit_fisher(pi, s) + 0.1 * torch.eye(sum(p.numel() for p in params))
    assert torch.linalg.eigvalsh(F).min() > 0
    g = flat_grad(surrogate(), params)
    kl = mean_kl()
    from provrl.objectives.trpo import fisher_vector_product_fn

    fvp = fisher_vector_product_fn(kl, params, damping=0.1)
    res = conjugate_gradient(fvp, g, iters=200, residual_tol=1e-28)
    assert torch.allclose(res.x, torch.linalg.solve(F, g), rtol=1e-6, atol=1e-9)


# ----------------------------------------------------------------------------- the step
def test_max_step_length_puts_quadratic_kl_on_the_boundary():
    shs, delta = 3.7, 0.02
    beta = max_step_length(shs, delta)
    assert 0.5 * beta**2 * shs == pytest.approx(delta)
    assert max_step_length(0.0, delta) == 0.0
    assert max_step_length(float("nan"), delta) == 0.0


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("delta", [1e-3, 0.05, 1.0])
def test_line_search_never_accepts_kl_above_delta(seed, delta):
    # scale 3 makes the policy strongly non-linear, so the quadratic KL model overshoots
    pi, s, logp_old, surrogate, mean_kl = toy_problem(seed=seed, scale=3.0)
    params = list(pi.parameters())
    theta_old = flat_concat([p.detach() for p in params]).clone()
    with torch.no_grad():
        L_old = float(surrogate())
    cfg = TRPOConfig(delta=delta, cg_iters=10, cg_damping=0.0, backtrack_iters=15)
    info = trpo_step(params, surrogate, mean_kl, cfg)
    theta_new = flat_concat([p.detach() for p in params])
    with torch.no_grad():  # independent re-check of what the step claims
        kl_now = float(categorical_kl(logp_old, pi(s)).mean())
        L_now = float(surrogate())
    if info.accepted:
        assert kl_now <= delta
        assert kl_now == pytest.approx(info.kl)
        assert L_now > L_old
        assert info.improvement == pytest.approx(L_now - L_old)
        assert not torch.equal(theta_new, theta_old)
    else:
        assert torch.equal(theta_new, theta_old)
        assert info.kl == 0.0 and info.step_frac == 0.0


def test_line_search_backtracks_when_the_quadratic_model_overshoots():
    backtracked = 0
    for seed in range(6):
        pi, _, _, surrogate, mean_kl = toy_problem(seed=seed, scale=3.0)
        info = trpo_step(
            list(pi.parameters()), surrogate, mean_kl, TRPOConfig(delta=1.0, cg_damping=0.0)
        )
        backtracked += info.backtracks > 0
    assert backtracked >= 1  # the previous test really exercised rejection


def test_accept_ratio_rejects_steps_below_the_expected_improvement():
    pi, _, _, surrogate, mean_kl = toy_problem(seed=0)
    params = list(pi.parameters())
    theta_old = flat_concat([p.detach() for p in params]).clone()
    info = trpo_step(params, surrogate, mean_kl, TRPOConfig(delta=0.01, accept_ratio=50.0))
    assert not info.accepted
    assert torch.equal(flat_concat([p.detach() for p in params]), theta_old)
    info = trpo_step(params, surrogate, mean_kl, TRPOConfig(delta=0.01, accept_ratio=0.1))
    assert info.accepted and info.improvement / info.expected_improvement >= 0.1


def test_trpo_step_improves_surrogate_within_trust_region():
    pi, _, _, surrogate, mean_kl = toy_problem(seed=2)
    info = trpo_step(list(pi.parameters()), surrogate, mean_kl, TRPOConfig(delta=0.01))
    assert info.accepted and info.improvement > 0 and 0 < info.kl <= 0.01


def test_small_steps_are_predicted_by_the_linear_and_quadratic_models():
    # as δ → 0, actual/expected improvement → 1 and KL(θ_old + βs) → δ (small damping)
    pi, _, _, surrogate, mean_kl = toy_problem(seed=2)
    cfg = TRPOConfig(delta=1e-5, cg_damping=1e-3, cg_iters=30)
    info = trpo_step(list(pi.parameters()), surrogate, mean_kl, cfg)
    assert info.accepted and info.step_frac == 1.0
    assert info.improvement / info.expected_improvement == pytest.approx(1.0, abs=0.1)
    assert 0.6 * cfg.delta <= info.kl <= cfg.delta


def test_npg_step_takes_the_full_natural_step():
    pi, _, _, surrogate, mean_kl = toy_problem(seed=3)
    params = list(pi.parameters())
    theta_old = flat_concat([p.detach() for p in params]).clone()
    cfg = TRPOConfig(delta=1e-3, cg_iters=50, cg_damping=1e-3, cg_residual_tol=0.0)
    L = surrogate()  # the same direction, computed here independently
    g = flat_grad(L, params)
    fvp = lambda v: fisher_vector_product(mean_kl, params, v, damping=1e-3)  # noqa: E731
    s = conjugate_gradient(fvp, g, iters=50, residual_tol=0.0).x
    beta = max_step_length(float(s @ fvp(s)), 1e-3)
    info = npg_step(params, surrogate, mean_kl, cfg)
    assert info.accepted and info.step_frac == 1.0 and info.backtracks == 0
    step = flat_concat([p.detach() for p in params]) - theta_old
    assert torch.allclose(step, beta * s, rtol=1e-6, atol=1e-10)
    assert info.kl == pytest.approx(1e-3, rel=0.2)  # the quadratic model is accurate here


def test_fvp_on_a_subsample_is_used_for_the_direction_only():
    pi, s, logp_old, surrogate, mean_kl = toy_problem(seed=4, n=200)
    idx = subsample_index(200, 0.25, torch.Generator().manual_seed(0))
    assert idx.numel() == 50 and idx.unique().numel() == 50
    sub = lambda: categorical_kl(logp_old[idx], pi(s[idx])).mean()  # noqa: E731
    info = trpo_step(list(pi.parameters()), surrogate, mean_kl, TRPOConfig(), fvp_kl=sub)
    with torch.no_grad():
        full_kl = float(mean_kl())
    assert info.accepted and full_kl <= 0.01  # the acceptance test used the full KL
    assert torch.equal(subsample_index(10, 1.0), torch.arange(10))
    with pytest.raises(ValueError, match="fraction"):
        subsample_index(10, 0.0)


def test_set_flat_roundtrip_and_size_check():
    pi = ToyPolicy()
    params = list(pi.parameters())
    v = flat_concat([p.detach() for p in params]).clone()
    set_flat_(params, v * 2)
    assert torch.allclose(flat_concat([p.detach() for p in params]), 2 * v)
    with pytest.raises(ValueError, match="entries"):
        set_flat_(params, torch.zeros(v.numel() + 1))


def test_config_rejects_bad_values():
    with pytest.raises(ValidationError):
        TRPOConfig(delta=0.0)
    with pytest.raises(ValidationError):
        TRPOConfig(backtrack_coeff=1.5)
    with pytest.raises(ValidationError):
        TRPOConfig(unknown_key=1)  # type: ignore[call-arg]
    for name, field in TRPOConfig.model_fields.items():
        assert field.description, name


# ----------------------------------------------------------------------------- LLM policy
def test_one_trpo_step_on_the_tiny_llama(tiny):
    """Token-level surrogate with recorded behaviour log-probs q (≠ π_old: off-policy),
    mean full-vocabulary KL(π_old‖π_θ) over action tokens, all trainable parameters."""
    from provrl.train.logprobs import token_logprobs

    model = copy.deepcopy(tiny.model).float().train(False)
    g = torch.Generator().manual_seed(0)
    B, T = 4, 12
    ids = torch.randint(5, 1000, (B, T), generator=g)
    attn = torch.ones(B, T, dtype=torch.bool)
    attn[0, 9:] = False  # one right-padded row
    action = torch.zeros(B, T, dtype=torch.bool)
    action[:, 5:] = True  # the first 5 tokens are the "prompt"
    action &= attn
    adv = torch.where(torch.arange(B) % 2 == 0, 1.0, -1.0)[:, None].expand(B, T)

    def full_logp() -> torch.Tensor:
        logits = model(input_ids=ids, attention_mask=attn.long()).logits[:, :-1].float()
        return torch.log_softmax(logits, dim=-1)  # [B, T-1, V]: predicts ids[:, 1:]

    with torch.no_grad():
        logp_old_full = full_logp()
        logp_old = token_logprobs(model, ids, attn)
    # behaviour log-probs as an engine would record them: a slightly different policy
    logq = logp_old + 0.05 * torch.randn(B, T, generator=g)
    act = action[:, 1:]  # positions whose token is predicted by the previous logits

    def surrogate() -> torch.Tensor:
        logp = token_logprobs(model, ids, attn)
        ratio = torch.exp(logp - logq)
        return (ratio * adv)[action].mean()

    def mean_kl() -> torch.Tensor:
        return categorical_kl(logp_old_full, full_logp())[act].mean()

    params = [p for p in model.parameters() if p.requires_grad]
    with torch.no_grad():
        L_before = float(surrogate())
    cfg = TRPOConfig(delta=0.01, cg_iters=8)
    info = trpo_step(params, surrogate, mean_kl, cfg)
    with torch.no_grad():
        L_after, kl_after = float(surrogate()), float(mean_kl())
    assert info.accepted, info
    assert 0 < kl_after <= cfg.delta
    assert L_after > L_before
    assert info.surrogate_before == pytest.approx(L_before, rel=1e-5)
    assert info.cg_iters >= 1 and info.shs > 0


def test_fvp_through_the_tiny_llama_is_the_kl_hessian(tiny):
    """vᵀ F v from double back-prop equals 2 KL(π_θ ‖ π_{θ+εv}) / ε² (finite difference)."""
    model = copy.deepcopy(tiny.model).double()
    ids = torch.randint(5, 1000, (2, 8), generator=torch.Generator().manual_seed(1))
    params = [p for p in model.parameters() if p.requires_grad]

    def logp() -> torch.Tensor:
        return torch.log_softmax(model(input_ids=ids).logits, dim=-1)

    with torch.no_grad():
        logp_old = logp()
    kl = lambda: categorical_kl(logp_old, logp()).mean()  # noqa: E731
    v = torch.randn(sum(p.numel() for p in params), generator=torch.Generator().manual_seed(2))
    v = v.double() / v.norm()
    vFv = float(v @ fisher_vector_product(kl, params, v))
    theta = flat_concat([p.detach() for p in params]).clone()
    eps = 1e-3
    set_flat_(params, theta + eps * v)
    with torch.no_grad():
        fd = 2 * float(kl()) / eps**2
    assert vFv > 0
    assert vFv == pytest.approx(fd, rel=1e-2)

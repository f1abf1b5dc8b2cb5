"""The TRPO step (Schulman et al. 2015, §6 and Appendix C) for any differentiable policy.

TRPO maximises the surrogate inside a trust region on the mean KL::

    maximise_θ  L(θ) = E_{s,a ~ π_old} [ π_θ(a|s) / q(a|s) · A(s,a) ]
    subject to  D̄_KL(θ) = E_s [ KL(π_old(·|s) ‖ π_θ(·|s)) ] ≤ δ

(q is the behaviour policy: π_old on-policy, the recorded sampling distribution for an
LLM). Linearising L and taking the quadratic model of the KL, D̄_KL ≈ ½ Δθᵀ F Δθ with F the
Fisher matrix (the Hessian of D̄_KL at θ_old), the step is::

    g = ∇_θ L(θ_old)                      (policy gradient)
    s ≈ F⁻¹ g                             (conjugate gradient, only products F v needed)
    β = √(2δ / sᵀ F s)                    (largest step with ½ (βs)ᵀ F (βs) = δ)
    θ = θ_old + α^j β s,  j = 0, 1, …     (backtracking line search)

and the line search accepts the first j with D̄_KL(θ) ≤ δ and L(θ) − L(θ_old) > 0 (and,
optionally, actual / expected improvement ≥ ``accept_ratio``, with expected improvement
α^j β gᵀs). If no j is accepted the parameters are left at θ_old. The natural policy
gradient (NPG, Kakade 2002) is the same direction and step length without the line search.

Everything here is generic over "parameters plus two closures": ``surrogate()`` returns
L(θ) and ``mean_kl()`` returns D̄_KL(θ), both re-evaluated with the *current* parameter
values (the step writes candidate values into ``params`` in place). The policy can be a
tiny MLP or a full causal LM; the Fisher-vector product is double back-propagation of the
mean KL, so nothing policy-specific is assumed.

Names follow the paper and OpenAI Spinning Up: ``delta``, ``cg_iters``, ``cg_damping``,
``backtrack_coeff``, ``backtrack_iters``, ``accept_ratio``.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import torch

from provrl.objectives.config import TRPOConfig

Tensor = torch.Tensor
Closure = Callable[[], Tensor]


@dataclass
class CGResult:
    """Outcome of :func:`conjugate_gradient`."""

    x: Tensor  # the approximate solution of A x = b
    iters: int  # iterations run
    residual: float  # final ‖b − A x‖² as tracked by CG


@dataclass
class TRPOStepInfo:
    """What one :func:`trpo_step` did (log it: it tells whether the step stayed in the region)."""

    accepted: bool  # parameters moved (always True for NPG)
    step_frac: float  # α^j of the accepted trial (0 when rejected)
    backtracks: int  # trials rejected before the accepted one (= backtrack_iters if none)
    beta: float  # β = √(2δ / sᵀFs)
    surrogate_before: float  # L(θ_old)
    surrogate_after: float  # L(θ_new) (= L(θ_old) when rejected)
    improvement: float  # L(θ_new) − L(θ_old)
    expected_improvement: float  # α^j β gᵀs of the accepted (or last tried) step
    kl: float  # mean KL(π_old‖π_θ_new) (0 when rejected)
    grad_norm: float  # ‖g‖
    shs: float  # sᵀ F s (damped)
    cg_iters: int  # CG iterations run
    cg_residual: float  # final squared CG residual

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


# ----------------------------------------------------------------------------- flat vectors
def flat_concat(tensors: Sequence[Tensor]) -> Tensor:
    """All tensors as one flat vector (θ as a point in ℝⁿ)."""
    return torch.cat([t.reshape(-1) for t in tensors])


def flat_grad(
    y: Tensor,
    params: Sequence[Tensor],
    *,
    create_graph: bool = False,
    retain_graph: bool | None = None,
) -> Tensor:
    """∇_θ y as one flat vector; parameters y does not depend on get zeros."""
    grads = torch.autograd.grad(
        y, list(params), create_graph=create_graph, retain_graph=retain_graph, allow_unused=True
    )
    return flat_concat(
        [torch.zeros_like(p) if g is None else g for g, p in zip(grads, params, strict=True)]
    )


@torch.no_grad()
def set_flat_(params: Sequence[Tensor], flat: Tensor) -> None:
    """Write the flat vector ``flat`` into ``params`` in place (inverse of flat_concat)."""
    i = 0
    for p in params:
        n = p.numel()
        p.copy_(flat[i : i + n].view_as(p))
        i += n
    if i != flat.numel():
        raise ValueError(f"set_flat_: vector has {flat.numel()} entries, params need {i}")


# ----------------------------------------------------------------------------- the maths
def conjugate_gradient(
    Avp: Callable[[Tensor], Tensor],
    b: Tensor,
    iters: int = 10,
    residual_tol: float = 1e-10,
) -> CGResult:
    """Solve A x = b for symmetric positive-definite A given only products v ↦ A v.

    Hestenes–Stiefel CG from x₀ = 0 (r₀ = p₀ = b)::

        α_k = r_kᵀr_k / p_kᵀ A p_k
        x_{k+1} = x_k + α_k p_k,     r_{k+1} = r_k − α_k A p_k
        p_{k+1} = r_{k+1} + (r_{k+1}ᵀr_{k+1} / r_kᵀr_k) p_k

    stopping after ``iters`` iterations or once ‖r‖² < ``residual_tol``. In exact
    arithmetic it solves an n-dimensional system in n iterations.
    """
    x = torch.zeros_like(b)
    r = b.clone()
    p = b.clone()
    rdotr = float(r @ r)
    k = 0
    while k < iters and rdotr >= residual_tol:
        Ap = Avp(p)
        pAp = float(p @ Ap)
        if pAp <= 0.0 or not math.isfinite(pAp):  # not SPD along p (or NaN): stop, keep x
            break
        alpha = rdotr / pAp
        x.add_(p, alpha=alpha)
        r.add_(Ap, alpha=-alpha)
        new_rdotr = float(r @ r)
        p.mul_(new_rdotr / rdotr).add_(r)
        rdotr = new_rdotr
        k += 1
    return CGResult(x=x, iters=k, residual=rdotr)


def fisher_vector_product_fn(
    mean_kl: Tensor, params: Sequence[Tensor], damping: float = 0.0
) -> Callable[[Tensor], Tensor]:
    """v ↦ (F + λI) v, with F = ∇²_θ D̄_KL(θ_old) by double back-propagation.

    ``mean_kl`` is D̄_KL(θ) = mean KL(π_old ‖ π_θ) evaluated *at* θ = θ_old with π_old
    detached, so its gradient is zero there and its Hessian is the Fisher matrix. The
    gradient ∇D̄_KL is built once with ``create_graph=True``; each product then is one more
    backward pass through that graph::

        F v = ∇_θ ( (∇_θ D̄_KL)ᵀ v )

    The returned function may be called many times (the graph is retained). Build
    ``mean_kl`` inside :func:`twice_differentiable` when the policy uses fused attention.
    """
    grad_kl = flat_grad(mean_kl, params, create_graph=True)

    def fvp(v: Tensor) -> Tensor:
        hv = flat_grad(grad_kl @ v.detach(), params, retain_graph=True)
        return hv + damping * v if damping else hv

    return fvp


def twice_differentiable() -> contextlib.AbstractContextManager[None]:
    """Context in which attention is computed by differentiable primitive ops.

    Fused scaled-dot-product attention kernels (flash / memory-efficient, CPU and GPU) have
    no derivative of their backward, so F v = ∇((∇D̄_KL)ᵀ v) fails through them. PyTorch's
    "math" SDPA backend is plain matmul + softmax and can be differentiated twice. Models
    loaded with ``attn_implementation="sdpa"`` or ``"eager"`` work; external flash-attention
    kernels do not."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    return sdpa_kernel([SDPBackend.MATH])


def fisher_vector_product(
    mean_kl: Closure, params: Sequence[Tensor], v: Tensor, damping: float = 0.0
) -> Tensor:
    """One product (F + λI) v, evaluating the closure ``mean_kl`` at the current θ."""
    with twice_differentiable():
        kl = mean_kl()
    return fisher_vector_product_fn(kl, params, damping)(v)


def max_step_length(shs: float, delta: float) -> float:
    """β = √(2δ / sᵀFs): along s, the quadratic KL model ½ (βs)ᵀF(βs) equals δ."""
    if not shs > 0.0 or not math.isfinite(shs):
        return 0.0
    return math.sqrt(2.0 * delta / shs)


def subsample_index(n: int, fraction: float, generator: torch.Generator | None = None) -> Tensor:
    """Indices of a uniform subsample of ``ceil(fraction · n)`` of ``n`` samples, sorted.

    Use it to build the KL closure for the Fisher-vector product on a subsample
    (``TRPOConfig.fvp_subsample``): the Fisher estimate only needs a fraction of the data."""
    if not 0 < fraction <= 1:
        raise ValueError(f"subsample_index: fraction must be in (0, 1], got {fraction}")
    k = max(1, math.ceil(fraction * n))
    if k >= n:
        return torch.arange(n)
    return torch.randperm(n, generator=generator)[:k].sort().values


def categorical_kl(logp_old: Tensor, logp_new: Tensor) -> Tensor:
    """KL(π_old ‖ π_new) = Σ_a π_old(a) (log π_old(a) − log π_new(a)) over the last dim.

    Both arguments are log-probabilities (log-softmax outputs); ``logp_old`` should be
    detached. Works for CartPole's 2 actions and an LLM's vocabulary alike."""
    return (logp_old.exp() * (logp_old - logp_new)).sum(-1)


# ----------------------------------------------------------------------------- the step
def _search_direction(
    params: Sequence[Tensor],
    surrogate: Closure,
    mean_kl: Closure,
    cfg: TRPOConfig,
    fvp_kl: Closure | None,
) -> tuple[float, Tensor, CGResult, float]:
    """L(θ_old), g, the CG solve of (F + λI) s = g, and sᵀ(F + λI)s."""
    L_old = surrogate()
    g = flat_grad(L_old, params)
    with twice_differentiable():
        kl = (fvp_kl or mean_kl)()
    fvp = fisher_vector_product_fn(kl, params, cfg.cg_damping)
    cg = conjugate_gradient(fvp, g, cfg.cg_iters, cfg.cg_residual_tol)
    shs = float(cg.x @ fvp(cg.x))
    return float(L_old.detach()), g, cg, shs


def trpo_step(
    params: Sequence[Tensor],
    surrogate: Closure,
    mean_kl: Closure,
    cfg: TRPOConfig,
    *,
    fvp_kl: Closure | None = None,
) -> TRPOStepInfo:
    """One TRPO update of ``params`` in place (or NPG if ``cfg.line_search`` is False).

    Args:
        params: the trainable parameters θ (leaf tensors with ``requires_grad``).
        surrogate: ``() -> L(θ)``, a scalar to *maximise*, e.g. mean(π_θ(a|s)/q(a|s) · A).
        mean_kl: ``() -> D̄_KL(θ)``, scalar mean KL(π_old ‖ π_θ) with π_old detached
            (computed before the step). Used for the Fisher and to check each trial.
        cfg: :class:`TRPOConfig`.
        fvp_kl: optional ``() -> D̄_KL`` on a subsample, used only for the Fisher-vector
            products (``cfg.fvp_subsample``); defaults to ``mean_kl``.

    Steps (see the module docstring): g = ∇L, s ≈ (F + λI)⁻¹ g by CG, β = √(2δ / sᵀFs),
    then θ = θ_old + α^j β s for the first j with D̄_KL ≤ δ and L(θ) − L(θ_old) > 0 (and
    (L(θ) − L(θ_old)) / (α^j β gᵀs) ≥ ``accept_ratio`` when that is > 0); θ_old if none.
    """
    params = list(params)
    if not params:
        raise ValueError("trpo_step: no parameters given")
    L_old, g, cg, shs = _search_direction(params, surrogate, mean_kl, cfg, fvp_kl)
    beta = max_step_length(shs, cfg.delta)
    full_step = beta * cg.x
    expected_full = float(g @ full_step)
    theta_old = flat_concat([p.detach() for p in params]).clone()

    info = TRPOStepInfo(
        accepted=False,
        step_frac=0.0,
        backtracks=0,
        beta=beta,
        surrogate_before=L_old,
        surrogate_after=L_old,
        improvement=0.0,
        expected_improvement=0.0,
        kl=0.0,
        grad_norm=float(g.norm()),
        shs=shs,
        cg_iters=cg.iters,
        cg_residual=cg.residual,
    )
    if beta == 0.0 or not math.isfinite(expected_full):
        info.backtracks = cfg.backtrack_iters
        return info

    if not cfg.line_search:  # NPG: the full natural step, no checks
        set_flat_(params, theta_old + full_step)
        with torch.no_grad():
            L_new, kl = float(surrogate()), float(mean_kl())
        info.accepted, info.step_frac = True, 1.0
        info.surrogate_after, info.improvement, info.kl = L_new, L_new - L_old, kl
        info.expected_improvement = expected_full
        return info

    accepted, frac, L_new, kl, trials = line_search(
        params, theta_old, full_step, expected_full, L_old, surrogate, mean_kl, cfg
    )
    info.accepted, info.backtracks = accepted, trials
    info.expected_improvement = frac * expected_full
    if accepted:
        info.step_frac, info.surrogate_after, info.kl = frac, L_new, kl
        info.improvement = L_new - L_old
    return info


def npg_step(
    params: Sequence[Tensor],
    surrogate: Closure,
    mean_kl: Closure,
    cfg: TRPOConfig,
    *,
    fvp_kl: Closure | None = None,
) -> TRPOStepInfo:
    """Natural policy gradient: θ ← θ_old + β s with β = √(2δ / sᵀFs), no line search."""
    return trpo_step(
        params, surrogate, mean_kl, cfg.model_copy(update={"line_search": False}), fvp_kl=fvp_kl
    )


@torch.no_grad()
def line_search(
    params: Sequence[Tensor],
    theta_old: Tensor,
    full_step: Tensor,
    expected_full: float,
    L_old: float,
    surrogate: Closure,
    mean_kl: Closure,
    cfg: TRPOConfig,
) -> tuple[bool, float, float, float, int]:
    """Backtracking: try θ = θ_old + α^j · full_step for j = 0 … backtrack_iters − 1.

    Accept the first trial with ``mean_kl() ≤ δ`` and improvement ``surrogate() − L_old > 0``
    (and improvement / (α^j · expected_full) ≥ ``accept_ratio`` if that is > 0). On success
    ``params`` hold the accepted θ; otherwise they are restored to θ_old.

    Returns (accepted, α^j, L(θ), KL(θ), trials rejected before acceptance).
    """
    frac = 1.0
    for j in range(cfg.backtrack_iters):
        set_flat_(params, theta_old + frac * full_step)
        kl = float(mean_kl())
        if math.isfinite(kl) and kl <= cfg.delta:
            L_new = float(surrogate())
            improvement = L_new - L_old
            expected = frac * expected_full
            ratio_ok = cfg.accept_ratio <= 0 or (
                expected > 0 and improvement / expected >= cfg.accept_ratio
            )
            if math.isfinite(L_new) and improvement > 0 and ratio_ok:
                return True, frac, L_new, kl, j
        frac *= cfg.backtrack_coeff
    set_flat_(params, theta_old)
    return False, 0.0, L_old, 0.0, cfg.backtrack_iters

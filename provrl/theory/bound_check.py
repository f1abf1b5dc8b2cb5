"""The bound checker: Theorem 1 of TRPO on many exact cases, random and adversarial.

For every sampled MDP it draws policy pairs (π, π') from six families and evaluates them in one
batched exact solve (:func:`provrl.theory.exact.compare`):

- ``random``     π, π' independent random softmax policies;
- ``local``      π' = softmax(log π + σ·N(0, I)), σ log-uniform in [1e-3, 1];
- ``high_adv``   a small change η ∈ [1e-4, 0.5] at the 1–3 states with the largest |A_π|,
                 towards the best (or the worst) action there, nowhere else;
- ``near_det``   near-deterministic π = softmax(β g) (β ∈ [8, 30]) and π' with the argmax
                 moved at a random subset of states;
- ``cpi``        conservative policy iteration, π' = (1 − η)π + η·greedy(Q_π);
- ``search``     adversarial hill-climbing on π' that maximises |J(π') − L_π(π')| / bound,
                 started from the tightest pair found so far for that MDP.

Checks per pair: the identity J(π') − J(π) = Σ_s ρ_π'(s) Ā(s) to ``identity_tol``; the coupling
bound, its looser form, the KL lower bound, and tight ≤ loose.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, fields
from typing import Any

import numpy as np
from tqdm import tqdm

from provrl.theory.config import BoundCheckConfig
from provrl.theory.exact import PairReport, compare, evaluate, greedy_policy, tv_bound_tight
from provrl.theory.mdp import TabularMDP, chain_mdp, gridworld_mdp, random_mdp

MDP_FAMILIES = ("random_dense", "random_sparse", "random_signed", "chain", "gridworld")
PAIR_FAMILIES = ("random", "local", "high_adv", "near_det", "cpi", "search")
QUANTILES = (0.5, 0.9, 0.99, 1.0)


def softmax(logits: np.ndarray) -> np.ndarray:
    z = np.exp(logits - logits.max(-1, keepdims=True))
    return z / z.sum(-1, keepdims=True)


def _log_uniform(rng: np.random.Generator, lo: float, hi: float, size: Any = None) -> Any:
    return np.exp(rng.uniform(np.log(lo), np.log(hi), size))


def sample_mdp(rng: np.random.Generator, index: int, cfg: BoundCheckConfig) -> TabularMDP:
    """The ``index``-th MDP: families in turn, sizes and γ at random."""
    family = MDP_FAMILIES[index % len(MDP_FAMILIES)]
    mdp = _sample_family(rng, family, cfg)
    mdp.info["family"] = family
    return mdp


def _sample_family(rng: np.random.Generator, family: str, cfg: BoundCheckConfig) -> TabularMDP:
    gamma = float(rng.choice(cfg.gammas))
    top = max(cfg.max_states, 3)
    if family == "random_dense":
        return random_mdp(
            rng, int(rng.integers(2, min(top, 20) + 1)), int(rng.integers(2, 6)), gamma
        )
    if family == "random_sparse":
        S = int(rng.integers(3, top + 1))
        return random_mdp(
            rng,
            S,
            int(rng.integers(2, 6)),
            gamma,
            branching=int(rng.integers(1, 4)),
            reward="sparse",
            start="single",
        )
    if family == "random_signed":
        return random_mdp(
            rng, int(rng.integers(2, top + 1)), int(rng.integers(2, 4)), gamma, reward="signed"
        )
    if family == "chain":
        return chain_mdp(int(rng.integers(2, min(top, 15) + 1)), gamma)
    side = int(np.sqrt(top))
    return gridworld_mdp(int(rng.integers(2, side + 1)), int(rng.integers(2, side + 1)), gamma)


def _random_policy(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    temperature = _log_uniform(rng, 0.3, 3.0, (*shape[:-2], 1, 1))
    return softmax(temperature * rng.normal(size=shape))


def propose_pairs(
    rng: np.random.Generator, mdp: TabularMDP, n: int
) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """``n`` pairs of each non-search family, stacked: ``pi[N, S, A]``, ``pi_new[N, S, A]``."""
    S, A = mdp.n_states, mdp.n_actions
    pis, news, fams = [], [], []

    def add(fam: str, pi: np.ndarray, new: np.ndarray) -> None:
        pis.append(pi)
        news.append(new)
        fams.append(fam)

    for _ in range(n):
        add("random", _random_policy(rng, (S, A)), _random_policy(rng, (S, A)))
        pi = _random_policy(rng, (S, A))
        sigma = _log_uniform(rng, 1e-3, 1.0)
        add("local", pi, softmax(np.log(pi) + sigma * rng.normal(size=(S, A))))
        pi = _random_policy(rng, (S, A))
        adv = evaluate(mdp, pi).A
        k = int(rng.integers(1, min(3, S) + 1))
        states = np.argsort(-np.abs(adv).max(-1))[:k]
        towards = adv.argmax(-1) if rng.random() < 0.5 else adv.argmin(-1)
        eta = _log_uniform(rng, 1e-4, 0.5)
        new = pi.copy()
        new[states] = (1 - eta) * pi[states] + eta * np.eye(A)[towards[states]]
        add("high_adv", pi, new)
        beta = rng.uniform(8.0, 30.0)
        g = rng.normal(size=(S, A))
        g2 = g.copy()
        flip = rng.random(S) < _log_uniform(rng, 1.0 / (S + 1), 1.0)
        flip[rng.integers(S)] = True
        rows = np.flatnonzero(flip)
        best = g2[rows].argmax(-1)
        other = (best + rng.integers(1, A, size=rows.size)) % A
        g2[rows, best], g2[rows, other] = g[rows, other], g[rows, best]
        add("near_det", softmax(beta * g), softmax(beta * g2))
        pi = _random_policy(rng, (S, A))
        eta = _log_uniform(rng, 1e-3, 1.0)
        add("cpi", pi, (1 - eta) * pi + eta * greedy_policy(evaluate(mdp, pi).Q))
    return np.stack(pis), np.stack(news), fams


def tightness(rep: PairReport) -> dict[str, np.ndarray]:
    """Actual / bound for each bound (NaN where π' = π, i.e. α = 0 and both sides vanish):
    |J' − L| / tight bound, |J' − L| / loose bound, (L − J')⁺ / (C·D_KL^max)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        moved = rep.alpha > 0
        gap = np.abs(rep.gap)
        kl_pen = rep.C * rep.kl_max
        return {
            "tv_tight": np.where(moved, gap / rep.bound_tight, np.nan),
            "tv_loose": np.where(moved, gap / rep.bound_loose, np.nan),
            "kl": np.where(moved & (kl_pen > 0), np.maximum(-rep.gap, 0.0) / kl_pen, np.nan),
        }


def violations(
    mdp: TabularMDP, rep: PairReport, cfg: BoundCheckConfig, qmax: float
) -> dict[str, np.ndarray]:
    """Boolean arrays, one per check. A bound counts as violated when the actual value
    exceeds it by more than ``bound_rtol``·bound + 1e-14·α²·max|Q|/(1−γ)² (the round-off of a
    gap computed from an exact occupancy difference)."""
    g = mdp.gamma
    slack = 1e-14 * rep.alpha**2 * qmax / (1.0 - g) ** 2
    gap = np.abs(rep.gap)
    with np.errstate(invalid="ignore"):
        kl_pen = np.where(rep.C > 0, rep.C * rep.kl_max, 0.0)
    return {
        "identity": rep.identity_error > cfg.identity_tol,
        "tv_tight": gap > rep.bound_tight * (1 + cfg.bound_rtol) + slack,
        "tv_loose": gap > rep.bound_loose * (1 + cfg.bound_rtol) + slack,
        "kl": -rep.gap > kl_pen * (1 + cfg.bound_rtol) + slack,
        "tight_le_loose": rep.bound_tight > rep.bound_loose * (1 + 1e-12),
    }


def misreading_violations(mdp: TabularMDP, rep: PairReport) -> dict[str, np.ndarray]:
    """The same bounds with the state-maxima replaced by d_π-averages — what a reader who
    carries the practical average-KL constraint back into Theorem 1 would check. These are
    NOT bounds; counting their failures shows why the theorem needs α and D_KL^max."""
    avg_tight = tv_bound_tight(rep.epsilon, mdp.gamma, rep.tv_mean)
    return {
        "tv_tight_with_mean_tv": np.abs(rep.gap) > avg_tight * (1 + 1e-6),
        "kl_with_mean_kl": -rep.gap > rep.C * rep.kl_mean * (1 + 1e-6),
    }


def adversarial_search(
    rng: np.random.Generator,
    mdp: TabularMDP,
    pi: np.ndarray,
    pi_new: np.ndarray,
    steps: int,
    candidates: int,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(1+λ) hill-climbing on the pair (π, π') to maximise |J(π') − L_π(π')| / tight bound.
    Each step perturbs the logits of π' (and, in half of the candidates, of π) with
    log-uniform noise scales and keeps the best pair. Returns (π, π', best ratio per step)."""
    best_pi, best_new = pi, pi_new
    best_ratio = float(np.nan_to_num(tightness(compare(mdp, pi, pi_new))["tv_tight"]))
    ratios = []
    for _ in range(steps):
        shape = (candidates, *pi.shape)
        s_new = _log_uniform(rng, 1e-3, 2.0, (candidates, 1, 1))
        s_old = _log_uniform(rng, 1e-3, 2.0, (candidates, 1, 1)) * (
            rng.random((candidates, 1, 1)) < 0.5
        )
        new = softmax(np.log(np.maximum(best_new, 1e-300)) + s_new * rng.normal(size=shape))
        old = softmax(np.log(np.maximum(best_pi, 1e-300)) + s_old * rng.normal(size=shape))
        r = np.nan_to_num(tightness(compare(mdp, old, new))["tv_tight"])
        i = int(r.argmax())
        if r[i] > best_ratio:
            best_ratio, best_pi, best_new = float(r[i]), old[i], new[i]
        ratios.append(best_ratio)
    return best_pi, best_new, np.asarray(ratios)


def _append(rep: PairReport, more: PairReport) -> PairReport:
    """The pairs of ``rep`` followed by those of ``more`` (1-D batches)."""
    return PairReport(
        **{
            f.name: np.concatenate([getattr(rep, f.name), getattr(more, f.name)])
            for f in fields(rep)
        }
    )


@dataclass
class BoundCheckResult:
    """Per-pair arrays (for the plot) and the JSON summary."""

    summary: dict[str, Any]
    alpha: np.ndarray
    gap_over_eps: np.ndarray
    gamma: np.ndarray
    family: np.ndarray
    ratios: dict[str, np.ndarray] = field(default_factory=dict)


def _quantiles(x: np.ndarray) -> dict[str, float]:
    x = x[np.isfinite(x)]
    if x.size == 0:
        return {f"q{int(q * 100)}": float("nan") for q in QUANTILES}
    out = {f"q{int(q * 100)}": float(np.quantile(x, q)) for q in QUANTILES[:-1]}
    out["max"] = float(x.max())
    return out


def check_bounds(cfg: BoundCheckConfig, *, progress: bool = True) -> BoundCheckResult:
    """Sample ``cfg.mdps`` MDPs and their policy pairs; check identity and bounds exactly."""
    rng = np.random.default_rng(cfg.seed)
    t0 = time.perf_counter()
    cols: dict[str, list[np.ndarray]] = {
        k: [] for k in ("alpha", "gap_eps", "gamma", "tv_tight", "tv_loose", "kl", "id_err")
    }
    fams: list[str] = []
    mdp_fams: list[str] = []
    bad: dict[str, int] = {}
    misread: dict[str, int] = {}
    worst: dict[str, Any] = {"tv_tight": -1.0}
    first_violation: dict[str, Any] | None = None
    for i in tqdm(range(cfg.mdps), desc="bound check", unit="mdp", disable=not progress):
        mdp = sample_mdp(rng, i, cfg)
        mdp_fams.append(str(mdp.info["family"]))
        pi, new, fam = propose_pairs(rng, mdp, cfg.pairs_per_family)
        rep = compare(mdp, pi, new)
        if cfg.search_steps > 0:
            r0 = np.nan_to_num(tightness(rep)["tv_tight"])
            j = int(r0.argmax())
            adv_pi, adv_new, _ = adversarial_search(
                rng, mdp, pi[j], new[j], cfg.search_steps, cfg.search_candidates
            )
            fam = [*fam, "search"]
            rep = _append(rep, compare(mdp, adv_pi[None], adv_new[None]))
        viol = violations(mdp, rep, cfg, float(rep.q_max.max()))
        for name, v in misreading_violations(mdp, rep).items():
            misread[name] = misread.get(name, 0) + int(v.sum())
        for name, v in viol.items():
            bad[name] = bad.get(name, 0) + int(v.sum())
            if v.any() and first_violation is None:
                idx = int(np.flatnonzero(v)[0])
                first_violation = {
                    "check": name,
                    "mdp": mdp.name,
                    "gamma": mdp.gamma,
                    "family": fam[idx],
                    "gap": float(rep.gap[idx]),
                    "bound_tight": float(rep.bound_tight[idx]),
                    "alpha": float(rep.alpha[idx]),
                }
        tight = tightness(rep)
        with np.errstate(divide="ignore", invalid="ignore"):
            gap_eps = np.abs(rep.gap) / rep.epsilon
        cols["alpha"].append(rep.alpha)
        cols["gap_eps"].append(gap_eps)
        cols["gamma"].append(np.full(len(fam), mdp.gamma))
        cols["id_err"].append(rep.identity_error)
        for k in ("tv_tight", "tv_loose", "kl"):
            cols[k].append(tight[k])
        fams.extend(fam)
        w = int(np.nan_to_num(tight["tv_tight"], nan=-1.0).argmax())
        if tight["tv_tight"][w] > worst["tv_tight"]:
            worst = {
                "tv_tight": float(tight["tv_tight"][w]),
                "family": fam[w],
                "mdp": mdp.name,
                "gamma": mdp.gamma,
                "alpha": float(rep.alpha[w]),
                "gap": float(rep.gap[w]),
                "bound_tight": float(rep.bound_tight[w]),
            }
    runtime = time.perf_counter() - t0
    arr = {k: np.concatenate(v) for k, v in cols.items()}
    family = np.asarray(fams)
    moved = arr["alpha"] > 0
    summary: dict[str, Any] = {
        "violations": int(sum(bad.values())),
        "violations_by_check": bad,
        "first_violation": first_violation,
        "mdps": cfg.mdps,
        "pairs": len(fams),
        "pairs_moved": int(moved.sum()),
        "mdps_by_family": {f: mdp_fams.count(f) for f in MDP_FAMILIES},
        "pairs_by_family": {f: int((family == f).sum()) for f in PAIR_FAMILIES},
        "misreading_violations": misread,
        "identity_max_abs_error": float(arr["id_err"].max()),
        "identity_tol": cfg.identity_tol,
        "tightness": {k: _quantiles(arr[k]) for k in ("tv_tight", "tv_loose", "kl")},
        "tightness_tv_tight_by_family": {
            f: _quantiles(arr["tv_tight"][family == f]) for f in PAIR_FAMILIES
        },
        "worst_case": worst,
        "runtime_s": round(runtime, 3),
        "pairs_per_s": round(len(fams) / runtime, 1),
        "config": cfg.model_dump(),
    }
    return BoundCheckResult(
        summary=summary,
        alpha=arr["alpha"],
        gap_over_eps=arr["gap_eps"],
        gamma=arr["gamma"],
        family=family,
        ratios={k: arr[k] for k in ("tv_tight", "tv_loose", "kl")},
    )

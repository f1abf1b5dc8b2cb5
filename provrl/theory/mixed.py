"""Mixed-version sampling, exactly: importance weights when the behaviour policy changes
version in the middle of a trajectory (a hot-load), on a sequence model small enough to
enumerate every trajectory.

The model is a tabular autoregressive policy over full histories: π(a_t | h_t) =
softmax(logits[h_t]) with h_t = (a_0, …, a_{t−1}), vocabulary V, length T, so the V^T
trajectories and their probabilities are exact. Policy versions lie on a line in logit space,
logits_v = base + v·η·Δ (η = the size of one update). A hot-load at token κ means tokens t < κ
were sampled by version v_old and tokens t ≥ κ by v_new, so (docs/provenance.md)

    q_κ(τ) = Π_{t<κ} q_old(a_t|h_t) · Π_{t≥κ} q_new(a_t|h_t),
    w(τ) = Π_t π_θ(a_t|h_t) / q_{v_t}(a_t|h_t),

and, for any switch distribution P(κ) independent of the tokens,
E_{κ∼P, τ∼q_κ}[w(τ) f(τ)] = Σ_κ P(κ) Σ_τ π_θ(τ) f(τ) = E_{π_θ}[f] (unbiased).
Every expectation below is a finite sum over all (κ, τ) — no sampling.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy.special import logsumexp


@dataclass(frozen=True)
class SequenceModel:
    """All V^T trajectories of a tabular sequence policy and the index of each history.

    ``seqs[n, t]`` is token t of trajectory n; ``hist[n, t]`` indexes the row of the logits
    table that holds π(· | a_0 … a_{t−1}) (rows: the empty history, then every prefix)."""

    vocab: int
    length: int
    seqs: np.ndarray  # [N, T]
    hist: np.ndarray  # [N, T]
    n_hist: int

    @staticmethod
    def build(vocab: int, length: int) -> SequenceModel:
        V, T = int(vocab), int(length)
        if V < 2 or T < 1:
            raise ValueError(f"SequenceModel: need vocab ≥ 2 and length ≥ 1, got {V}, {T}")
        if V**T > 2_000_000:
            raise ValueError(f"SequenceModel: V^T = {V**T} trajectories is too many to enumerate")
        N = V**T
        seqs = np.stack(np.unravel_index(np.arange(N), (V,) * T), -1)
        offsets = np.concatenate([[0], np.cumsum(V ** np.arange(T))])  # rows before depth t
        code = np.zeros(N, dtype=np.int64)
        hist = np.empty((N, T), dtype=np.int64)
        for t in range(T):  # T ≤ ~20: a loop over positions, not over states
            hist[:, t] = offsets[t] + code
            code = code * V + seqs[:, t]
        return SequenceModel(V, T, seqs, hist, int(offsets[T]))

    def token_logprobs(self, log_table: np.ndarray) -> np.ndarray:
        """log π(a_t | h_t) for every trajectory and position, [N, T]; ``log_table`` is the
        [n_hist, V] table of log-probabilities (−inf allowed: truncated tokens)."""
        return log_table[self.hist, self.seqs]


def log_softmax(logits: np.ndarray) -> np.ndarray:
    return logits - logsumexp(logits, axis=-1, keepdims=True)


def top_p_log_table(log_table: np.ndarray, top_p: float) -> tuple[np.ndarray, np.ndarray]:
    """Nucleus truncation of every row: keep the most likely tokens until the mass *before*
    a token reaches ``top_p`` (the top token is always kept), renormalise by the kept mass.
    Returns (log q̃, kept) — log q̃ = −inf outside the kept set."""
    if not 0.0 < top_p <= 1.0:
        raise ValueError(f"top_p must lie in (0, 1], got {top_p}")
    p = np.exp(log_table)
    if top_p >= 1.0:
        kept = p > 0
    else:
        order = np.argsort(-p, axis=-1, kind="stable")
        sorted_p = np.take_along_axis(p, order, -1)
        before = np.cumsum(sorted_p, -1) - sorted_p
        kept = np.zeros_like(p, dtype=bool)
        np.put_along_axis(kept, order, before < top_p, -1)
    mass = np.where(kept, p, 0.0).sum(-1, keepdims=True)
    with np.errstate(divide="ignore"):
        return np.where(kept, log_table - np.log(mass), -np.inf), kept


def switch_log_behaviour(lp_old: np.ndarray, lp_new: np.ndarray) -> np.ndarray:
    """log q_κ(τ) for every switch point κ = 0 … T (rows) and trajectory (columns):
    Σ_{t<κ} log q_old(a_t|h_t) + Σ_{t≥κ} log q_new(a_t|h_t), by cumulative sums."""
    N, _T = lp_old.shape
    zero = np.zeros((N, 1))
    head = np.concatenate([zero, np.cumsum(lp_old, 1)], 1)  # Σ_{t<κ} old, κ = 0..T
    tail = np.concatenate([np.cumsum(lp_new[:, ::-1], 1)[:, ::-1], zero], 1)  # Σ_{t≥κ} new
    return (head + tail).T


def expected_estimate(log_q: np.ndarray, log_w: np.ndarray, f: np.ndarray) -> np.ndarray:
    """E_{τ∼q}[w(τ) f(τ)] = Σ_τ q(τ) w(τ) f(τ), summed over the support of q only (a
    trajectory q never samples contributes nothing, whatever its weight). Broadcasts over
    leading axes (e.g. switch points)."""
    on = np.isfinite(log_q)
    with np.errstate(invalid="ignore", over="ignore"):
        terms = np.where(on, np.exp(np.where(on, log_q + log_w, -np.inf)) * f, 0.0)
    return terms.sum(-1)


def second_moment(log_q: np.ndarray, log_w: np.ndarray, f: np.ndarray) -> np.ndarray:
    """E_{τ∼q}[(w f)²] (for the standard deviation of the single-trajectory estimator)."""
    on = np.isfinite(log_q)
    with np.errstate(invalid="ignore", over="ignore"):
        lw = np.where(on, log_w, 0.0)
        terms = np.where(on, np.exp(np.where(on, log_q + 2 * lw, -np.inf)) * f**2, 0.0)
    return terms.sum(-1)


@dataclass(frozen=True)
class Versions:
    """A base policy and an update direction: logits_v = base + v·η·Δ over all histories."""

    base: np.ndarray  # [n_hist, V]
    direction: np.ndarray  # [n_hist, V]

    @staticmethod
    def random(model: SequenceModel, seed: int, favour: int = 0) -> Versions:
        """Base logits N(0, 1); Δ = N(0, ½²) plus +1 on token ``favour`` (the update learns to
        emit the rewarded token, as a policy-gradient step on f = share of that token would)."""
        rng = np.random.default_rng(seed)
        base = rng.normal(size=(model.n_hist, model.vocab))
        direction = 0.5 * rng.normal(size=(model.n_hist, model.vocab))
        direction[:, favour] += 1.0
        return Versions(base, direction)

    def log_table(self, version: float, eta: float) -> np.ndarray:
        return log_softmax(self.base + version * eta * self.direction)


def reward_share(model: SequenceModel, token: int = 0) -> np.ndarray:
    """f(τ) = share of tokens equal to ``token`` (a reward in [0, 1])."""
    return (model.seqs == token).mean(1)


ESTIMATORS = ("exact", "latest", "earliest", "none")


def attribution_biases(
    model: SequenceModel,
    versions: Versions,
    f: np.ndarray,
    eta: float,
    *,
    target_version: int = 1,
    behaviour_after: np.ndarray | None = None,
) -> dict[str, Any]:
    """Exact E[estimate] − E_{π_θ}[f] for each attribution rule and switch point κ = 0 … T.

    - ``exact``: per-token provenance, w = Π_t π_θ/q_{v_t} with the probability the sampler
      actually used (unbiased);
    - ``latest``: the whole trajectory attributed to v_new, w = Π_t π_θ/q_new;
    - ``earliest``: the whole trajectory attributed to v_old, w = Π_t π_θ/q_old;
    - ``none``: no correction, w = 1 (the trajectory treated as on-policy).

    ``behaviour_after``: the log-table actually sampled from after the switch (default: v_new;
    the stale-KV example passes a blend) — the exact estimator always uses it, the attribution
    rules recompute π_{v} from the version label."""
    lt_old, lt_new = versions.log_table(0, eta), versions.log_table(1, eta)
    lt_act = lt_new if behaviour_after is None else behaviour_after
    lp_old, lp_new, lp_act = (model.token_logprobs(x) for x in (lt_old, lt_new, lt_act))
    lp_target = model.token_logprobs(versions.log_table(target_version, eta))
    log_pi = lp_target.sum(1)
    truth = float(np.exp(log_pi) @ f)
    log_q = switch_log_behaviour(lp_old, lp_act)  # [T+1, N]
    log_w = {
        "exact": log_pi[None] - log_q,
        "latest": (log_pi - lp_new.sum(1))[None],
        "earliest": (log_pi - lp_old.sum(1))[None],
        "none": np.zeros((1, f.size)),
    }
    label = switch_log_behaviour(lp_old, lp_new)
    log_w["label"] = log_pi[None] - label  # per-token versions, recomputed from the label
    bias = {k: expected_estimate(log_q, w, f) - truth for k, w in log_w.items()}
    std = {
        k: np.sqrt(np.maximum(second_moment(log_q, w, f) - (bias[k] + truth) ** 2, 0.0))
        for k, w in log_w.items()
    }
    return {"truth": truth, "bias": bias, "std": std}


def trajectory_kl(model: SequenceModel, lt_p: np.ndarray, lt_q: np.ndarray) -> float:
    """D_KL(p ‖ q) between the trajectory distributions of two log-tables."""
    lp, lq = model.token_logprobs(lt_p).sum(1), model.token_logprobs(lt_q).sum(1)
    return float(np.exp(lp) @ (lp - lq))


def top_p_analysis(
    model: SequenceModel,
    versions: Versions,
    f: np.ndarray,
    eta: float,
    top_p: float,
    *,
    target_version: int = 1,
) -> dict[str, float]:
    """What top-p sampling does to exact IS, averaged over a uniform switch point.

    With q̃_v the truncated, renormalised behaviour and supp_κ = {τ : q̃_κ(τ) > 0}:

    - exact weights w = Π π_θ/q̃_{v_t}:  E_q̃[w f] = Σ_{τ∈supp} π_θ(τ) f(τ), so the bias is
      −Σ_{τ∉supp} π_θ(τ) f(τ): what the sampler can never produce is missing, and no reweighting
      of the samples it does produce can restore it;
    - the missing mass M = Pr_{π_θ}(τ ∉ supp) = 1 − E_q̃[w] is measurable, and also equals
      E_q̃[Σ_t w_{<t} m_t] with m_t = π_θ mass outside the kept set at h_t (first exit at t);
    - hence |bias| ≤ M·max|f|, and E_{π_θ} f ∈ [E_q̃[wf] + M·min f, E_q̃[wf] + M·max f];
    - self-normalised E_q̃[w f]/E_q̃[w] = E_{π_θ}[f | supp] (still biased unless f is
      independent of leaving the support);
    - weights with the pre-truncation probability (a logprob taken before top-p) are wrong
      even on the support: they miss the 1/kept_mass factor per token.
    """
    lt_old, lt_new = versions.log_table(0, eta), versions.log_table(1, eta)
    lt_target = versions.log_table(target_version, eta)
    (lq_old, keep_old), (lq_new, keep_new) = (top_p_log_table(x, top_p) for x in (lt_old, lt_new))
    lp_pi = model.token_logprobs(lt_target)
    log_pi = lp_pi.sum(1)
    truth = float(np.exp(log_pi) @ f)
    log_q = switch_log_behaviour(model.token_logprobs(lq_old), model.token_logprobs(lq_new))
    log_w = log_pi[None] - log_q
    est = expected_estimate(log_q, log_w, f)
    mean_w = expected_estimate(log_q, log_w, np.ones_like(f))
    pre = log_pi[None] - switch_log_behaviour(
        model.token_logprobs(lt_old), model.token_logprobs(lt_new)
    )
    est_pre = expected_estimate(log_q, pre, f)
    # per-token missing π mass m_t at every history, under the version that sampled it
    pi_tab = np.exp(lt_target)
    m_old = 1.0 - np.where(keep_old, pi_tab, 0.0).sum(-1)
    m_new = 1.0 - np.where(keep_new, pi_tab, 0.0).sum(-1)
    T = model.length
    kappa = np.arange(T + 1)[:, None, None]
    t = np.arange(T)[None, None, :]
    m_t = np.where(t < kappa, m_old[model.hist][None], m_new[model.hist][None])  # [T+1, N, T]
    lq_tok = np.where(
        t < kappa,
        model.token_logprobs(lq_old)[None],
        model.token_logprobs(lq_new)[None],
    )
    ratio = lp_pi[None] - lq_tok  # +inf where the token was truncated
    prefix_logw = np.concatenate(  # Σ_{s<t} log π_θ/q̃ (exclusive prefix sum)
        [np.zeros((*ratio.shape[:-1], 1)), np.cumsum(ratio, -1)[..., :-1]], -1
    )
    with np.errstate(invalid="ignore"):
        per_token = np.where(np.isfinite(prefix_logw), np.exp(prefix_logw) * m_t, 0.0).sum(-1)
    M_decomp = expected_estimate(log_q, np.zeros_like(per_token), per_token).mean()
    on = np.isfinite(log_q)
    M_exact = float((np.where(on, 0.0, np.exp(log_pi)[None])).sum(-1).mean())
    missing_f = float((np.where(on, 0.0, (np.exp(log_pi) * f)[None])).sum(-1).mean())
    est_mean, M_est = float(est.mean()), float(1.0 - mean_w.mean())
    lq_t, _ = top_p_log_table(lt_target, top_p)
    truncated_target = float(np.exp(model.token_logprobs(lq_t).sum(1)) @ f)
    return {
        "top_p": top_p,
        "truth": truth,
        "bias_exact_weights": est_mean - truth,
        "minus_missing_contribution": -missing_f,
        "missing_mass": M_exact,
        "missing_mass_from_mean_weight": M_est,
        "missing_mass_from_token_decomposition": float(M_decomp),
        "bias_bound": M_exact * float(np.abs(f).max()),
        "interval_low": est_mean + M_exact * float(f.min()),
        "interval_high": est_mean + M_exact * float(f.max()),
        "bias_self_normalised": float((est / mean_w).mean()) - truth,
        "bias_pre_truncation_weights": float(est_pre.mean()) - truth,
        "objective_shift_if_target_truncated": truncated_target - truth,
    }


def mixed_version_report(
    vocab: int = 4,
    length: int = 6,
    eta: float = 1.0,
    eta_grid: tuple[float, ...] = (0.0, 0.25, 0.5, 1.0, 2.0),
    target_version: int = 1,
    top_p: float = 0.9,
    kv_mix: float = 0.3,
    seed: int = 0,
    top_p_grid: tuple[float, ...] = (0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 0.99, 1.0),
) -> dict[str, Any]:
    """The default example of ``provrl theory mixed``: biases per switch point, averaged over
    a uniform κ ∈ {0, …, T}, as a function of η; the stale-KV variant; top-p."""
    model = SequenceModel.build(vocab, length)
    versions = Versions.random(model, seed)
    f = reward_share(model)
    main = attribution_biases(model, versions, f, eta, target_version=target_version)
    ahead = attribution_biases(model, versions, f, eta, target_version=target_version + 1)
    by_eta: dict[str, list[float]] = {k: [] for k in ESTIMATORS}
    kl_eta = []
    curves = {}
    for e in eta_grid:
        r = attribution_biases(model, versions, f, e, target_version=target_version)
        for k in ESTIMATORS:
            by_eta[k].append(float(r["bias"][k].mean()))
        kl_eta.append(trajectory_kl(model, versions.log_table(1, e), versions.log_table(0, e)))
        curves[f"{e:g}"] = {k: r["bias"][k].tolist() for k in ("latest", "earliest", "exact")}
    # stale KV after a keep-mode hot-load: the sampled distribution blends in old-version logits
    stale = log_softmax(
        (1 - kv_mix) * (versions.base + eta * versions.direction) + kv_mix * versions.base
    )
    kv = attribution_biases(
        model, versions, f, eta, target_version=target_version, behaviour_after=stale
    )
    sweep = [
        top_p_analysis(model, versions, f, eta, p, target_version=target_version)
        for p in top_p_grid
    ]
    return {
        "model": {
            "vocab": vocab,
            "length": length,
            "trajectories": int(model.seqs.shape[0]),
            "histories": model.n_hist,
            "eta": eta,
            "target_version": target_version,
            "seed": seed,
            "f": "share of token 0 in the trajectory",
            "switch_point": "uniform on {0, …, T}; tokens t < κ from v_old = 0, t ≥ κ from v_new = 1",
        },
        "E_pi_f": main["truth"],
        "trajectory_kl_new_old": trajectory_kl(
            model, versions.log_table(1, eta), versions.log_table(0, eta)
        ),
        "by_switch_point": {
            "kappa": list(range(length + 1)),
            **{f"bias_{k}": main["bias"][k].tolist() for k in ESTIMATORS},
        },
        "averaged_over_switch": {
            k: {
                "bias": float(main["bias"][k].mean()),
                "relative_bias": float(main["bias"][k].mean() / main["truth"]),
                "std_single_trajectory": float(
                    np.sqrt(
                        np.mean(main["std"][k] ** 2 + (main["bias"][k] + main["truth"]) ** 2)
                        - (main["bias"][k].mean() + main["truth"]) ** 2
                    )
                ),
            }
            for k in ESTIMATORS
        },
        "averaged_over_switch_target_one_version_ahead": {
            "target_version": target_version + 1,
            "E_pi_f": ahead["truth"],
            **{k: float(ahead["bias"][k].mean()) for k in ESTIMATORS},
        },
        "by_policy_change": {
            "eta": list(eta_grid),
            "trajectory_kl": kl_eta,
            **{f"bias_{k}": v for k, v in by_eta.items()},
            "curves_by_kappa": curves,
        },
        "stale_kv": {
            "kv_mix": kv_mix,
            "bias_recorded_logprob": float(kv["bias"]["exact"].mean()),
            "bias_version_label_recomputed": float(kv["bias"]["label"].mean()),
        },
        "top_p": top_p_analysis(model, versions, f, eta, top_p, target_version=target_version),
        "top_p_sweep": sweep,
    }

"""PNG figures of the theory lab (matplotlib, Agg backend). One function per figure."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np

from provrl.theory.bound_check import PAIR_FAMILIES, BoundCheckResult
from provrl.theory.filtering import (
    expected_keep_probability,
    keep_probability,
    prob_above_given_all_fail,
)
from provrl.theory.mm import Trace

COLORS = {fam: plt.get_cmap("tab10")(i) for i, fam in enumerate(PAIR_FAMILIES)}


def _save(fig: Any, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_bound(result: BoundCheckResult, path: Path) -> Path:
    """|J(π') − L_π(π')|/ε against α, one panel per γ, with both bounds (divided by ε):
    4γα²/((1−γ)(1−γ(1−α))) (coupling) and 4γα²/(1−γ)² (Theorem 1); last panel: tightness."""
    gammas = sorted(set(result.gamma.tolist()))
    n = len(gammas) + 1
    cols = min(3, n)
    rows = int(np.ceil(n / cols))
    fig, axes = plt.subplots(rows, cols, figsize=(5 * cols, 4 * rows), squeeze=False)
    flat = axes.ravel()
    a = np.logspace(-5, 0, 200)
    for ax, g in zip(flat, gammas, strict=False):
        sel = (result.gamma == g) & (result.gap_over_eps > 0) & (result.alpha > 0)
        for fam in PAIR_FAMILIES:
            m = sel & (result.family == fam)
            ax.scatter(
                result.alpha[m],
                result.gap_over_eps[m],
                s=5,
                alpha=0.5,
                color=COLORS[fam],
                label=fam,
            )
        ax.plot(
            a, 4 * g * a**2 / ((1 - g) * (1 - g * (1 - a))), "k-", lw=1.5, label="coupling bound"
        )
        ax.plot(a, 4 * g * a**2 / (1 - g) ** 2, "k--", lw=1.0, label="4γα²/(1−γ)²")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlim(1e-5, 1.2)
        lo = result.gap_over_eps[sel].min() if sel.any() else 1e-12
        ax.set_ylim(max(lo / 3, 1e-16), 4 * g / (1 - g) ** 2 * 2)
        ax.set_title(f"γ = {g:g}  ({int(sel.sum())} pairs)")
        ax.set_xlabel("α = max_s D_TV(π, π')")
        ax.set_ylabel("|J(π') − L_π(π')| / ε")
    flat[0].legend(fontsize=7, markerscale=2, loc="lower right")
    ax = flat[len(gammas)]
    bins = np.logspace(-8, 0, 60)
    for fam in PAIR_FAMILIES:
        r = result.ratios["tv_tight"][result.family == fam]
        r = r[np.isfinite(r) & (r > 0)]
        ax.hist(np.clip(r, 1e-8, 1), bins=bins, histtype="step", color=COLORS[fam], label=fam)
    ax.axvline(1.0, color="k", lw=1)
    ax.set_xscale("log")
    ax.set_xlabel("tightness = |J' − L| / coupling bound (clipped at 1e-8)")
    ax.set_ylabel("pairs")
    ax.set_title("tightness by pair family (1 = bound attained)")
    ax.legend(fontsize=7)
    for ax in flat[n:]:
        ax.axis("off")
    return _save(fig, path)


def plot_mm(traces: list[Trace], J_star: float, title: str, path: Path) -> Path:
    """J(π_i) over iterations for Algorithm 1, average-KL TRPO (several δ), policy iteration;
    right: the gap to J* on a log scale."""
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(12, 4.5))
    for i, tr in enumerate(traces):
        style = (
            "-" if tr.method.startswith("TRPO") else ("--" if tr.method.startswith("MM") else ":")
        )
        color = plt.get_cmap("viridis")(i / max(1, len(traces) - 1))
        it = np.arange(len(tr.J))
        ax.plot(it, tr.J, style, color=color, lw=1.8, label=tr.method)
        gap = np.maximum(J_star - np.asarray(tr.J), 1e-16)
        ax2.plot(it, gap, style, color=color, lw=1.8, label=tr.method)
    ax.axhline(J_star, color="k", lw=0.8, label="J*")
    ax.set_xlabel("iteration")
    ax.set_ylabel("J(π)")
    ax.set_title(title)
    ax.legend(fontsize=7)
    ax2.set_yscale("log")
    ax2.set_xlabel("iteration")
    ax2.set_ylabel("J* − J(π)")
    ax2.set_title("gap to the optimum")
    return _save(fig, path)


def plot_mixed(report: dict[str, Any], path: Path) -> Path:
    """Left: bias of each attribution per switch point κ for several η; middle: bias averaged
    over κ against the policy change; right: top-p bias, missing mass, corrections."""
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.5))
    ax = axes[0]
    curves = report["by_policy_change"]["curves_by_kappa"]
    cmap = plt.get_cmap("plasma")
    keys = [k for k in curves if float(k) > 0]
    for i, e in enumerate(keys):
        c = cmap(i / max(1, len(keys)))
        kappa = np.arange(len(curves[e]["latest"]))
        ax.plot(kappa, curves[e]["latest"], "-o", ms=3, color=c, label=f"η = {e}")
        ax.plot(kappa, curves[e]["earliest"], "--s", ms=3, color=c)
    ax.plot([], [], "k-o", ms=3, label="latest (solid)")
    ax.plot([], [], "k--s", ms=3, label="earliest (dashed)")
    kappa = np.arange(len(report["by_switch_point"]["bias_exact"]))
    ax.plot(kappa, report["by_switch_point"]["bias_exact"], "k-", lw=2, label="exact provenance")
    ax.set_yscale("symlog", linthresh=1e-3)
    ax.set_xlabel("switch token κ (t < κ: v_old, t ≥ κ: v_new)")
    ax.set_ylabel("E[estimate] − E_πθ[f]")
    ax.set_title("bias of version attribution per switch point")
    ax.legend(fontsize=6, ncol=2, loc="center left")
    ax = axes[1]
    pc = report["by_policy_change"]
    kl = np.asarray(pc["trajectory_kl"])
    for k, st in (("latest", "-o"), ("earliest", "--s"), ("none", ":^"), ("exact", "k-")):
        ax.plot(kl, pc[f"bias_{k}"], st, ms=4, label=k)
    ax.set_yscale("symlog", linthresh=1e-3)
    ax.set_xlabel("policy change: D_KL(q_new ‖ q_old) per trajectory (nats)")
    ax.set_ylabel("bias, averaged over κ")
    same = np.allclose(pc["bias_latest"], pc["bias_none"], atol=1e-12)
    ax.set_title("bias vs policy change" + (" (π_θ = v_new: latest ≡ none)" if same else ""))
    ax.legend(fontsize=8)
    ax = axes[2]
    sweep = report["top_p_sweep"]
    p = [r["top_p"] for r in sweep]
    ax.plot(p, [r["bias_exact_weights"] for r in sweep], "-o", label="exact weights π/q̃ (bias)")
    ax.plot(p, [-r["missing_mass"] for r in sweep], "k--", label="−M = −Pr_π(τ ∉ supp q̃)")
    ax.plot(p, [r["bias_self_normalised"] for r in sweep], "-s", label="self-normalised (bias)")
    ax.plot(
        p, [r["bias_pre_truncation_weights"] for r in sweep], "-^", label="pre-top-p logprob (bias)"
    )
    ax.axhline(0, color="gray", lw=0.5)
    ax.set_xlabel("top-p of the behaviour sampler")
    ax.set_ylabel("E[estimate] − E_πθ[f]")
    ax.set_title("top-p truncation: bias and the missing π mass")
    ax.legend(fontsize=7)
    return _save(fig, path)


def plot_filtering(ks: list[int], a: float, b: float, path: Path) -> Path:
    """Left: Pr(0 < K < k | p); middle: its expectation under Beta priors of fixed
    concentration against the prior mean; right: Pr(p > 0.05 | K = 0) against k."""
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.5))
    p = np.linspace(0, 1, 401)
    for k in ks:
        axes[0].plot(p, keep_probability(p, k), label=f"k = {k}")
    axes[0].set_xlabel("pass rate p")
    axes[0].set_ylabel("Pr(0 < K < k | p)")
    axes[0].set_title("probability a task is kept")
    axes[0].legend()
    mean = np.linspace(0.01, 0.99, 99)
    for i, k in enumerate(ks):
        color = plt.get_cmap("tab10")(i)
        for conc, st in ((2.0, "-"), (20.0, "--")):
            axes[1].plot(
                mean,
                expected_keep_probability(mean * conc, (1 - mean) * conc, k),
                st,
                color=color,
                label=f"k = {k}, a+b = {conc:g}",
            )
    axes[1].set_xlabel("prior mean pass rate a/(a+b)")
    axes[1].set_ylabel("E_Beta(a,b) Pr(0 < K < k)")
    axes[1].set_title("expected retention under a Beta prior")
    axes[1].legend(fontsize=7)
    kk = np.arange(1, 33)
    for aa, bb in ((a, b), (0.5, 2.0), (0.2, 2.0)):
        axes[2].plot(kk, prob_above_given_all_fail(aa, bb, kk, 0.05), label=f"Beta({aa:g}, {bb:g})")
    axes[2].set_xlabel("probes k, all failed")
    axes[2].set_ylabel("Pr(p > 0.05 | K = 0)")
    axes[2].set_title("k failures do not prove unlearnability")
    axes[2].legend()
    return _save(fig, path)

"""The point of exact provenance, tested statistically on a tabular sequence model.

A categorical autoregressive policy over K tokens and T steps: the logits of step t depend
on (t, previous token), so E_π[f] and ∇_θ E_π[f] are exact sums over the K^T sequences.
Trajectories are sampled by a *mix of behaviour versions that switches mid-sequence* (a
hot-load happened while the request was running). Then:

* the IS estimate with the recorded per-token behaviour logprobs (log q_{v_t}) converges to
  the exact value — for the objective and for the policy gradient through the loss code;
* pretending the latest version sampled every token is measurably biased;
* top-p truncation makes even the exact weights biased, by exactly the π-mass outside the
  behaviour support, and the support diagnostic sees it.

All with fixed seeds; tolerances are multiples of the Monte-Carlo standard error.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch

from provrl.objectives.config import ObjectiveConfig
from provrl.objectives.corrections import sequence_log_weight
from provrl.objectives.diagnostics import support_excluded_mass, trajectory_ess
from provrl.objectives.losses import loss_token_weights, policy_loss

K, T, START = 3, 3, 3  # tokens, steps, "previous token" index of step 0
N = 40_000


def table(seed: int, scale: float = 1.0) -> torch.Tensor:
    """Logits [T, K+1, K]: row (t, prev) is the distribution of token t after token prev."""
    g = torch.Generator().manual_seed(seed)
    return scale * torch.randn(T, K + 1, K, generator=g, dtype=torch.float64)


def f(seqs: torch.Tensor) -> torch.Tensor:
    """A non-trivial function of the whole sequence."""
    return (seqs == 2).sum(-1).double() + 2.0 * (seqs[:, 0] == seqs[:, -1]).double()


def states(seqs: torch.Tensor) -> torch.Tensor:
    """Previous token of each step (START at t = 0): [N, T]."""
    return torch.cat([torch.full((seqs.shape[0], 1), START), seqs[:, :-1]], dim=1)


def seq_logprobs(logits: torch.Tensor, seqs: torch.Tensor, top_p: float = 1.0) -> torch.Tensor:
    """log p(a_t | h_t) [N, T] under ``logits`` (optionally top-p truncated, renormalised)."""
    rows = logits[torch.arange(T), states(seqs)]  # [N, T, K]
    logp = truncate(rows, top_p)
    return logp.gather(-1, seqs[..., None]).squeeze(-1)


def truncate(logits: torch.Tensor, top_p: float) -> torch.Tensor:
    """log-softmax of the top-p sampling distribution (−inf outside the kept set)."""
    p = torch.softmax(logits, -1)
    ps, idx = torch.sort(p, -1, descending=True)
    keep_sorted = (torch.cumsum(ps, -1) - ps) < top_p
    keep = torch.zeros_like(keep_sorted).scatter(-1, idx, keep_sorted)
    return torch.log_softmax(logits.masked_fill(~keep, -torch.inf), -1)


def sample(logits_per_step: list[torch.Tensor], n: int, seed: int, top_p: float = 1.0):
    """Ancestral sampling; step t of trajectory i uses ``logits_per_step[t][i]`` ([N, K+1, K]
    tables, one per trajectory, so versions can differ per trajectory and per step)."""
    g = torch.Generator().manual_seed(seed)
    seqs = torch.zeros(n, T, dtype=torch.long)
    logq = torch.zeros(n, T, dtype=torch.float64)
    prev = torch.full((n,), START)
    for t in range(T):
        lq = truncate(logits_per_step[t][torch.arange(n), prev], top_p)
        a = torch.multinomial(lq.exp(), 1, generator=g).squeeze(-1)
        seqs[:, t], logq[:, t], prev = a, lq.gather(-1, a[:, None]).squeeze(-1), a
    return seqs, logq


def all_sequences() -> torch.Tensor:
    return torch.tensor(list(itertools.product(range(K), repeat=T)))


def exact_expectation(logits: torch.Tensor, g: torch.Tensor | None = None) -> torch.Tensor:
    seqs = all_sequences()
    p = seq_logprobs(logits, seqs).sum(-1).exp()
    return (p * (f(seqs) if g is None else g)).sum()


@pytest.fixture(scope="module")
def mixed_batch():
    """π_θ and three behaviour versions; each trajectory switches from an old version
    (v0 or v1, at random) to the latest v2 at a random step s ∈ {0, …, T}."""
    theta = table(0)
    versions = torch.stack([theta + table(s, 0.8) for s in (1, 2, 3)])  # v0, v1, v2
    g = torch.Generator().manual_seed(10)
    old = torch.randint(0, 2, (N,), generator=g)
    switch = torch.randint(0, T + 1, (N,), generator=g)
    v = torch.where(torch.arange(T)[None, :] < switch[:, None], old[:, None], 2)  # [N, T]
    seqs, logq = sample([versions[v[:, t]][:, t] for t in range(T)], N, seed=11)
    assert (v[:, 0] != v[:, -1]).any(), "some trajectories must switch version mid-sequence"
    logq_latest = seq_logprobs(versions[2], seqs)
    return theta, seqs, logq, logq_latest


def test_exact_provenance_is_unbiased_and_latest_version_is_biased(mixed_batch):
    theta, seqs, logq, logq_latest = mixed_batch
    truth = float(exact_expectation(theta))
    mask = torch.ones(N, T, dtype=torch.bool)
    logp = seq_logprobs(theta, seqs)
    vals = f(seqs)
    for name, lq, biased in (("exact", logq, False), ("latest", logq_latest, True)):
        x = sequence_log_weight(logp, lq, mask).exp() * vals
        est, se = float(x.mean()), float(x.std()) / math.sqrt(N)
        z = abs(est - truth) / se
        if biased:
            assert z > 8, f"{name}: estimate {est:.4f} vs truth {truth:.4f} not biased (z={z:.1f})"
        else:
            assert z < 4, f"{name}: estimate {est:.4f} vs truth {truth:.4f} (z={z:.1f})"
    # ignoring the behaviour record entirely (on-policy assumption) is biased too
    on_pol = float(vals.mean())
    assert abs(on_pol - truth) / (float(vals.std()) / math.sqrt(N)) > 8


def test_policy_gradient_through_the_loss_is_unbiased_only_with_exact_provenance(mixed_batch):
    theta0, seqs, logq, logq_latest = mixed_batch
    # exact ∇_θ E_π[f] by enumeration
    th = theta0.clone().requires_grad_(True)
    exact_expectation(th).backward()
    assert th.grad is not None
    exact_grad = th.grad.clone()

    # per-sample score function ∇ log π(τ) = Σ_t (onehot(a_t) − π(·|s_t)) at row (t, s_t)
    pi_rows = torch.softmax(theta0[torch.arange(T), states(seqs)], -1)  # [N, T, K]
    score = torch.zeros(N, T, K + 1, K, dtype=torch.float64)
    idx_t = torch.arange(T).expand(N, T)
    score[torch.arange(N)[:, None], idx_t, states(seqs)] = (
        torch.nn.functional.one_hot(seqs, K).double() - pi_rows
    )

    mask = torch.ones(N, T + 1, dtype=torch.bool)
    mask[:, 0] = False  # a prompt token in front, as in a real batch
    cfg = ObjectiveConfig(
        correction="seq_tis",
        is_cap=None,
        clip_eps_low=None,
        clip_eps_high=None,
        aggregation="seq_sum_norm",
        norm_tokens=T,
    )
    pad = torch.zeros(N, 1, dtype=torch.float64)
    adv = f(seqs)[:, None].expand(N, T + 1) * mask
    for lq, biased in ((logq, False), (logq_latest, True)):
        th = theta0.clone().requires_grad_(True)
        logp = torch.cat([pad, seq_logprobs(th, seqs)], 1)
        logq_full = torch.cat([pad, lq], 1)
        out = policy_loss(
            logp,
            logp.detach(),  # π_prox = π_θ: first step of the update
            logq_full,
            adv,
            mask,
            loss_token_weights(mask, "seq_sum_norm", norm_tokens=T),
            cfg,
        )
        out.loss.backward()
        assert th.grad is not None
        est = -T * th.grad  # the loss is −(1/(N T)) Σ_i w_i f_i Σ_t log π
        w = sequence_log_weight(logp.detach(), logq_full, mask).exp()
        per_sample = (w * f(seqs))[:, None, None, None] * score
        torch.testing.assert_close(est, per_sample.mean(0))  # loss path = textbook formula
        se = per_sample.std(0) / math.sqrt(N)
        reachable = se > 0
        z = ((est - exact_grad).abs() / se)[reachable]
        if biased:
            assert float(z.max()) > 8, f"latest-version gradient not biased: max z {z.max():.1f}"
        else:
            assert float(z.max()) < 4.5, f"exact-provenance gradient biased: max z {z.max():.1f}"


def test_top_p_truncation_bias_is_what_the_support_diagnostic_measures():
    theta = table(5, scale=1.5)
    ones = [theta[t].expand(N, K + 1, K) for t in range(T)]
    mask = torch.ones(N, T, dtype=torch.bool)
    seqs_all = all_sequences()
    p_all = seq_logprobs(theta, seqs_all).sum(-1).exp()
    for top_p in (1.0, 0.7):
        seqs, logq = sample(ones, N, seed=21, top_p=top_p)
        logp = seq_logprobs(theta, seqs)
        w = sequence_log_weight(logp, logq, mask).exp()
        # the support diagnostic on the states the batch visited (π_θ logits, sampler params)
        visited = theta[torch.arange(T), states(seqs)]  # [N, T, K]
        excluded = support_excluded_mass(visited, top_p=top_p)
        # exact: E_q[w f] = E_π[f · 1{every token inside the top-p support}]
        inside = (seq_logprobs(theta, seqs_all, top_p=top_p) > -torch.inf).all(-1)
        truth = float((p_all * f(seqs_all)).sum())
        truth_inside = float((p_all * f(seqs_all) * inside).sum())
        x = w * f(seqs)
        est, se = float(x.mean()), float(x.std()) / math.sqrt(N)
        assert abs(est - truth_inside) < 4 * se
        if top_p == 1.0:
            assert float(excluded.max()) == 0.0
            assert abs(est - truth) < 4 * se
        else:
            assert float(excluded.mean()) > 0.05
            assert abs(est - truth) > 8 * se, "top-p bias not detectable"
            # step 0 has a single state: E_q[w_0] = 1 − excluded mass there, exactly
            w0 = (logp[:, 0] - logq[:, 0]).exp()
            assert float(w0.mean()) == pytest.approx(1 - float(excluded[0, 0]), abs=1e-9)
            # the ESS diagnostic stays blind to it: weights are all ≤ 1 and similar
            assert trajectory_ess(logp, logq, mask)["ess_frac"] > 0.5


def test_sampler_matches_the_tables():
    """Guard for the test itself: the recorded logq is the sampling distribution."""
    theta = table(0)
    seqs, logq = sample([theta[t].expand(N, K + 1, K) for t in range(T)], N, seed=1)
    np.testing.assert_allclose(logq.numpy(), seq_logprobs(theta, seqs).numpy(), atol=1e-12)

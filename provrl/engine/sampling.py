r"""Sampling with the exact behaviour log-probability of every sampled token.

For one row of logits :math:`\ell \in \mathbb{R}^V` and parameters (τ, k, p)::

    z        = ℓ / τ                                   temperature
    π_τ(i)   = exp(z_i − logsumexp z)                  the tempered model distribution
    S_k      = the k largest z_i  (all V when k = 0)   top-k
    π_k(i)   = π_τ(i) / Σ_{j∈S_k} π_τ(j),  i ∈ S_k      renormalised within S_k
    S        = {i ∈ S_k : Σ_{j∈S_k, π(j) > π(i)} π_k(j) < p}
                                                       top-p: the smallest prefix of S_k,
                                                       sorted by π descending, whose π_k
                                                       mass reaches p
    m        = Σ_{i∈S} π_τ(i)                          kept_mass (1 when nothing is cut)
    q(i)     = π_τ(i) / m  for i ∈ S, 0 otherwise      the distribution actually sampled
    log q(a) = log π_τ(a) − log m                      the recorded ``logprob``

Greedy (τ = 0): a = argmax ℓ, q is the point mass on a, so log q(a) = 0; the recorded
kept_mass is m = softmax(ℓ)_a, the model mass of the one-token support.

Sampling is by inversion with one uniform u ∈ [0, 1) per row (from the request's own
seeded generator): a = the first index whose cumulative q exceeds u (:func:`inverse_cdf`,
sums in float64). Rows are processed together (no Python loop over the vocabulary); top-p
looks only at the ``topk`` head of the distribution and widens it until the nucleus fits,
so it never sorts the whole vocabulary unless the nucleus really is that wide.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class Sampled:
    """One sampled token per row and its provenance numbers."""

    token: torch.Tensor  # [R] int64
    logprob: torch.Tensor  # [R] float32, log q(a)
    kept_mass: torch.Tensor  # [R] float32, m


@dataclass
class KeptSet:
    """The truncated support S of each row, as its head sorted by π descending."""

    idx: torch.Tensor  # [R, n] int64 token ids, sorted by z descending
    probs: torch.Tensor  # [R, n] float64 π_τ of those ids
    keep: torch.Tensor  # [R, n] bool, membership in S
    log_z: torch.Tensor  # [R] float64 logsumexp(z)

    @property
    def kept_mass(self) -> torch.Tensor:
        """m = Σ_{i∈S} π_τ(i), float64 [R]."""
        return (self.probs * self.keep).sum(-1)


def row_kinds(
    temperature: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor, vocab_size: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(greedy, truncated, plain) boolean masks [R]: τ = 0; τ > 0 and (k, p) cut something
    (k ∈ (0, V) or p < 1); τ > 0 and nothing is cut (q = π_τ)."""
    greedy = temperature <= 0
    truncated = ~greedy & (((top_k > 0) & (top_k < vocab_size)) | (top_p < 1.0))
    return greedy, truncated, ~greedy & ~truncated


def kept_set(z: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor) -> KeptSet:
    """S for each row of tempered logits ``z`` [R, V] (see the module docstring).

    Looks at the ``n`` largest entries, n = 64 → 512 → 4096 → V, until every row's kept set
    is decided: a top-k row needs n ≥ k; a row with k = 0 needs Σ_{head} π ≥ p."""
    R, V = z.shape
    z = z.float()
    log_z = torch.logsumexp(z.double(), -1)
    k_eff = torch.where(top_k > 0, top_k.clamp(max=V), torch.full_like(top_k, V))
    p = top_p.double()
    n = min(V, max(64, int(k_eff[top_k > 0].max()) if bool((top_k > 0).any()) else 64))
    rows = torch.arange(R)
    out_idx: list[torch.Tensor | None] = [None] * R
    out_probs: list[torch.Tensor | None] = [None] * R
    out_keep: list[torch.Tensor | None] = [None] * R
    while rows.numel():
        vals, idx = torch.topk(z[rows], n, dim=-1, sorted=True)
        probs = torch.exp(vals.double() - log_z[rows, None])
        k_r, p_r = k_eff[rows], p[rows]
        in_k = torch.arange(n)[None, :] < k_r[:, None]
        probs_k = probs * in_k
        k_known = k_r <= n  # the whole of S_k is in the head
        mass_k = torch.where(k_known, probs_k.sum(-1), torch.ones_like(p_r))
        cum = probs_k.cumsum(-1) / mass_k[:, None]
        before = cum - probs_k / mass_k[:, None]
        keep = in_k & ((p_r[:, None] >= 1.0) | (before < p_r[:, None]))
        # with k = 0, S_k is the whole vocabulary (mass 1); the head decides S once it
        # holds mass ≥ p. A top-k row is decided once all of S_k is in the head.
        nucleus_fits = (p_r < 1.0) & (k_r >= V) & (cum[:, -1] >= p_r)
        done = k_known | nucleus_fits | (n >= V)
        for j in torch.nonzero(done).flatten().tolist():
            r = int(rows[j])
            out_idx[r], out_probs[r], out_keep[r] = idx[j], probs[j], keep[j]
        rows = rows[~done]
        n = min(V, n * 8)
    width = max(int(t.numel()) for t in out_idx if t is not None)

    def pad(ts: list[torch.Tensor | None], fill: float | int | bool) -> torch.Tensor:
        full = [t for t in ts if t is not None]
        return torch.stack(
            [torch.nn.functional.pad(t, (0, width - t.numel()), value=fill) for t in full]
        )

    return KeptSet(pad(out_idx, 0), pad(out_probs, 0.0), pad(out_keep, False), log_z)


def inverse_cdf(
    weights: torch.Tensor, u: torch.Tensor, block: int = 1024
) -> tuple[torch.Tensor, torch.Tensor]:
    """a = min{i : F(i) > u·F(V−1)} with F(i) = Σ_{j≤i} w_j, for each row of ``weights``
    [R, V] (≥ 0, unnormalised); returns (a [R], F(V−1) [R] float64).

    Two levels: the row is cut into blocks of ``block`` entries; the block of a is found
    from the cumulative block sums (each block summed in fp32 — pairwise, relative error
    ~1e-7 — and accumulated in float64), then a inside that one block (float64). A full
    float64 cumsum over the vocabulary, or any [R, V] float64 temporary, costs ~10× more
    on CPU."""
    R, V = weights.shape
    nb = -(-V // block)
    if nb * block != V:
        weights = torch.nn.functional.pad(weights, (0, nb * block - V))
    w = weights.view(R, nb, block)
    block_cdf = w.sum(-1).double().cumsum(-1)  # [R, nb]
    total = block_cdf[:, -1]
    x = u.double() * total
    b = torch.searchsorted(block_cdf, x[:, None], right=True).squeeze(-1).clamp(max=nb - 1)
    before = torch.where(b > 0, block_cdf.gather(-1, (b - 1).clamp(min=0)[:, None])[:, 0], 0.0)
    inner = w[torch.arange(R), b].cumsum(-1, dtype=torch.float64)  # [R, block]
    # rounding can put x − before at/after the block's own total: stay inside the block
    rest = torch.minimum(x - before, torch.nextafter(inner[:, -1], torch.zeros_like(total)))
    j = torch.searchsorted(inner, rest[:, None], right=True).squeeze(-1).clamp(max=block - 1)
    return (b * block + j).clamp(max=V - 1), total


def sample(
    logits: torch.Tensor,
    temperature: torch.Tensor,
    top_k: torch.Tensor,
    top_p: torch.Tensor,
    u: torch.Tensor,
) -> Sampled:
    """Sample one token per row of ``logits`` [R, V] and return log q(a) and m.

    ``temperature`` [R] float (0 = greedy), ``top_k`` [R] int (0 = off), ``top_p`` [R] float
    (1 = off), ``u`` [R] float64 uniforms in [0, 1)."""
    R, V = logits.shape
    logits = logits.float()
    token = torch.zeros(R, dtype=torch.int64)
    logprob = torch.zeros(R, dtype=torch.float64)
    kept = torch.ones(R, dtype=torch.float64)
    u = u.double().clamp(0.0, 1.0 - 1e-12)

    greedy, truncated, plain = row_kinds(temperature, top_k, top_p, V)

    if bool(greedy.any()):
        g = torch.nonzero(greedy).flatten()
        lg = logits[g]
        a = lg.argmax(-1)
        token[g] = a
        lp_a = lg.gather(-1, a[:, None]).squeeze(-1) - torch.logsumexp(lg, -1)
        kept[g] = lp_a.double().exp()  # log q(a) = 0: q is the point mass on a

    if bool(plain.any()):
        # q = π_τ. Inversion over the unsorted vocabulary: a = min{i : F(i) > u·F(V-1)}.
        r = torch.nonzero(plain).flatten()
        z = logits if r.numel() == R else logits[r]
        t = temperature[r]
        if bool((t != 1.0).any()):
            z = z / t[:, None].float()
        z_max = z.amax(-1, keepdim=True)
        a, total = inverse_cdf(torch.sub(z, z_max).exp_(), u[r])  # weights e^{z_i − max}
        token[r] = a
        # log π_τ(a) = z_a − max − log Σ_j e^{z_j − max}
        z_a = z.gather(-1, a[:, None]).squeeze(-1) - z_max.squeeze(-1)
        logprob[r] = z_a.double() - torch.log(total)

    if bool(truncated.any()):
        r = torch.nonzero(truncated).flatten()
        z = logits[r] / temperature[r, None].float()
        ks = kept_set(z, top_k[r], top_p[r])
        q = ks.probs * ks.keep
        m = q.sum(-1)
        cdf = q.cumsum(-1)
        j = torch.searchsorted(cdf, (u[r] * cdf[:, -1])[:, None], right=True).clamp(
            max=q.shape[1] - 1
        )
        token[r] = ks.idx.gather(-1, j).squeeze(-1)
        log_pi = torch.log(ks.probs.gather(-1, j).squeeze(-1))
        logprob[r] = log_pi - torch.log(m)
        kept[r] = m

    return Sampled(token, logprob.float(), kept.float())


def behaviour_logprob(
    logits: torch.Tensor,
    tokens: torch.Tensor,
    temperature: torch.Tensor,
    top_k: torch.Tensor,
    top_p: torch.Tensor,
) -> Sampled:
    """log q(a) and m for given tokens (no sampling): what :func:`sample` would record had
    it drawn ``tokens`` from these logits. A token outside S gets log q = −inf; for greedy
    rows log q = 0 if the token is the argmax, else −inf. Used by the KV-staleness audit.
    Rows are processed together, split like :func:`sample` (:func:`row_kinds`)."""
    R, V = logits.shape
    logits = logits.float()
    a = tokens.long()
    logprob = torch.zeros(R, dtype=torch.float64)
    kept = torch.ones(R, dtype=torch.float64)
    greedy, truncated, plain = row_kinds(temperature, top_k, top_p, V)

    if bool(greedy.any()):
        g = torch.nonzero(greedy).flatten()
        lg = logits[g].double()
        b = lg.argmax(-1)
        kept[g] = (lg.gather(-1, b[:, None]).squeeze(-1) - torch.logsumexp(lg, -1)).exp()
        logprob[g] = torch.where(b == a[g], 0.0, float("-inf")).double()

    if bool(plain.any()):
        r = torch.nonzero(plain).flatten()
        z = logits[r] / temperature[r, None].float()
        # log q(a) = log π_τ(a) = z_a − logsumexp z; m = 1
        logprob[r] = z.gather(-1, a[r, None]).squeeze(-1).double() - torch.logsumexp(z.double(), -1)

    if bool(truncated.any()):
        r = torch.nonzero(truncated).flatten()
        z = logits[r] / temperature[r, None].float()
        ks = kept_set(z, top_k[r], top_p[r])
        m = ks.kept_mass
        kept[r] = m
        in_s = ((ks.idx == a[r, None]) & ks.keep).any(-1)
        log_pi = z.gather(-1, a[r, None]).squeeze(-1).double() - ks.log_z
        logprob[r] = torch.where(in_s, log_pi - torch.log(m), float("-inf"))

    return Sampled(tokens.clone(), logprob.float(), kept.float())

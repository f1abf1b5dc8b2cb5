"""The reference law: what the trainer computes, to check what the engine reports against.

A :class:`Reference` is a private copy of the HF model in float32 (the trainer's view of
π_θ), loaded with each version the conformance run publishes. For a sequence of ids and
sampling parameters it recomputes, by one teacher-forced forward, what the engine should
have recorded for every sampled token: log q(a_t | h_t) after temperature, top-k and top-p,
and the kept mass m_t (:func:`provrl.engine.sampling.behaviour_logprob`, the sampler's own
definition of q).
"""

from __future__ import annotations

import copy
import inspect
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from provrl.engine.sampling import Sampled, behaviour_logprob
from provrl.models.loading import LoadedModel
from provrl.provenance import SamplingParams

BLOCK = 64
"""Rows recomputed together."""


class Reference:
    """A float32 copy of ``lm``'s model whose weights follow the published versions."""

    def __init__(self, lm: LoadedModel) -> None:
        self.model: Any = copy.deepcopy(lm.model).float().eval()
        self.tied = bool(getattr(lm.model.config, "tie_word_embeddings", False))

    def load(self, state_dict: Mapping[str, torch.Tensor]) -> None:
        """Hold the weights of a newly published version."""
        self.model.load_state_dict(dict(state_dict), strict=False)

    @torch.no_grad()
    def logits(self, ids: Sequence[int], rows: Sequence[int] | None = None) -> torch.Tensor:
        """Float32 logits [T, V] of a teacher-forced forward over ``ids``; row t predicts
        ids[t + 1]. With ``rows``, only those rows [len(rows), V] (the LM head runs on them
        alone: HF ``logits_to_keep`` with indices; the decoder still runs on every token)."""
        x = torch.tensor([list(ids)], device=self.model.device)
        if rows is None:
            return self.model(input_ids=x).logits[0].float().cpu()
        keep = torch.as_tensor(list(rows), dtype=torch.long, device=self.model.device)
        return self.model(input_ids=x, logits_to_keep=keep).logits[0].float().cpu()

    @torch.no_grad()
    def logits_across(
        self, ids: Sequence[int], cached: int, new: Mapping[str, torch.Tensor]
    ) -> torch.Tensor:
        """Float32 logits [T, V] of ``ids`` across a keep-mode swap: the keys and values of
        positions < ``cached`` computed under the weights held now and kept, the positions
        from ``cached`` on fed under ``new`` (loaded here, and held after) and attending to
        that stale cache. Row t predicts ids[t + 1]."""
        if not 0 < cached < len(ids):
            raise ValueError(f"logits_across: cached = {cached} not in (0, {len(ids)})")
        x = torch.tensor([list(ids)], device=self.model.device)
        # transformers renamed past_key_values to cache (5.2x): pass it under this one's name
        name = "cache" if "cache" in inspect.signature(self.model.forward).parameters else "past_key_values"  # fmt: skip
        before = self.model(input_ids=x[:, :cached], use_cache=True)
        self.load(new)
        after = self.model(input_ids=x[:, cached:], use_cache=True, **{name: before[name]})
        return torch.cat([before.logits[0], after.logits[0]]).float().cpu()

    def behaviour(
        self, rows: torch.Tensor, tokens: Sequence[int], params: SamplingParams
    ) -> Sampled:
        """log q(a) and kept mass m of ``tokens`` under logits ``rows`` [R, V] and ``params``
        (in blocks of ``BLOCK`` rows: a wide nucleus sorts whole rows)."""
        empty = torch.zeros(0)
        parts = [Sampled(empty.long(), empty, empty)]
        for i in range(0, len(tokens), BLOCK):
            tok = torch.tensor(list(tokens[i : i + BLOCK]), dtype=torch.int64)
            R = tok.numel()
            parts.append(
                behaviour_logprob(
                    rows[i : i + R],
                    tok,
                    torch.full((R,), params.temperature),
                    torch.full((R,), params.top_k, dtype=torch.int64),
                    torch.full((R,), params.top_p, dtype=torch.float64),
                )
            )
        return Sampled(
            torch.cat([p.token for p in parts]),
            torch.cat([p.logprob for p in parts]),
            torch.cat([p.kept_mass for p in parts]),
        )

    @staticmethod
    def boundary_margin(row: torch.Tensor, token: int, params: SamplingParams) -> float:
        """How far outside the recomputed support S the ``token`` lies, for logits ``row``
        [V]: with π = softmax(ℓ/τ) and S_k the top-k set (all V when k = 0),
        log π_(k) − log π(a) when a ∉ S_k, else Σ_{j∈S_k, π(j) > π(a)} π(j)/Σ_{S_k} π − p
        (the renormalised mass before a, past the nucleus cut p). ≤ 0 inside S. When every
        log π moves by at most ε (another dtype), S moves by a margin of about ε."""
        logp = torch.log_softmax(row.double() / params.temperature, -1)
        V = logp.numel()
        k = params.top_k if 0 < params.top_k < V else V
        top = torch.topk(logp, k).values
        if float(logp[token]) < float(top[-1]):
            return float(top[-1] - logp[token])
        in_k = torch.exp(top - torch.logsumexp(top, 0))
        before = float(in_k[top > logp[token]].sum())
        return before - params.top_p if params.top_p < 1.0 else 0.0

    def turn(self, ids: Sequence[int], start: int, params: SamplingParams) -> Sampled:
        """The recompute of the sampled tokens ``ids[start:]`` given ``ids[:start]``."""
        return self.behaviour(self.turn_logits(ids, start), ids[start:], params)

    def turn_logits(self, ids: Sequence[int], start: int) -> torch.Tensor:
        """The logits rows [len(ids) − start, V] that predict ``ids[start:]``."""
        return self.logits(ids[:-1])[start - 1 :]

    def distance(
        self,
        recorded: np.ndarray,
        rows: torch.Tensor,
        tokens: Sequence[int],
        params: SamplingParams,
        tol: float,
    ) -> tuple[np.ndarray, int]:
        """(|recorded log q [n] − log q_ref| per token [n], boundary misses): q_ref the law of
        ``rows`` [n, V] under ``params``. A token outside the recomputed support by at most
        ``tol`` (:meth:`boundary_margin`: a near-tie at the cut that another dtype rounds
        the other way) counts as a boundary miss at distance 0; farther out, ∞."""
        ref = self.behaviour(rows, tokens, params).logprob.double().numpy()
        d = np.abs(np.asarray(recorded, np.float64) - ref)
        d[np.isnan(d)] = np.inf
        misses = 0
        for t in np.flatnonzero(~np.isfinite(ref)).tolist():
            if self.boundary_margin(rows[t], int(tokens[t]), params) <= tol:
                d[t], misses = 0.0, misses + 1
        return d, misses


def new_version(lm: LoadedModel, version: int, scale: float, seed: int) -> dict[str, torch.Tensor]:
    """The weights published as ``version``: lm's weights + scale·std·N(0, 1) on every
    tensor, seeded by (seed, version) (a tied lm_head is the embedding, left out)."""
    g = torch.Generator().manual_seed(seed * 1_000_003 + version)
    tied = bool(getattr(lm.model.config, "tie_word_embeddings", False))
    out = {}
    for k, v in lm.model.state_dict().items():
        if tied and k == "lm_head.weight":
            continue
        w = v.detach().float().cpu()
        out[k] = (w + scale * w.std() * torch.randn(w.shape, generator=g)).to(v.dtype)
    return out

"""The attribution table's recompute: each way peers obtain the behaviour log-probability.

For rollouts with exact provenance (recorded log q_{v_t}, versions per token) and the
weights of every version they name, :func:`recompute` builds, by teacher-forced float32
forwards (:class:`~provrl.conformance.reference.Reference`, the sampler's own law after
temperature, top-k, top-p), the ``[B, T]`` behaviour log-probabilities of

==============  ==========================================================================
``exact``       the recorded q_{v_t}(a_t|h_t) (what provrl trains with)
``v_start``     π_{v_start}: the whole rollout recomputed under the version of its first
                action token (one version label per rollout)
``v_token``     π_{v_t}: each token recomputed under its own version on a fresh KV (per-token
                version labels, without the stale KV a keep-mode hot-load leaves)
``on_policy``   log π_θ itself (no correction)
==============  ==========================================================================

and the target log π_θ(a_t|h_t) at the sampling temperature, untruncated, under
``target_version``. :func:`table` turns them into the rows of
:func:`provrl.objectives.attribution.attribution_row`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from tqdm import tqdm

from provrl.conformance.reference import Reference
from provrl.models.loading import LoadedModel
from provrl.objectives.attribution import attribution_row
from provrl.provenance import SamplingParams, Trajectory

METHODS = ("exact", "v_start", "v_token", "on_policy")


@dataclass
class Rollout:
    """The provenance the table needs of one rollout (all arrays one entry per token)."""

    token_id: np.ndarray  # int
    is_action: np.ndarray  # bool
    version: np.ndarray  # int, −1 on non-actions
    logprob: np.ndarray  # float, recorded log q on actions
    params: SamplingParams

    @classmethod
    def from_trajectory(cls, t: Trajectory) -> Rollout:
        return cls(t.token_id, t.is_action, t.version, t.logprob, t.sampling)


@dataclass
class Recomputed:
    """``[B, T]`` float64 tensors: the target, and each method's behaviour log-probs."""

    logp: torch.Tensor
    mask: torch.Tensor  # bool, action tokens
    logb: dict[str, torch.Tensor]


def recompute(
    rollouts: Sequence[Rollout],
    lm: LoadedModel,
    weights_of: Callable[[int], Mapping[str, torch.Tensor]],
    target_version: int | Sequence[int],
    progress: bool = False,
) -> Recomputed:
    """Every method's behaviour log-probs and the target's (module docstring). Loads each
    needed version once (``weights_of(v)``: its state dict) and does one forward per
    rollout per version it needs. ``target_version``: π_θ's version, one for all rollouts
    or one per rollout (e.g. the learner's version when the rollout was trained: π_prox).
    ``progress``: a bar over the forwards (with ETA)."""
    B = len(rollouts)
    targets = [target_version] * B if isinstance(target_version, int) else list(target_version)
    if len(targets) != B:
        raise ValueError(f"recompute: {len(targets)} target versions for {B} rollouts")
    T = max(len(r.token_id) for r in rollouts)
    mask = torch.zeros(B, T, dtype=torch.bool)
    logp = torch.zeros(B, T, dtype=torch.float64)
    logb = {m: torch.zeros(B, T, dtype=torch.float64) for m in METHODS}
    acts, starts = [], []
    for i, r in enumerate(rollouts):
        a = np.flatnonzero(r.is_action)
        if a.size and a[0] == 0:
            raise ValueError(f"rollout {i}: token 0 is an action but has no context")
        acts.append(a)
        starts.append(int(r.version[a[0]]) if a.size else -1)
        mask[i, torch.as_tensor(a, dtype=torch.long)] = True
        logb["exact"][i, torch.as_tensor(a, dtype=torch.long)] = torch.as_tensor(
            r.logprob[a], dtype=torch.float64
        )
    # the versions each rollout is forwarded under: its tokens', its start's and its target's
    need = [{*map(int, r.version[a]), starts[i], int(targets[i])} if a.size else set()
            for i, (r, a) in enumerate(zip(rollouts, acts, strict=True))]  # fmt: skip
    needs = {v: [i for i in range(B) if v in need[i]] for v in sorted(set().union(*need))}
    ref = Reference(lm)
    bar = tqdm(total=sum(map(len, needs.values())), desc="attribution forwards", disable=not progress)  # fmt: skip
    for v, rows_of_v in needs.items():
        ref.load(weights_of(v))
        for i in rows_of_v:
            r, a = rollouts[i], acts[i]
            mine = a[r.version[a] == v]
            bar.update()
            # row t−1 predicts token t: the LM head runs on the action rows only
            rows = ref.logits(r.token_id[:-1].tolist(), rows=(a - 1).tolist())
            tok = r.token_id[a].tolist()
            law = ref.behaviour(rows, tok, r.params).logprob.double()
            if starts[i] == v:
                logb["v_start"][i, a] = law
            if mine.size:
                logb["v_token"][i, torch.as_tensor(mine)] = law[torch.as_tensor(np.isin(a, mine))]
            if v == targets[i]:
                plain = SamplingParams(temperature=r.params.temperature or 1.0)
                logp[i, a] = ref.behaviour(rows, tok, plain).logprob.double()
    bar.close()
    logb["on_policy"] = logp.clone()
    return Recomputed(logp, mask, logb)


def table(rec: Recomputed, cap: float = 2.0) -> dict[str, dict[str, Any]]:
    """method → its row of the attribution table, against the exact recorded q."""
    q = rec.logb["exact"]
    return {m: attribution_row(rec.logp, q, rec.logb[m], rec.mask, cap) for m in METHODS}

r"""The mid-turn half of the ``stamps`` check: a hot-load that lands while a turn decodes.

One request per hot-load mode m samples a turn of T = ``turn_tokens`` tokens under version
v; right after its N-th token (N = ``swap_after``, counted on the engine's ``on_token``
stream) the run publishes v+1 in mode m. With s the split (the first token sampled under
v+1) and c = |prompt| + s − 1 the KV positions cached at the swap (token s−1 is fed, under
v+1, by the step after it), the scheduler's record must read, token by token t:

=========  ===================  ===================  =========  ==========================================
mode       version_t            kv_min_t             kv_max_t   log q_t equals the recompute
=========  ===================  ===================  =========  ==========================================
keep       v (t < s), v+1       v                    version_t  t < s: fresh under v; t ≥ s: *stale* —
                                                                positions < c under v, the rest under v+1
recompute  v (t < s), v+1       v (t < s), v+1       version_t  t < s: fresh under v; t ≥ s: fresh under v+1
drain      v (s = T)            v                    v          fresh under v; the swap v → v+1 after the turn
=========  ===================  ===================  =========  ==========================================

each |log q_t − log q_ref| ≤ ε (the dtype's ``logprob_tol``), with q_ref the
:class:`~provrl.conformance.reference.Reference`'s teacher-forced recompute (a token just
past q_ref's top-k / top-p cut, by ≤ ε, is a boundary miss, as in ``teacher``). An engine with
``load_weights_async`` (:class:`~provrl.engine.LocalEngine`), called from the callback,
swaps at that token boundary: s = N exactly. Any other engine is sent ``load_weights`` from a
helper thread at the N-th token; s is then read from its stamps (s ≥ N; the log q still
have to match the law of each token's stamped side of the split), and a swap that landed
after the turn is reported as not exercised. Reported too, over the tokens t ≥ s: the gap
max |log q_stale − log q_fresh| where both are finite, and the support flips (tokens inside
one law's top-k / top-p support and outside the other's), and ``other_law_distance``: the
recorded log q's distance from the *other* mode's law (keep ↔ recompute), by the same rule.
Where it exceeds ε, the check would have caught a keep that silently recomputed, or a
recompute that silently kept the old KV, by the log q alone.
"""

from __future__ import annotations

import inspect
import threading
from collections.abc import Mapping
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from provrl.conformance.reference import Reference
from provrl.engine.api import Engine, HotLoadReport, TurnOutput
from provrl.provenance import SamplingParams

WAIT_S = 600.0
"""Longest wait for a turn or a hot-load (a stuck engine fails the check, it does not hang)."""


def expected(mode: str, v: int, n: int, split: int) -> tuple[np.ndarray, np.ndarray]:
    """(version [n], kv_min [n]) of a turn of ``n`` tokens whose tokens ``split`` … n−1 were
    sampled after a ``mode`` swap v → v+1 (the table of the module docstring; drain's
    split is n)."""
    t = np.arange(n)
    version = np.where(t < split, v, v + 1).astype(np.int32)
    kv_min = version.copy() if mode == "recompute" else np.full(n, v, np.int32)
    return version, kv_min


def streams_tokens(engine: Engine) -> bool:
    """Whether ``engine.submit`` takes an ``on_token`` callback."""
    params = inspect.signature(engine.submit).parameters
    return "on_token" in params or any(p.kind is p.VAR_KEYWORD for p in params.values())


class SwapAt:
    """An ``on_token`` callback that publishes ``weights`` as ``version`` right after the
    ``n``-th token it sees: by ``engine.load_weights_async`` on the callback's own thread
    where the engine has it (the swap lands at that token boundary: ``exact``), else by
    ``engine.load_weights`` on a helper thread (it lands a few tokens later)."""

    def __init__(
        self,
        engine: Engine,
        n: int,
        weights: Mapping[str, torch.Tensor],
        version: int,
        mode: str,
    ) -> None:
        self.engine, self.n, self.weights, self.version, self.mode = (
            engine,
            n,
            weights,
            version,
            mode,
        )
        self.seen = 0
        self.future: Future[HotLoadReport] | None = None
        self.exact = callable(getattr(engine, "load_weights_async", None))

    def on_token(self, request_id: str, token_id: int) -> None:
        self.seen += 1
        if self.seen == self.n:
            self.publish()

    def publish(self) -> None:
        """Send the hot-load now (never raises: an error resolves :attr:`future`)."""
        if self.future is not None:
            return
        fut: Future[HotLoadReport] = Future()
        self.future = fut
        if self.exact:
            try:
                queued = self.engine.load_weights_async(  # type: ignore[attr-defined]
                    self.weights, self.version, self.mode
                )
                queued.add_done_callback(lambda f: _copy(f, fut))
            except BaseException as e:
                fut.set_exception(e)
            return

        def send() -> None:
            try:
                fut.set_result(self.engine.load_weights(self.weights, self.version, self.mode))  # type: ignore[arg-type]
            except BaseException as e:
                fut.set_exception(e)

        threading.Thread(target=send, name="provrl-conformance-swap", daemon=True).start()

    def report(self) -> HotLoadReport:
        """The hot-load's report (sent now if the turn ended before the n-th token)."""
        self.publish()
        assert self.future is not None
        return self.future.result(WAIT_S)


def _copy(src: Future[HotLoadReport], dst: Future[HotLoadReport]) -> None:
    e = src.exception()
    if e is not None:
        dst.set_exception(e)
    else:
        dst.set_result(src.result())


@dataclass
class MidTurn:
    """What one mid-turn swap showed: its errors (one line each) and its figures."""

    errors: list[str] = field(default_factory=list)
    max_abs_logprob: float = 0.0
    boundary_misses: int = 0
    detail: dict[str, Any] = field(default_factory=dict)


def _first_mismatch(
    out: TurnOutput, version: np.ndarray, kv_min: np.ndarray, what: str
) -> list[str]:
    errs = []
    for name, got, want in (
        ("version", out.version, version),
        ("kv_min", out.kv_min, kv_min),
        ("kv_max", out.kv_max, version),
    ):
        got = np.asarray(got)
        bad = np.flatnonzero(got != want) if got.shape == want.shape else np.array([0])
        if bad.size:
            t = int(bad[0])
            have = int(got[t]) if t < got.size else None
            errs.append(f"{what}: token {t} has {name} {have}, expected {int(want[t])}")
    return errs


def midturn_swap(
    engine: Engine,
    ref: Reference,
    prompt: list[int],
    params: SamplingParams,
    mode: str,
    new: Mapping[str, torch.Tensor],
    swap_after: int,
    tol: float,
) -> MidTurn:
    """One request across a ``mode`` swap v → v+1 published after its ``swap_after``-th
    token (module docstring); ``ref`` holds v's weights on entry and v+1's on return."""
    res = MidTurn()
    v = engine.version
    T, N, P = params.max_new_tokens, swap_after, len(prompt)
    what = f"mid-turn {mode} (swap after token {N} of {T})"
    swap = SwapAt(engine, N, new, v + 1, mode)
    fut = engine.submit(prompt, params, on_token=swap.on_token)  # type: ignore[call-arg]
    out = fut.result(WAIT_S)
    try:
        report = swap.report()
    finally:
        engine.release(out.request_id)
    n = len(out.token_ids)
    if swap.seen < N:
        res.errors.append(
            f"{what}: the turn ended after {n} token(s) ({out.finish_reason}), before the swap "
            f"point: nothing was swapped mid-turn (lower swap_after, or turn EOS stops off)"
        )
    if (report.old_version, report.new_version, engine.version) != (v, v + 1, v + 1):
        res.errors.append(
            f"{what}: load_weights(v{v + 1}) reported v{report.old_version} → "
            f"v{report.new_version}, engine.version is {engine.version}"
        )
    if report.mode != mode:
        res.errors.append(f"{what}: the hot-load report says mode {report.mode!r}")
    if report.in_flight < 1:
        res.errors.append(f"{what}: the hot-load report lost the live request")
    # the split: the engine promised the token boundary (exact), or its stamps say where
    stamped_new = np.flatnonzero(np.asarray(out.version) > v)
    s = int(stamped_new[0]) if stamped_new.size else n
    if mode == "drain":
        s = n
    elif swap.exact:
        s = min(N, n)
    elif s < N:
        res.errors.append(f"{what}: token {s} is stamped v{v + 1} before the swap was published")
    version, kv_min = expected(mode, v, n, s)
    res.errors += _first_mismatch(out, version, kv_min, what)
    c = P + s - 1  # KV positions cached when the swap landed
    if mode == "recompute" and s < n and report.recomputed_tokens < c:
        res.errors.append(
            f"{what}: {report.recomputed_tokens} tokens recomputed, the live request held {c}"
        )
    # the law of each token: fresh under v before the split; stale or fresh under v+1 after
    ids, toks = prompt + out.token_ids, out.token_ids
    rows = ref.turn_logits(ids, P)  # fresh under v
    stale = None
    if s < n and mode != "drain":
        stale = ref.logits_across(ids[:-1], c, new)[P - 1 :]
    else:
        ref.load(new)
    fresh_new = ref.turn_logits(ids, P)
    after = np.arange(n) >= s
    if stale is not None:
        m = torch.from_numpy(after)
        rows[m] = (stale if mode == "keep" else fresh_new)[m]
    diff, res.boundary_misses = ref.distance(out.logprob, rows, toks, params, tol)
    law_after = {
        "keep": f"the recompute with KV positions < {c} under v{v} and the rest under v{v + 1}",
        "recompute": f"a fresh recompute under v{v + 1}: the KV was not recomputed",
    }
    for side, mask, law in (
        ("before", ~after, f"a recompute under v{v}"),
        ("after", after, law_after.get(mode, "")),
    ):
        if mask.any() and float(diff[mask].max()) > tol:
            t = int(np.flatnonzero(mask)[np.argmax(diff[mask])])
            res.errors.append(
                f"{what}: token {t} ({side} the swap) has log q differing from {law} by "
                f"{diff[t]:.3g} (tolerance {tol:g})"
            )
    gap, flips, other = None, None, None
    if stale is not None:  # how far apart the stale and the fresh law are after the swap
        sel = [t for t in range(n) if after[t]]
        a = ref.behaviour(stale[sel], [toks[t] for t in sel], params).logprob.numpy()
        b = ref.behaviour(fresh_new[sel], [toks[t] for t in sel], params).logprob.numpy()
        both = np.isfinite(a) & np.isfinite(b)
        gap = float(np.max(np.abs(a - b)[both])) if both.any() else 0.0
        flips = int(np.sum(np.isfinite(a) != np.isfinite(b)))
        # the recorded log q against the law of the other mode (keep ↔ recompute)
        wrong = fresh_new if mode == "keep" else stale
        lp = np.asarray(out.logprob)[sel]
        other = float(ref.distance(lp, wrong[sel], [toks[t] for t in sel], params, tol)[0].max())
    res.max_abs_logprob = float(diff.max()) if n else 0.0
    res.detail = {
        "version": [v, v + 1],
        "tokens": n,
        "swap_after": N,
        "split": s,
        "exact_split": swap.exact,
        "exercised": mode == "drain" or s < n,
        "cached_at_swap": c if s < n else None,
        "max_abs_logprob": res.max_abs_logprob,
        "stale_fresh_gap": gap,
        "support_flips": flips,
        "other_law_distance": other,
        "boundary_misses": res.boundary_misses,
        "recomputed_tokens": report.recomputed_tokens,
        "update_ms": report.update_ms,
    }
    return res

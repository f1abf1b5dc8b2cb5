r"""The four checks of ``provrl conformance``, each against any :class:`~provrl.engine.Engine`.

``law``      At each fixed prefix h and setting (τ, k, p), n one-token draws; the G-test of
             :mod:`provrl.conformance.stats` of their frequencies against the reported
             q(a) = exp(logprob), and the exact seen-set test, Holm-corrected over every
             (prefix, setting) and both tests at level α.
             Also: the reported q of one token at one prefix is one number (spread ≤ ε),
             and the reported masses add to at most 1 (+ mass_tol).
``teacher``  The same draws, recomputed by the trainer's float32 forward
             (:class:`~provrl.conformance.reference.Reference`): for every drawn token
             |log q_rec − log q_ref| ≤ ε_dtype and |log m_rec − log m_ref| ≤ ε_dtype,
             and no drawn token outside the recomputed support by more than ε_dtype
             (:meth:`~provrl.conformance.reference.Reference.boundary_margin`: a near-tie
             at the top-k / top-p cut that another dtype rounds the other way is counted
             as a ``boundary_miss``, not a failure).
``weights``  After each hot-load, the engine's weight fingerprint equals that of the state
             dict published as that version (:mod:`provrl.engine.fingerprint`); skipped
             (passes, says so) for an engine that cannot fingerprint its weights.
``stamps``   For each hot-load mode, one request across a swap between its two turns:
             turn 1 stamped (v, kv v…v); the report says v → v+1 with the request alive;
             turn 2 stamped v+1 with kv_min = v (keep) or v+1 (recompute, drain), and its
             log q equal to a fresh recompute under v+1 (recompute, drain: the KV really
             was recomputed), turn 1's to one under v. An engine whose new turn is a new
             request over the whole context (vLLM: its prefix cache is salted with the
             version) refills turn 2's KV under v+1 in every mode: it passes when it stamps
             kv_min = v+1 and turn 2's log q are the fresh recompute's (``turn2_kv``: "kept",
             "recomputed" at the swap, or "filled at turn 2"). Then one request per mode across
             a swap published after the ``swap_after``-th token of a turn
             (:mod:`provrl.conformance.midturn`): each token's version and KV span as
             the mode implies, its log q equal to the recompute under that version with
             that KV (stale under keep, fresh under recompute; drain finishes the turn
             under v).

Each check is a :class:`Check`; its ``error`` is one line naming what failed and by how much.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from provrl.conformance import stats as st
from provrl.conformance.config import ConformanceConfig
from provrl.conformance.midturn import midturn_swap, streams_tokens
from provrl.conformance.reference import Reference, new_version
from provrl.engine.api import Engine, TurnOutput
from provrl.engine.fingerprint import fingerprint, mismatches
from provrl.models.loading import LoadedModel
from provrl.provenance import SamplingParams


@dataclass
class Check:
    """One check's verdict (``--json``: ``{"name", "pass", "statistic", "p_value" or
    "error", …detail}``)."""

    name: str
    passed: bool
    statistic: float | None = None
    p_value: float | None = None
    error: str | None = None
    detail: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"name": self.name, "pass": self.passed, "statistic": self.statistic}
        if self.p_value is not None:
            d["p_value"] = self.p_value
        if self.error is not None:
            d["error"] = self.error
        return {**d, **self.detail}

    def line(self) -> str:
        """One line: ``PASS law: …`` / ``FAIL law: <error>``."""
        what = self.error or ", ".join(f"{k}={v}" for k, v in self.summary().items())
        return f"{'PASS' if self.passed else 'FAIL'} {self.name}: {what}"

    def summary(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.statistic is not None:
            out["statistic"] = f"{self.statistic:.4g}"
        if self.p_value is not None:
            out["p"] = f"{self.p_value:.3g}"
        if "note" in self.detail:
            out["note"] = self.detail["note"]
        return out


# ----------------------------------------------------------------------------- draws
@dataclass
class Draws:
    """One-token draws at one prefix under one setting: the pilot and the tested ones."""

    prompt: int
    setting: tuple[float, int, float]
    pilot: list[TurnOutput]
    test: list[TurnOutput]

    @property
    def label(self) -> str:
        t, k, p = self.setting
        return f"prompt {self.prompt} at (T={t}, k={k}, p={p})"

    def all(self) -> list[TurnOutput]:
        return self.pilot + self.test


def draw(
    engine: Engine, prompt_ids: Sequence[int], params: list[SamplingParams]
) -> list[TurnOutput]:
    """One request per ``params`` (all submitted before any is awaited), released after."""
    futs = [engine.submit(prompt_ids, p) for p in params]
    outs = [f.result() for f in futs]
    for o in outs:
        engine.release(o.request_id)
        if len(o.token_ids) != 1:
            raise ValueError(f"request {o.request_id}: asked for 1 token, got {len(o.token_ids)}")
    return outs


def collect(engine: Engine, prompts: list[list[int]], cfg: ConformanceConfig) -> list[Draws]:
    """The pilot and tested draws of every (prompt, setting), seeded from ``cfg.seed``."""
    out = []
    seed = cfg.seed * 10_000_019
    for i, ids in enumerate(prompts):
        for s in cfg.settings:
            n = cfg.pilot + cfg.samples
            outs = draw(engine, ids, [cfg.params(s, 1, seed + j) for j in range(n)])
            seed += n
            out.append(Draws(i, s, outs[: cfg.pilot], outs[cfg.pilot :]))
    return out


def reported(outs: list[TurnOutput]) -> tuple[dict[int, float], float, float]:
    """(token → reported q of its first draw, the largest spread of one token's reported
    log q over its draws, the largest spread of the reported kept mass)."""
    lp: dict[int, list[float]] = {}
    kept = [float(o.kept_mass[0]) for o in outs]
    for o in outs:
        lp.setdefault(o.token_ids[0], []).append(float(o.logprob[0]))
    spread = max((max(v) - min(v) for v in lp.values()), default=0.0)
    return {t: math.exp(v[0]) for t, v in lp.items()}, spread, max(kept) - min(kept)


# ----------------------------------------------------------------------------- law
def law_check(draws: list[Draws], cfg: ConformanceConfig, tol: float) -> Check:
    """The sampling-law check (module docstring) over every (prompt, setting)."""
    tests: list[dict[str, Any]] = []
    problems: list[str] = []
    m = len(draws)
    for d in draws:
        known, _, _ = reported(d.pilot)
        everything, spread, kept_spread = reported(d.all())
        cells = st.make_cells(known, cfg.samples, cfg.e_min)
        drawn = [o.token_ids[0] for o in d.test]
        r = st.g_test(st.count(cells, drawn), cells.probs)
        seen_mass = float(sum(known.values()))
        seen = st.seen_mass_test(sum(t in known for t in drawn), len(drawn), seen_mass)
        excess = st.mass_excess(everything)
        tests.append(
            {
                "at": d.label,
                "G": r.statistic,
                "dof": r.dof,
                "p_value": r.p_value,
                "seen_mass": seen_mass,
                "seen_share": seen.statistic + min(seen_mass, 1.0),
                "seen_p_value": seen.p_value,
                "cells": len(cells.probs),
                "rest_mass": float(cells.probs[-1]),
                "power": st.power(cfg.samples, r.dof, cfg.effect, cfg.alpha / (2 * m)),
                "mass_excess": excess,
                "logprob_spread": spread,
                "kept_mass_spread": kept_spread,
            }
        )
        if excess > cfg.mass_tol:
            problems.append(f"{d.label}: the reported q add to 1 + {excess:.3g} > 1")
        if spread > tol:
            problems.append(f"{d.label}: one token's reported log q varies by {spread:.3g}")
    # Holm over 2m p-values: each law's G-test and its seen-set test
    adj = st.holm_adjusted([t["p_value"] for t in tests] + [t["seen_p_value"] for t in tests])
    for i, t in enumerate(tests):
        t["p_holm"], t["seen_p_holm"] = adj[i], adj[m + i]
    worst = min(range(m), key=lambda i: (min(adj[i], adj[m + i]), -tests[i]["G"]))
    w = tests[worst]
    if w["seen_p_holm"] <= cfg.alpha:
        problems.insert(
            0,
            f"{w['at']}: {w['seen_share']:.3g} of the draws fell on tokens the pilot drew, "
            f"whose reported q add to {w['seen_mass']:.3g}: Holm-adjusted p = "
            f"{w['seen_p_holm']:.3g} ≤ α = {cfg.alpha}",
        )
    if w["p_holm"] <= cfg.alpha:
        problems.insert(
            0,
            f"{w['at']}: frequencies differ from the reported q, G = {w['G']:.4g} on "
            f"{w['dof']} dof, Holm-adjusted p = {w['p_holm']:.3g} ≤ α = {cfg.alpha}",
        )
    adjusted = [min(adj[i], adj[m + i]) for i in range(m)]
    testable = [t for t in tests if t["dof"] > 0]
    note = (
        f"{len(testable)}/{m} laws testable, power ≥ "
        f"{min((t['power'] for t in testable), default=0.0):.2f} at w = {cfg.effect}"
    )
    return Check(
        "law",
        not problems,
        w["G"],
        adjusted[worst],
        "; ".join(problems) or None,
        {"alpha": cfg.alpha, "note": note, "tests": tests},
    )


# ----------------------------------------------------------------------------- teacher
def teacher_check(
    draws: list[Draws], prompts: list[list[int]], ref: Reference, tol: float
) -> Check:
    """Every drawn token's recorded log q and kept mass against the trainer's recompute."""
    worst_lp = worst_m = 0.0
    worst_at = ""
    misses: list[str] = []
    boundary: list[float] = []
    rows = {i: ref.logits(ids)[-1:] for i, ids in enumerate(prompts)}
    for d in draws:
        tokens = sorted({o.token_ids[0] for o in d.all()})
        rec = {o.token_ids[0]: o for o in d.all()}
        t, k, p = d.setting
        params = SamplingParams(temperature=t, top_k=k, top_p=p)
        fresh = ref.behaviour(rows[d.prompt].expand(len(tokens), -1), tokens, params)
        for j, tok in enumerate(tokens):
            lp_ref, m_ref = float(fresh.logprob[j]), float(fresh.kept_mass[j])
            lp, m = float(rec[tok].logprob[0]), float(rec[tok].kept_mass[0])
            if not math.isfinite(lp_ref):
                margin = ref.boundary_margin(rows[d.prompt][0], tok, params)
                if margin <= tol:  # a near-tie at the cut: the dtypes round it differently
                    boundary.append(margin)
                else:
                    misses.append(f"{d.label}: token {tok}, {margin:.3g} past the cut")
                continue
            dlp, dm = abs(lp - lp_ref), abs(math.log(max(m, 1e-30)) - math.log(m_ref))
            if max(dlp, dm) > max(worst_lp, worst_m):
                worst_at = f"{d.label}, token {tok}"
            worst_lp, worst_m = max(worst_lp, dlp), max(worst_m, dm)
    problems = []
    if worst_lp > tol:
        problems.append(
            f"{worst_at}: recorded log q differs from the trainer's recompute by "
            f"{worst_lp:.3g} (tolerance {tol:g})"
        )
    if worst_m > tol:
        problems.append(
            f"{worst_at}: recorded log kept mass differs from the recompute by "
            f"{worst_m:.3g} (tolerance {tol:g})"
        )
    if misses:
        problems.append(f"{len(misses)} drawn token(s) outside the recomputed support, e.g. {misses[0]}")  # fmt: skip
    stat = max(worst_lp, worst_m)
    return Check(
        "teacher",
        not problems,
        stat,
        None,
        "; ".join(problems) or None,
        {
            "tolerance": tol,
            "max_abs_logprob": worst_lp,
            "max_abs_log_kept_mass": worst_m,
            "support_misses": len(misses),
            "boundary_misses": len(boundary),
            "note": f"max |Δ log q| = {worst_lp:.2g}, |Δ log m| = {worst_m:.2g} ≤ {tol:g}",
        },
    )


# ----------------------------------------------------------------------------- hot-load
def _stamp_errors(out: TurnOutput, version: int, kv_min: int, what: str) -> list[str]:
    errs = []
    for name, arr, want in (
        ("version", out.version, version),
        ("kv_max", out.kv_max, version),
        ("kv_min", out.kv_min, kv_min),
    ):
        bad = np.flatnonzero(np.asarray(arr) != want)
        if bad.size:
            errs.append(f"{what}: token {bad[0]} has {name} {int(arr[bad[0]])}, expected {want}")
    return errs


def _weight_errors(engine: Engine, sd: dict[str, Any], what: str) -> list[str]:
    """The tensors whose fingerprint after a hot-load differs from the published ``sd``'s."""
    got = engine.weights_fingerprint()  # type: ignore[attr-defined]
    dtype = getattr(engine, "weights_dtype", None)
    bad = mismatches(fingerprint(sd, dtype, names=set(got)), got)
    if not bad:
        return []
    return [f"{what}, {len(bad)} tensor(s) differ from the published weights, e.g. {bad[0]}"]


def hotload_checks(
    engine: Engine,
    lm: LoadedModel,
    ref: Reference,
    prompt: list[int],
    cfg: ConformanceConfig,
    tol: float,
) -> tuple[Check, Check]:
    """The ``weights`` and ``stamps`` checks: per mode of ``cfg.modes``, one swap between
    the two turns of a live request, then one in the middle of a turn
    (:mod:`provrl.conformance.midturn`); every swap fingerprinted (module docstring).
    Leaves the engine and ``ref`` at the last published version."""
    stamp_errs: list[str] = []
    weight_errs: list[str] = []
    modes: dict[str, Any] = {}
    can_fp = callable(getattr(engine, "weights_fingerprint", None))
    params = cfg.params(cfg.stamps_setting, cfg.turn_tokens, cfg.seed)
    extra = prompt[-4:]  # non-action context between the turns
    worst_fresh = 0.0
    boundary = 0  # tokens just past the recomputed cut (Reference.distance)
    for mode in cfg.modes:
        v = engine.version
        out1 = engine.submit(prompt, params).result()
        stamp_errs += _stamp_errors(out1, v, v, f"{mode}: turn 1 under v{v}")
        ids1 = prompt + out1.token_ids
        rows1 = ref.turn_logits(ids1, len(prompt))
        diff1, b1 = ref.distance(out1.logprob, rows1, out1.token_ids, params, tol)
        d1 = float(diff1.max()) if out1.token_ids else 0.0
        sd = new_version(lm, v + 1, cfg.perturb, cfg.seed)
        report = engine.load_weights(sd, v + 1, mode)  # type: ignore[arg-type]
        if (report.old_version, report.new_version, engine.version) != (v, v + 1, v + 1):
            stamp_errs.append(
                f"{mode}: load_weights(v{v + 1}) reported v{report.old_version} → "
                f"v{report.new_version}, engine.version is {engine.version}"
            )
        if report.in_flight < 1:
            stamp_errs.append(f"{mode}: the hot-load report lost the live request")
        if can_fp:
            weight_errs += _weight_errors(engine, sd, f"{mode}: after the hot-load to v{v + 1}")
        ref.load(sd)
        out2 = engine.submit_continue(out1.request_id, extra, params).result()
        engine.release(out1.request_id)
        kv2 = int(np.min(out2.kv_min)) if out2.token_ids else None
        # Turn 2 either reads the live request's KV (keep: computed under v) or a KV filled
        # under v+1 — at the swap (recompute, drain) or at turn 2's own prefill (an engine
        # whose new turn is a new request over the whole context, e.g. vLLM's version-salted
        # prefix cache). A stamp of v+1 is believed only if turn 2's log q are the fresh
        # recompute's (checked below).
        refilled = mode != "keep" or kv2 == v + 1
        kv_lo = v + 1 if refilled else v
        stamp_errs += _stamp_errors(out2, v + 1, kv_lo, f"{mode}: turn 2 after the swap")
        ids2 = ids1 + extra + out2.token_ids
        rows2 = ref.turn_logits(ids2, len(ids1) + len(extra))
        diff2, b2 = ref.distance(out2.logprob, rows2, out2.token_ids, params, tol)
        d2 = float(diff2.max()) if out2.token_ids else 0.0
        at_turn2 = report.recomputed_tokens == 0 and kv2 == v + 1 and d2 <= tol
        if mode == "recompute" and report.recomputed_tokens < len(ids1) - 1 and not at_turn2:
            stamp_errs.append(
                f"recompute: {report.recomputed_tokens} tokens recomputed, the live request "
                f"holds {len(ids1) - 1}"
            )
        boundary += b1 + b2 if refilled else b1
        if d1 > tol:
            stamp_errs.append(
                f"{mode}: turn 1's log q differ from a recompute under its stamped v{v} by "
                f"{d1:.3g} (tolerance {tol:g})"
            )
        if refilled and d2 > tol:
            stamp_errs.append(
                f"{mode}: turn 2's log q differ from a fresh recompute under its stamped "
                f"v{v + 1} by {d2:.3g} (tolerance {tol:g}): the KV was not recomputed"
            )
        worst_fresh = max(worst_fresh, d1, d2 if refilled else 0.0)
        modes[mode] = {
            "version": [v, v + 1],
            "turn1_max_abs_logprob": d1,
            "turn2_max_abs_logprob": d2,
            "kv_min_turn2": kv2,
            "turn2_kv": "kept"
            if not refilled
            else ("filled at turn 2" if at_turn2 else "recomputed"),
            "recomputed_tokens": report.recomputed_tokens,
            "update_ms": report.update_ms,
        }
    midturn: dict[str, Any] = {}
    streams = streams_tokens(engine)
    mid_params = cfg.params(cfg.stamps_setting, cfg.turn_tokens, cfg.seed + 1)
    for mode in cfg.modes if streams else []:
        v = engine.version
        sd = new_version(lm, v + 1, cfg.perturb, cfg.seed)
        mt = midturn_swap(engine, ref, prompt, mid_params, mode, sd, cfg.swap_point, tol)
        stamp_errs += mt.errors
        if can_fp:
            what = f"mid-turn {mode}: after the hot-load to v{v + 1}"
            weight_errs += _weight_errors(engine, sd, what)
        worst_fresh = max(worst_fresh, mt.max_abs_logprob)
        boundary += mt.boundary_misses
        midturn[mode] = mt.detail
    n_loads = len(cfg.modes) * (2 if streams else 1)
    weights = Check(
        "weights",
        not weight_errs,
        float(len(weight_errs)),
        None,
        "; ".join(weight_errs) or None,
        {
            "note": f"{n_loads} hot-loads fingerprinted"
            if can_fp
            else "skipped: this engine cannot fingerprint its weights"
        },
    )
    exact = all(d["exact_split"] for d in midturn.values())
    if not streams:
        mid_note = "mid-turn skipped: this engine's submit takes no on_token"
    elif not all(d["exercised"] for d in midturn.values()):
        late = [m for m, d in midturn.items() if not d["exercised"]]
        mid_note = f"mid-turn not exercised in {', '.join(late)}: the swap landed after the turn"
    else:
        mid_note = (
            f"mid-turn after token {cfg.swap_point} of {cfg.turn_tokens}"
            f"{'' if exact else ' (split read from the stamps)'}"
        )
    stamps = Check(
        "stamps",
        not stamp_errs,
        worst_fresh,
        None,
        "; ".join(stamp_errs) or None,
        {
            "modes": modes,
            "midturn": midturn,
            "boundary_misses": boundary,
            "note": f"{', '.join(cfg.modes)}: stamps as scheduled between turns and "
            f"{mid_note}, max |Δ log q| = {worst_fresh:.2g}",
        },
    )
    return weights, stamps

"""All conformance checks against one engine, in order, into one report.

::

    prompts   = chat-templated cfg.prompts
    draws     = pilot + tested one-token draws per (prompt, setting)     at version v
    law       = G-tests of the tested draws, Holm over (prompt, setting)
    teacher   = the draws' recorded log q, kept mass vs the trainer's recompute
    weights,
    stamps    = per hot-load mode, one swap between the two turns of a live request
                and one after the swap_after-th token of a turn (midturn.py)

The engine must serve ``lm``'s weights as its current version (what ``make_engine(lm)``
builds); the run publishes new versions to it, so use an engine built for the check.
"""

from __future__ import annotations

import math
import time
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

from provrl.conformance.checks import Check, collect, hotload_checks, law_check, teacher_check
from provrl.conformance.config import ConformanceConfig
from provrl.conformance.reference import Reference
from provrl.engine.api import Engine
from provrl.models.chat import chat_ids
from provrl.models.loading import LoadedModel

CHECKS = ("law", "teacher", "weights", "stamps")
"""Every check, in the order they run."""


@dataclass
class Report:
    """Every check's verdict; ``passed`` iff each passed."""

    checks: list[Check]
    runtime_s: float
    dtype: str

    @property
    def passed(self) -> bool:
        return all(c.passed for c in self.checks)

    def to_dict(self) -> dict[str, Any]:
        return {
            "pass": self.passed,
            "dtype": self.dtype,
            "runtime_s": round(self.runtime_s, 3),
            "checks": [json_safe(c.to_dict()) for c in self.checks],
        }

    def failed(self) -> list[str]:
        return [c.name for c in self.checks if not c.passed]


def json_safe(x: Any) -> Any:
    """``x`` with every non-finite float as the string ``"inf"``, ``"-inf"`` or ``"nan"``
    (strict JSON has no infinities; an infinite G means a token outside the support)."""
    if isinstance(x, float) and not math.isfinite(x):
        return str(x)
    if isinstance(x, dict):
        return {k: json_safe(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [json_safe(v) for v in x]
    return x


def run_conformance(
    engine: Engine,
    lm: LoadedModel,
    cfg: ConformanceConfig | None = None,
    dtype: str = "float32",
    only: Collection[str] = CHECKS,
) -> Report:
    """Run the checks ``only`` names (default all: ``law``, ``teacher``, ``weights``,
    ``stamps``) against ``engine``, which computes in ``dtype`` (it picks the
    teacher-forcing tolerance)."""
    cfg = cfg or ConformanceConfig()
    unknown = sorted(set(only) - set(CHECKS))
    if unknown:
        raise ValueError(f"conformance: unknown check(s) {unknown}; the checks are {list(CHECKS)}")
    if dtype not in cfg.logprob_tol:
        raise ValueError(f"conformance: no logprob_tol for dtype {dtype!r} ({sorted(cfg.logprob_tol)})")  # fmt: skip
    tol = cfg.logprob_tol[dtype]
    t0 = time.perf_counter()
    prompts = [chat_ids(lm.tokenizer, [{"role": "user", "content": q}]) for q in cfg.prompts]
    ref = Reference(lm)
    checks: list[Check] = []
    if "law" in only or "teacher" in only:
        draws = collect(engine, prompts, cfg)
        if "law" in only:
            checks.append(law_check(draws, cfg, tol))
        if "teacher" in only:
            checks.append(teacher_check(draws, prompts, ref, tol))
    if "weights" in only or "stamps" in only:
        weights, stamps = hotload_checks(engine, lm, ref, prompts[0], cfg, tol)
        checks += [c for c in (weights, stamps) if c.name in only]
    return Report(checks, time.perf_counter() - t0, dtype)

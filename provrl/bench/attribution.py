"""The attribution table of issue 34 on a run's trajectories (docs/conformance.md).

For the trajectories of a trajectory log (an async keep-mode run's ``RUN/rl/trajectories.jsonl``)
and the weights of every version they name, each way of obtaining the behaviour
log-probability — the exact recorded q, π_{v_start} recomputed per rollout, π_{v_t}
recomputed per token on a fresh KV, treated as on-policy — is scored against the exact q:
per-token and per-trajectory log-weight error, ESS, the share a cap would clip
(:mod:`provrl.conformance.attribution`, :mod:`provrl.objectives.attribution`). The table is
given over all trajectories and over those that span two or more versions.

Weights: ``--weights V=DIR`` for each version (a safetensors file or directory), or
``--ckpts RUN/rl`` for every ``ckpt-vN`` in it plus ``--weights 0=DIR`` for the version RL
started from. A run prunes old checkpoints, so keep them for this measurement::

    python benchmarks/attribution.py --trajectories RUN/rl/trajectories.jsonl \\
        --ckpts RUN/rl --weights 0=RUN/warmstart/ckpt --model RUN/warmstart/ckpt \\
        --steps RUN/rl/steps.jsonl --out results/attribution.json

``--steps``: only the trajectories a step trained, each against the weights that step's
correction saw (π_θ = π_prox, the learner's version before the update: step s makes version
s, so s − 1); without it every logged trajectory against one ``--target`` (default newest).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import numpy as np


def spans(versions: np.ndarray, is_action: np.ndarray) -> int:
    """How many distinct versions a trajectory's action tokens carry."""
    return len(set(versions[is_action].tolist()))


def trained_targets(steps: str) -> dict[str, int]:
    """traj_id → the learner's version before the step that trained it (``steps.jsonl``:
    step s's record carries ``trained`` ids and the ``version`` s it made)."""
    from provrl.pipeline.steplog import step_lines  # a torn last line skipped, a bad one named

    out: dict[str, int] = {}
    for n, line in enumerate(step_lines(steps), 1):
        rec = json.loads(line)
        try:
            out.update({tid: int(rec["version"]) - 1 for tid in rec["trained"]})
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"{steps}: record {n} needs 'version' and 'trained' ({e})") from e
    return out


def attribution(
    trajectories: str,
    weights: dict[int, str],
    model: str,
    target: int | None = None,
    cap: float = 2.0,
    limit: int | None = None,
    steps: str | None = None,
) -> dict[str, Any]:
    """The table (module docstring) for the first ``limit`` trajectories of the log (with
    ``steps``: of the trained ones, each against its step's π_prox)."""
    import torch

    from provrl.conformance.attribution import Rollout, recompute, table
    from provrl.engine.hotload import read_weights
    from provrl.models.loading import load_model
    from provrl.trajlog import read_all

    trained = trained_targets(steps) if steps else None
    trajs = [t for t in read_all(trajectories) if t.is_action.any()]
    if trained is not None:
        trajs = [t for t in trajs if t.traj_id in trained]
    trajs = trajs[:limit]
    if not trajs:
        raise ValueError(f"{trajectories}: no trajectory with an action token" + (f" trained in {steps}" if steps else ""))  # fmt: skip
    rollouts = [Rollout.from_trajectory(t) for t in trajs]
    named = sorted({int(v) for r in rollouts for v in r.version[r.is_action]})
    targets: int | list[int]
    if trained is not None:
        targets = [trained[t.traj_id] for t in trajs]
        target_set = set(targets)
    else:
        targets = max(named) if target is None else target
        target_set = {targets}
    missing = sorted({*named, *target_set} - set(weights))
    if missing:
        raise ValueError(
            f"{trajectories}: no weights for version(s) {missing} (give --weights V=DIR or "
            f"--ckpts RUN/rl with the run's checkpoints kept)"
        )
    lm = load_model(model)

    def weights_of(v: int) -> dict[str, torch.Tensor]:
        sd, _ = read_weights(weights[v])
        return {k: torch.as_tensor(x) for k, x in sd.items()}

    multi = [i for i, r in enumerate(rollouts) if spans(r.version, r.is_action) >= 2]
    rec = recompute(rollouts, lm, weights_of, targets, progress=True)
    out: dict[str, Any] = {
        "trajectories": len(rollouts),
        "spanning_two_or_more": len(multi),
        "spanning_share": len(multi) / len(rollouts),
        "versions": named,
        "target_version": targets if trained is None else "per trained step: its version - 1",
        "table": table(rec, cap),
    }
    if multi:
        idx = torch.as_tensor(multi)
        sub = type(rec)(rec.logp[idx], rec.mask[idx], {m: b[idx] for m, b in rec.logb.items()})
        out["table_spanning"] = table(sub, cap)
    return out


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trajectories", default=None, help="A trajectory log (.jsonl).")
    ap.add_argument("--weights", action="append", default=[], help="V=DIR (repeatable).")
    ap.add_argument("--ckpts", default=None, help="A directory of ckpt-vN checkpoints.")
    ap.add_argument("--model", default=None, help="Model name or HF dir (default: version 0's).")
    ap.add_argument("--target", type=int, default=None, help="π_θ's version (default: newest).")
    ap.add_argument("--cap", type=float, default=2.0, help="The cap C of the clip shares.")
    ap.add_argument("--limit", type=int, default=None, help="At most this many trajectories.")
    ap.add_argument(
        "--steps", default=None, help="RUN/rl/steps.jsonl: trained ones, each vs its π_prox."
    )
    ap.add_argument("--out", default=None)
    ap.add_argument("--json", action="store_true", help="Print JSON only (always does).")
    a = ap.parse_args(argv)
    weights: dict[int, str] = {}
    if a.ckpts:
        for p in sorted(Path(a.ckpts).glob("ckpt-v*")):
            weights[int(p.name.removeprefix("ckpt-v"))] = str(p)
    for w in a.weights:
        v, _, path = w.partition("=")
        if not path or not v.strip().isdigit():
            raise SystemExit(f"--weights {w!r}: expected V=DIR")
        weights[int(v)] = path
    if a.trajectories is None:  # `make bench` runs every script with --json alone
        skipped = {"skipped": "no --trajectories given: nothing to measure (see --help)"}
        print(json.dumps(skipped))
        return skipped
    model = a.model or weights.get(0)
    if model is None:
        raise SystemExit("--model: give the model (or --weights 0=DIR)")
    t0 = time.perf_counter()
    result = attribution(a.trajectories, weights, model, a.target, a.cap, a.limit, a.steps)
    result["wall_s"] = time.perf_counter() - t0
    if a.out:
        from provrl.bench.results import run_record, write_result

        config = {k: v for k, v in vars(a).items() if k not in ("out", "json")}
        write_result(a.out, run_record("attribution", result, config=config, seeds=[]))
    print(json.dumps(result))
    return result

"""The false-alarm rate of ``provrl conformance`` on provrl's own engine (docs/conformance.md).

For seeds s = seed … seed + repeats − 1: a fresh local engine on ``--model`` (sampler seeded
by s), the ``law`` and ``teacher`` checks with ``ConformanceConfig(seed=s)`` and the given
sizes. Every failure is a false alarm (the engine is the reference implementation); the
``law`` check's is bounded by its family level α by construction, and this measures it.
Prints JSON; ``--out`` writes it with the run record of results/README.md::

    python benchmarks/conformance_false_alarm.py --model tiny --repeats 10 \\
        --out results/conformance_false_alarm.json
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

from scipy import stats as sps


def false_alarms(model: str, dtype: str, repeats: int, seed: int, sizes: dict[str, Any]) -> dict[str, Any]:  # fmt: skip
    """Run law + teacher ``repeats`` times on fresh engines; count the failures per check."""
    import torch

    from provrl.conformance.config import ConformanceConfig
    from provrl.conformance.run import run_conformance
    from provrl.engine import EngineConfig, LocalEngine
    from provrl.models.loading import load_model

    torch.set_num_threads(1)
    lm = load_model(model)
    runs = []
    for s in range(seed, seed + repeats):
        cfg = ConformanceConfig(**sizes, seed=s)
        ecfg = EngineConfig(max_seqs=64, max_context=256, eos_stops=False, dtype=dtype, seed=s)
        engine = LocalEngine(lm, ecfg)
        try:
            r = run_conformance(engine, lm, cfg, dtype, only=("law", "teacher"))
        finally:
            engine.close()
        d = r.to_dict()
        law = d["checks"][0]
        runs.append(
            {
                "seed": s,
                "law": law["pass"],
                "teacher": d["checks"][1]["pass"],
                "law_p_holm": law["p_value"],
                "teacher_max_abs": d["checks"][1]["statistic"],
                "runtime_s": d["runtime_s"],
            }
        )
    n = len(runs)
    out: dict[str, Any] = {"repeats": n, "dtype": dtype, "model": model, "runs": runs}
    for name in ("law", "teacher"):
        k = sum(not r[name] for r in runs)
        # one-sided 95 % Clopper-Pearson upper bound on the false-alarm rate
        upper = float(sps.beta.ppf(0.95, k + 1, n - k)) if k < n else 1.0
        out[name] = {"false_alarms": k, "rate": k / n, "upper95": upper}
    out["runtime_s_mean"] = sum(r["runtime_s"] for r in runs) / n
    return out


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--prompts", nargs="+", default=["What is the capital of France?"])
    ap.add_argument("--settings", default="1.0,20,1.0;0.5,16,0.8", help="T,k,p;T,k,p;…")
    ap.add_argument("--pilot", type=int, default=100)
    ap.add_argument("--samples", type=int, default=400)
    ap.add_argument("--out", default=None)
    ap.add_argument("--json", action="store_true", help="Print JSON only (always does).")
    a = ap.parse_args(argv)
    settings = [
        (float(t), int(k), float(p)) for t, k, p in (s.split(",") for s in a.settings.split(";"))
    ]
    sizes = {"prompts": a.prompts, "settings": settings, "pilot": a.pilot, "samples": a.samples}
    t0 = time.perf_counter()
    result = false_alarms(a.model, a.dtype, a.repeats, a.seed, sizes)
    result["wall_s"] = time.perf_counter() - t0
    if a.out:
        from provrl.bench.results import run_record, write_result

        seeds = list(range(a.seed, a.seed + a.repeats))
        write_result(a.out, run_record("conformance_false_alarm", result, config=sizes | {"model": a.model, "dtype": a.dtype}, seeds=seeds))  # fmt: skip
    print(json.dumps(result))
    return result

"""Which compute dtype is fast on this CPU: bfloat16 against float32, side by side.

``python benchmarks/dtype.py --json --out results/dtype_cpu.json`` measures, in one process
tree and interleaved per repeat (``float32`` then ``bfloat16``, medians reported):

* **matmul** — GFLOP/s of ``torch.mm`` at SmolLM2's shapes in both dtypes
  (:func:`provrl.bench.trainer.matmul_rate`);
* **trainer** — one RL step of provrl's trainer on the trainer benchmark's fixture batch
  (32 trajectories of a default-preset probe, :mod:`provrl.bench.trainer`), in a fresh child
  process per repeat, with ``rl.autocast`` float32 or bfloat16 (weights and AdamW state
  float32 in both); the SFT step is the same forward/backward;
* **engine** — the workload replay (:func:`provrl.bench.replay.run_workload_benchmark`: the
  shipped fixture's episodes turn by turn) with ``engine.dtype`` float32 or bfloat16.

``ratio_*`` is float32's speed over bfloat16's (> 1: float32 is faster here). The record's
``machine.cpu_amx`` says whether the CPU has AMX tiles, which is what ``auto`` dtypes
resolve by (:mod:`provrl.models.precision`); ``auto_resolves_to`` is what it gives here.
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections.abc import Sequence
from typing import Any

DTYPES = ("float32", "bfloat16")


def run_dtype_benchmark(
    repeats: int = 3, threads: int = 2, episodes: int = 32, model: str = "smollm2-135m"
) -> dict[str, Any]:
    """The benchmark of the module docstring; the JSON-able result."""
    from provrl.bench.replay import run_workload_benchmark
    from provrl.bench.trainer import SideSpec, _spawn, batch_shape, load_batch, matmul_rate
    from provrl.models.precision import bf16_is_fast, resolve_dtype

    trainer: dict[str, list[float]] = {d: [] for d in DTYPES}
    engine: dict[str, list[float]] = {d: [] for d in DTYPES}
    for _ in range(repeats):
        for d in DTYPES:
            spec = SideSpec("provrl", model, "", threads, {"autocast": d}, count_flops=False, pin_allocator=False)  # fmt: skip
            trainer[d].append(float(_spawn(spec)["step_s"]))
            rep = run_workload_benchmark("fixture", model, episodes=episodes, repeats=1, threads=threads, dtype=d, hf=False)  # fmt: skip
            engine[d].append(float(rep["engine"]["processed_tokens_per_s"]))
    shape = batch_shape(load_batch(None))
    med = {k: {d: statistics.median(v[d]) for d in DTYPES} for k, v in (("trainer", trainer), ("engine", engine))}  # fmt: skip
    rate = matmul_rate(threads)
    return {
        "bf16_is_fast": bf16_is_fast("cpu"),
        "auto_resolves_to": resolve_dtype("auto", "cpu"),
        "matmul": rate,
        "ratio_matmul_fp32_over_bf16": rate["fp32_gflops"] / rate["bf16_gflops"],
        "trainer": {
            "batch": shape,
            "step_s": med["trainer"],
            "step_s_all": trainer,
            "tokens_per_s": {d: shape["tokens"] / med["trainer"][d] for d in DTYPES},
        },
        "ratio_trainer_fp32_over_bf16": med["trainer"]["bfloat16"] / med["trainer"]["float32"],
        "engine": {
            "episodes": episodes,
            "processed_tokens_per_s": med["engine"],
            "processed_tokens_per_s_all": engine,
        },
        "ratio_engine_fp32_over_bf16": med["engine"]["float32"] / med["engine"]["bfloat16"],
    }


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--episodes", type=int, default=32, help="workload episodes replayed")
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--json", action="store_true", help="print the JSON only")
    p.add_argument("--out", default="", help="also write the record (results/dtype_cpu.json)")
    args = p.parse_args(argv)
    result = run_dtype_benchmark(args.repeats, args.threads, args.episodes, args.model)
    if args.out:
        from provrl.bench.results import write_script_result

        write_script_result(args.out, "dtype", result, args)
    print(json.dumps(result) if args.json else json.dumps(result, indent=1))

"""What giving KV pages back saves: the engine's resident memory over a long replay.

``python benchmarks/kv_memory.py --json --out results/kv_memory.json`` replays the shipped
workload fixture (:mod:`provrl.bench.workload`: real agent episodes turn by turn), cycled to
``--episodes`` episodes so that every KV slot serves many episodes of different lengths in
turn, as in an RL stage, on a fresh :class:`~provrl.engine.local.LocalEngine` in a child
process per arm and repeat (interleaved; medians reported):

* ``release`` — ``engine.kv_release: true`` (the default): a freed slot's pages, and those
  past a shorter context swapped in, go back to the OS (:mod:`provrl.engine.pages`);
* ``keep`` — ``engine.kv_release: false``: a slot keeps every page it once wrote, so it
  holds as much as the longest context it ever served;
* ``huge`` — ``release`` with ``engine.kv_huge_pages: true``: the kernel's 2 MiB transparent
  huge pages, as NumPy asks for them, where the default advises 4 KiB pages (a first write
  commits and zeroes a whole huge page, and releases split them).

Each child reports its resident set size once the engine is built and warm
(``rss_start_mb``), the kernel's high-water mark ``VmHWM`` over the replay, reset at its start
(``rss_peak_mb``; Linux, as the trainer benchmark measures its peak) and
their difference (``kv_growth_mb``: what the KV cache came to hold), with the replay's wall
time and processed tokens/s (the syscalls' cost). ``kv_allocated_mb`` is the whole slot
array, what ``keep`` tends to over a long run. Tokens and logprobs do not depend on the arm
(tests/engine/test_pages.py).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from typing import Any

ARMS = {"release": (True, False), "keep": (False, False), "huge": (True, True)}
"""arm → (engine.kv_release, engine.kv_huge_pages)"""


def child(arm: str, model: str, episodes: int, threads: int, dtype: str) -> dict[str, Any]:
    """One arm in this process: build the engine, replay, report memory and speed."""
    release, huge = ARMS[arm]
    import torch

    from provrl.bench.replay import replay_on_engine, tool_waits
    from provrl.bench.trainer import _status_mib, reset_peak_rss
    from provrl.bench.workload import FIXTURE, read_workload, take, token_counts
    from provrl.engine.config import EngineConfig
    from provrl.engine.local import LocalEngine
    from provrl.models.loading import load_model

    torch.set_num_threads(threads)
    eps, header = read_workload(FIXTURE)
    eps = take(eps, episodes)
    conc = int(header.get("concurrency") or 32)
    lm = load_model(model)
    cfg = EngineConfig(max_seqs=conc, max_context=max(map(len, eps)) + 8, eos_stops=False,
                       dtype=dtype, threads=threads, kv_release=release,  # type: ignore[arg-type]
                       kv_huge_pages=huge)  # fmt: skip
    with LocalEngine(lm, cfg) as engine:
        replay_on_engine(engine, eps[:1], 1, [[0.0] * len(eps[0].turns)], tag="warm")
        reset_peak_rss()  # the kernel's high-water mark VmHWM restarts from here
        start = _status_mib("VmRSS")
        run = replay_on_engine(engine, eps, conc, tool_waits(eps, "none"), seed=0, tag="m")
        peak = _status_mib("VmHWM")
        kv_bytes = engine.kv.k.numel() * engine.kv.k.element_size() * 2
    counts = token_counts(eps)
    return {
        "rss_start_mb": start,
        "rss_peak_mb": peak,
        "kv_growth_mb": peak - start,
        "kv_allocated_mb": kv_bytes / 2**20,
        "wall_s": run.wall_s,
        "processed_tokens_per_s": counts["processed"] / run.wall_s,
        "episodes": len(eps),
        "concurrency": conc,
        "max_context": cfg.max_context,
        "dtype": str(engine.weights_dtype).removeprefix("torch."),
    }


def run_kv_memory_benchmark(
    repeats: int = 2, episodes: int = 128, threads: int = 2, dtype: str = "auto",
    model: str = "smollm2-135m",
) -> dict[str, Any]:  # fmt: skip
    """Both arms, ``repeats`` times each, interleaved, in fresh child processes."""
    runs: dict[str, list[dict[str, Any]]] = {a: [] for a in ARMS}
    for r in range(repeats):
        for arm in ARMS if r % 2 == 0 else reversed(ARMS):
            argv = [sys.executable, "-m", "provrl.bench.kv_memory", "--child", arm,
                    "--episodes", str(episodes), "--threads", str(threads), "--dtype", dtype,
                    "--model", model]  # fmt: skip
            out = subprocess.run(argv, check=True, capture_output=True, text=True).stdout
            runs[arm].append(json.loads(out.strip().splitlines()[-1]))
    keys = ("rss_start_mb", "rss_peak_mb", "kv_growth_mb", "wall_s", "processed_tokens_per_s")
    med = {a: {k: statistics.median(x[k] for x in rows) for k in keys} for a, rows in runs.items()}
    first = runs["release"][0]
    return {
        "workload": "fixture",
        "episodes": episodes,
        "concurrency": first["concurrency"],
        "max_context": first["max_context"],
        "dtype": first["dtype"],
        "threads": threads,
        "kv_allocated_mb": first["kv_allocated_mb"],
        **{arm: med[arm] for arm in ARMS},
        "runs": runs,
        "kv_growth_saved_mb": med["keep"]["kv_growth_mb"] - med["release"]["kv_growth_mb"],
        "rss_peak_saved_mb": med["keep"]["rss_peak_mb"] - med["release"]["rss_peak_mb"],
        "kv_growth_saved_vs_huge_mb": med["huge"]["kv_growth_mb"] - med["release"]["kv_growth_mb"],
        "ratio_speed_release_over_keep": _speed_ratio(runs["release"], runs["keep"]),
        "ratio_speed_release_over_huge": _speed_ratio(runs["release"], runs["huge"]),
    }


def _speed_ratio(a: list[dict[str, Any]], b: list[dict[str, Any]]) -> float:
    """Median over repeats of the tokens/s ratio of two arms run side by side."""
    return statistics.median(
        x["processed_tokens_per_s"] / y["processed_tokens_per_s"] for x, y in zip(a, b, strict=True)
    )


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--episodes", type=int, default=128, help="fixture episodes, cycled")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16"])
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--child", choices=list(ARMS), help=argparse.SUPPRESS)
    p.add_argument("--json", action="store_true", help="print the JSON only")
    p.add_argument("--out", default="", help="also write the record (results/kv_memory.json)")
    args = p.parse_args(argv)
    if args.child:
        res = child(args.child, args.model, args.episodes, args.threads, args.dtype)
        print(json.dumps(res))
        return
    t0 = time.perf_counter()
    result = run_kv_memory_benchmark(args.repeats, args.episodes, args.threads, args.dtype, args.model)  # fmt: skip
    result["bench_wall_s"] = time.perf_counter() - t0
    if args.out:
        from provrl.bench.results import write_script_result

        write_script_result(args.out, "kv_memory", result, args)
    print(json.dumps(result) if args.json else json.dumps(result, indent=1))


if __name__ == "__main__":
    main(sys.argv[1:])

"""Where the engine's time goes on the replayed agent workload: ``torch.profiler`` over one
replay (``benchmarks/engine_profile.py``; issue 33 §2).

The workload is replayed twice on one :class:`~provrl.engine.LocalEngine` (after a warm-up
episode): once plain, for the wall time, and once under the profiler (every thread: the
engine's scheduler thread runs every forward). For the profiled pass the engine's four
phases are wrapped, from outside, in ``record_function`` ranges — nothing in the engine
changes::

    provrl.plan      Scheduler.plan: admit, prefix reuse, KV packing, build the step inputs
    provrl.forward   LocalEngine._forward: the model over the step's rows → logits
    provrl.sample    provrl.engine.sampling.sample: temperature / top-k / top-p, the draw
    provrl.apply     Scheduler.apply: append tokens and stamps, end turns, resolve futures

Each profiled op's *self* time is charged to the innermost phase around it, and within the
forward to a kind of work by op name (:data:`KINDS`: GEMM, attention, KV writes, copies
and casts, norms and activations, the rest); a phase's own self time — the time inside it that no op accounts for — is the
Python (and dispatcher) overhead of that phase. Written to ``out_dir``:

* ``summary.json`` — wall times (plain and profiled: the profiler's own cost), steps,
  per-step seconds of each phase, the forward split by kind, Python overhead per step;
* ``ops.txt`` — the per-op table (``key_averages``, self CPU time, top ``row_limit``);
* ``ops.json`` — the same rows as JSON (name, calls, self and total seconds);
* ``trace.json`` — the Chrome trace (``trace=True`` only: it is large).
"""

from __future__ import annotations

import contextlib
import json
import time
from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import torch
from torch.profiler import ProfilerActivity, profile, record_function

from provrl.bench.replay import replay_on_engine, tool_waits
from provrl.bench.workload import FIXTURE, read_workload, take, token_counts
from provrl.engine import local as local_engine
from provrl.engine.config import EngineConfig
from provrl.engine.local import LocalEngine
from provrl.models.loading import load_model
from provrl.models.precision import resolve_dtype

PHASES = ("plan", "forward", "sample", "apply")
KINDS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("gemm", ("aten::mm", "aten::addmm", "aten::linear")),
    ("attention", ("aten::bmm", "softmax", "scaled_dot_product", "attention")),
    ("kv_write", ("aten::index_put", "aten::_index_put")),
    ("copy_cast", ("aten::copy_", "aten::_to_copy", "aten::to", "aten::clone")),
    ("norm_rope_act", ("aten::rsqrt", "aten::pow", "aten::mean", "aten::silu")),
    ("norm_rope_act", ("aten::mul", "aten::add", "aten::neg", "aten::cat")),
)
"""Kinds of forward work, matched in order: an ``aten::x`` name matches ``aten::x`` and its
variants (``aten::x_``, ``aten::x_impl_``, ``aten::x.out``), any other needle a substring of
the op name; the rest is ``other``."""


def _matches(op: str, needle: str) -> bool:
    if not needle.startswith("aten::"):
        return needle in op
    return op == needle or (op.startswith(needle) and op[len(needle)] in "_.")


def kind_of(op: str) -> str:
    """The kind of forward work an op name belongs to (:data:`KINDS`, else ``other``)."""
    for kind, needles in KINDS:
        if any(_matches(op, n) for n in needles):
            return kind
    return "other"


def _labelled(fn: Callable[..., Any], name: str) -> Callable[..., Any]:
    def run(*args: Any, **kwargs: Any) -> Any:
        with record_function(name):
            return fn(*args, **kwargs)

    return run


@contextlib.contextmanager
def phase_ranges(engine: LocalEngine) -> Iterator[None]:
    """Wrap the engine's phases in ``provrl.<phase>`` ranges (module docstring) while the
    block runs; the engine's own attributes are restored afterwards."""
    sched = engine._sched
    patched = [(engine, "_forward"), (sched, "plan"), (sched, "apply")]
    for obj, attr in patched:
        setattr(obj, attr, _labelled(getattr(obj, attr), f"provrl.{attr.strip('_')}"))
    sample = local_engine.sample
    local_engine.sample = _labelled(sample, "provrl.sample")  # type: ignore[assignment]
    try:
        yield
    finally:
        local_engine.sample = sample  # type: ignore[assignment]
        for obj, attr in patched:
            delattr(obj, attr)  # the instance attribute shadowed the method: drop it


def breakdown(events: Sequence[Any]) -> dict[str, dict[str, float]]:
    """Seconds of self time per phase and kind: ``{phase: {kind: s}}`` where a phase's
    ``python`` entry is the range's own self time and ops outside every phase go to
    ``outside`` (``events``: the profiler's FunctionEvents)."""
    out: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for e in events:
        name, self_s = e.name, e.self_cpu_time_total / 1e6
        if name.startswith("provrl."):
            out[name.removeprefix("provrl.")]["python"] += self_s
            continue
        parent, phase = e.cpu_parent, "outside"
        while parent is not None:
            if parent.name.startswith("provrl."):
                phase = parent.name.removeprefix("provrl.")
                break
            parent = parent.cpu_parent
        out[phase][kind_of(name) if phase == "forward" else "ops"] += self_s
    return {p: dict(k) for p, k in out.items()}


def profile_workload(
    out_dir: str | Path,
    workload: str = "fixture",
    model: str = "smollm2-135m",
    *,
    episodes: int = 0,
    concurrency: int = 0,
    dtype: str = "auto",
    threads: int = 1,
    tool_latency: str = "none",
    device: str = "cpu",
    row_limit: int = 40,
    trace: bool = False,
) -> dict[str, Any]:
    """Profile one replay of ``workload`` on the local engine and write the files of the
    module docstring to ``out_dir``; returns the summary."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    eps, header = read_workload(FIXTURE if workload == "fixture" else workload)
    eps = take(eps, episodes)
    conc = concurrency or int(header.get("concurrency") or 32)
    waits = tool_waits(eps, tool_latency)
    if threads:
        torch.set_num_threads(threads)
    lm = load_model(model)
    cfg = EngineConfig(max_seqs=conc, max_context=max(map(len, eps)) + 8, eos_stops=False,
                       dtype=dtype, threads=threads, device=device)  # type: ignore[arg-type]  # fmt: skip
    with LocalEngine(lm, cfg) as engine:
        replay_on_engine(engine, eps[:1], 1, waits[:1], tag="warm")
        plain = replay_on_engine(engine, eps, conc, waits, seed=0, tag="plain")
        activities = [ProfilerActivity.CPU]
        if cfg.device.startswith("cuda"):
            activities.append(ProfilerActivity.CUDA)
        all_threads = torch._C._profiler._ExperimentalConfig(profile_all_threads=True)
        with phase_ranges(engine), profile(activities=activities, record_shapes=True,
                                           experimental_config=all_threads) as prof:  # fmt: skip
            t0 = time.perf_counter()
            run = replay_on_engine(engine, eps, conc, waits, seed=0, tag="prof")
            wall = time.perf_counter() - t0
    steps = max(run.engine["steps"], 1.0)
    parts = breakdown(prof.events())
    per_step = {p: {k: s / steps for k, s in kinds.items()} for p, kinds in parts.items()}
    averages = prof.key_averages()
    rows = sorted(averages, key=lambda a: a.self_cpu_time_total, reverse=True)[:row_limit]
    ops = [{"name": a.key, "calls": a.count, "self_s": a.self_cpu_time_total / 1e6,
            "total_s": a.cpu_time_total / 1e6} for a in rows]  # fmt: skip
    (out / "ops.json").write_text(json.dumps(ops, indent=1) + "\n")
    (out / "ops.txt").write_text(
        averages.table(sort_by="self_cpu_time_total", row_limit=row_limit) + "\n"
    )
    if trace:
        prof.export_chrome_trace(str(out / "trace.json"))
    forward = parts.get("forward", {})
    summary: dict[str, Any] = {
        "workload": str(workload),
        "model": model,
        "dtype": resolve_dtype(dtype, device),
        "threads": threads,
        "concurrency": conc,
        "tokens": token_counts(eps),
        "wall_s_plain": plain.wall_s,
        "wall_s_profiled": wall,
        "steps": run.engine["steps"],
        "busy_s": run.engine["busy_s"],
        "batch_occupancy": run.engine["tokens_generated"] / steps,
        "seconds": parts,
        "seconds_per_step": per_step,
        "python_s_per_step": sum(k.get("python", 0.0) for k in parts.values()) / steps,
        "forward_share_by_kind": {
            k: s / max(sum(forward.values()), 1e-12) for k, s in forward.items()
        },
        "top_ops": ops[:10],
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    return summary


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """``python benchmarks/engine_profile.py [--out-dir DIR] [--workload …] [--model …] …``"""
    import argparse

    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--out-dir", default="runs/engine-profile",
                    help="folder for summary.json, ops.txt, ops.json (trace.json)")  # fmt: skip
    ap.add_argument("--workload", default="fixture", help="'fixture', a workload file or a trajectory log")  # fmt: skip
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--episodes", type=int, default=0, help="0 = all; more cycles the workload")
    ap.add_argument("--concurrency", type=int, default=0, help="0 = the workload's own")
    ap.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16", "float16"])
    ap.add_argument("--threads", type=int, default=1, help="torch threads of the engine")
    ap.add_argument("--tool-latency", default="none", help="none, recorded, web-fast, web-ai, web-serp")  # fmt: skip
    ap.add_argument("--device", default="cpu", help="torch device of the engine (cuda: CUDA ops profiled too)")  # fmt: skip
    ap.add_argument("--row-limit", type=int, default=40, help="ops in ops.txt / ops.json")
    ap.add_argument("--trace", action="store_true", help="also write the Chrome trace")
    ap.add_argument("--json", action="store_true", help="print the summary on one line")
    ap.add_argument("--out", default=None,
                    help="also write the summary as a results record here (commit, machine, "
                    "command, config): the file docs quote")  # fmt: skip
    a = ap.parse_args(argv)
    summary = profile_workload(a.out_dir, a.workload, a.model, episodes=a.episodes,
                               concurrency=a.concurrency, dtype=a.dtype, threads=a.threads,
                               tool_latency=a.tool_latency, device=a.device, row_limit=a.row_limit,
                               trace=a.trace)  # fmt: skip
    if a.out:
        from provrl.bench.results import write_script_result

        write_script_result(a.out, "engine_profile", summary, a)
    print(json.dumps(summary, indent=None if a.json else 1))
    return summary

"""``provrl bench engine --workload FILE``: replay recorded agent episodes on the engine.

Each episode (:mod:`provrl.bench.workload`) is replayed as the agent loop ran it, on
``concurrency`` agent threads::

    submit(prompt, max_new_tokens = n_0)                    sample exactly n_0 tokens
    for each later turn t:  wait the tool's seconds (optional), then
        submit_continue(tool result ids, max_new_tokens = n_t)   exactly n_t tokens
    release

No stop ids or stop strings, so every turn samples exactly its recorded number of tokens
(temperature 1: the ids differ from the recording, the lengths and the contexts do not).
Arms, in the same process and interleaved per repeat (medians reported):

* ``engine`` — :class:`~provrl.engine.LocalEngine`, one replica, its prefix cache on;
* ``hf`` (the floor) — HF ``generate`` as a plain agent loop would batch it: waves of
  ``concurrency`` episodes, turn by turn, each turn a left-padded batch that re-prefills
  the whole context (no KV kept between turns) and samples max n_t tokens (each row keeps
  its own n_t);
* ``vllm`` (``backend=vllm``, the peer) — :class:`~provrl.engine.vllm_backend.VLLMEngine`
  through the same replay, when vLLM is importable; otherwise the result says why not.

Every arm is charged the same work, the workload's own token counts: *processed* tokens =
every context token plus every sampled token (:func:`~provrl.bench.workload.token_counts`);
a prefix-cache hit is work the engine did not have to redo, so it counts as speed. Also
reported: sampled tokens/s, episodes/s, time per turn (submit → turn done, tool wait
excluded), mean sampled rows per engine step (batch occupancy), the share of context tokens
served from the prefix cache, and the fraction of the matmul rate at the model's MLP shape
measured in the same run, in the faster of bf16 and fp32 on this device (bf16 with bf16
matrix units, fp32 on a CPU without AMX): the workload's weight-matmul FLOPs
(:func:`workload_flop`) per second over the matmul's peak FLOP/s
(:mod:`provrl.bench.roofline`), probed before the engines start and before each repeat.
"""

from __future__ import annotations

import contextlib
import statistics
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from provrl.bench.roofline import PEAK_QUANTILE, matmul_rates, roofline
from provrl.bench.workload import (
    FIXTURE,
    Episode,
    WorkloadError,
    read_workload,
    shape_stats,
    take,
    token_counts,
)
from provrl.engine.api import Engine, EngineError
from provrl.engine.config import EngineConfig
from provrl.engine.llama import LlamaShape
from provrl.engine.local import DTYPES, LocalEngine
from provrl.models.loading import load_model
from provrl.models.precision import resolve_dtype
from provrl.provenance import SamplingParams

TOOL_LATENCY = ("none", "recorded", "web-fast", "web-ai", "web-serp")
"""How long a replayed tool call waits: not at all, the recorded seconds, or a draw from
the search-latency model of that preset (:mod:`provrl.env.latency`)."""
COUNTERS = ("steps", "tokens_generated", "prefill_tokens", "prefix_hit_tokens", "busy_s")


@dataclass
class ArmRun:
    """One arm's replay of the whole workload."""

    wall_s: float
    sampled: int
    """Tokens the arm sampled (must equal the workload's action tokens)."""
    turn_s: list[float] = field(default_factory=list)
    engine: dict[str, float] = field(default_factory=dict)
    """Engine counters over the run (:data:`COUNTERS`), where the engine has them."""


def tool_waits(episodes: Sequence[Episode], mode: str, seed: int = 0) -> list[list[float]]:
    """Seconds each turn waits for its tool (turn 0: none), the same table for every arm."""
    if mode not in TOOL_LATENCY:
        raise WorkloadError(f"tool_latency {mode!r}: expected one of {', '.join(TOOL_LATENCY)}")
    if mode in ("none", "recorded"):
        return [[t.tool_s if (j and mode == "recorded") else 0.0 for j, t in enumerate(ep.turns)]
                for ep in episodes]  # fmt: skip
    from provrl.env.config import LatencyConfig
    from provrl.env.latency import draw

    cfg = LatencyConfig.model_validate({"preset": mode, "seed": seed})
    rng = np.random.default_rng(seed)
    return [[0.0, *draw(cfg, rng, len(ep.turns) - 1).tolist()] for ep in episodes]


def _counters(engine: Engine) -> dict[str, float]:
    s = engine.stats()
    return {k: float(s.get(k, float("nan"))) for k in COUNTERS}


def replay_on_engine(
    engine: Engine,
    episodes: Sequence[Episode],
    concurrency: int,
    waits: Sequence[Sequence[float]],
    *,
    seed: int = 0,
    tag: str = "w",
) -> ArmRun:
    """Replay ``episodes`` on ``engine`` with ``concurrency`` agent threads (module
    docstring); a turn that does not sample exactly its recorded length is an error."""

    def one(i: int) -> tuple[int, list[float]]:
        ep, rid, times, n = episodes[i], f"{tag}-{i}", [], 0
        try:
            for j, turn in enumerate(ep.turns):
                if waits[i][j] > 0:
                    time.sleep(waits[i][j])
                sp = SamplingParams(max_new_tokens=turn.action_len, seed=seed + 64 * i + j)
                t = time.perf_counter()
                fut = (engine.submit(turn.context, sp, request_id=rid) if j == 0
                       else engine.submit_continue(rid, turn.context, sp))  # fmt: skip
                out = fut.result()
                times.append(time.perf_counter() - t)
                if len(out.token_ids) != turn.action_len:
                    raise WorkloadError(
                        f"episode {ep.episode_id!r} turn {j}: sampled {len(out.token_ids)} "
                        f"tokens, recorded {turn.action_len} ({out.finish_reason}: {out.error})"
                    )
                n += turn.action_len
        finally:
            with contextlib.suppress(EngineError):  # a refused first turn left no request
                engine.release(rid)
        return n, times

    c0 = _counters(engine)
    t0 = time.perf_counter()
    with ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="replay") as pool:
        done = list(pool.map(one, range(len(episodes))))
    wall = time.perf_counter() - t0
    c1 = _counters(engine)
    return ArmRun(
        wall,
        sum(n for n, _ in done),
        [t for _, ts in done for t in ts],
        {k: c1[k] - c0[k] for k in COUNTERS},
    )


@torch.no_grad()
def replay_on_hf(
    model: Any,
    pad_id: int,
    episodes: Sequence[Episode],
    concurrency: int,
    waits: Sequence[Sequence[float]],
) -> ArmRun:
    """The floor: HF ``generate`` in waves of ``concurrency`` episodes, turn by turn, each
    turn re-prefilling the whole context (module docstring)."""
    dev = model.device
    sampled, times = 0, []
    t0 = time.perf_counter()
    for w0 in range(0, len(episodes), concurrency):
        wave = list(range(w0, min(w0 + concurrency, len(episodes))))
        ctx: dict[int, list[int]] = {i: [] for i in wave}
        for j in range(max(len(episodes[i].turns) for i in wave)):
            rows = [i for i in wave if j < len(episodes[i].turns)]
            time.sleep(max(waits[i][j] for i in rows))  # the batch waits for its slowest tool
            for i in rows:
                ctx[i].extend(episodes[i].turns[j].context)
            width = max(len(ctx[i]) for i in rows)
            n = max(episodes[i].turns[j].action_len for i in rows)
            ids = torch.tensor(
                [[pad_id] * (width - len(ctx[i])) + ctx[i] for i in rows], device=dev
            )
            mask = (torch.arange(width, device=dev) >= width - torch.tensor(
                [len(ctx[i]) for i in rows], device=dev)[:, None]).long()  # fmt: skip
            t = time.perf_counter()
            out = model.generate(input_ids=ids, attention_mask=mask, do_sample=True,
                                 temperature=1.0, top_k=0, top_p=1.0, max_new_tokens=n,
                                 min_new_tokens=n, pad_token_id=pad_id)  # fmt: skip
            times.extend([time.perf_counter() - t] * len(rows))
            for r, i in enumerate(rows):
                k = episodes[i].turns[j].action_len
                ctx[i].extend(out[r, width : width + k].tolist())
                sampled += k
    return ArmRun(time.perf_counter() - t0, sampled, times)


def workload_flop(shape: LlamaShape, counts: dict[str, int]) -> float:
    """Weight-matmul FLOPs of a replay: every fed position through the layers,
    2·(params − embedding − untied head) each — the embedding is a lookup; the last sampled
    token of an episode is never fed — plus the LM head, 2·V·D, for the row of each sampled
    token. Attention's own FLOPs (q·Kᵀ, p·V) are left out, so the fraction is a lower bound."""
    head = shape.vocab_size * shape.hidden
    body = shape.n_params - head * (1 if shape.tied else 2)
    fed = counts["processed"] - counts["episodes"]
    return 2.0 * (body * fed + head * counts["action"])


def arm_figures(run: ArmRun, counts: dict[str, int], flop: float, gflops: float) -> dict[str, float]:  # fmt: skip
    """An arm's figures: tokens/s, episodes/s, time per turn, the fraction of the matmul
    rate, and where the arm counts them, occupancy, cache share and busy share (module
    docstring)."""
    tps = counts["processed"] / run.wall_s
    turns = np.asarray(run.turn_s)
    out = {
        "wall_s": run.wall_s,
        "processed_tokens_per_s": tps,
        "generated_tokens_per_s": counts["action"] / run.wall_s,
        "episodes_per_s": counts["episodes"] / run.wall_s,
        "turn_s_mean": float(turns.mean()),
        "turn_s_p50": float(np.median(turns)),
        "turn_s_p90": float(np.quantile(turns, 0.9)),
        "matmul_fraction": flop / run.wall_s / (gflops * 1e9),
    }
    e = {k: v for k, v in run.engine.items() if np.isfinite(v)}  # what the engine counts
    if e.get("steps"):
        out["batch_occupancy"] = e["tokens_generated"] / e["steps"]
    if "prefix_hit_tokens" in e:
        out["prefix_hit_share"] = e["prefix_hit_tokens"] / counts["context"]
    if "busy_s" in e:
        out["busy_share"] = e["busy_s"] / run.wall_s
    return out


def _medians(rows: list[dict[str, float]]) -> dict[str, float]:
    return {k: float(statistics.median(r[k] for r in rows if k in r)) for k in rows[0]}


def _vllm(lm: Any, cfg: EngineConfig, threads: int, compile: bool) -> tuple[Engine | None, str]:
    """The vLLM engine, or None and why not (not importable / failed to start)."""
    try:
        import vllm  # noqa: F401
    except Exception as e:  # ImportError, or a broken install's own error
        return None, f"vllm is not importable here: {e!r}"
    from provrl.engine.vllm_backend import VLLMEngine

    vcfg = cfg.model_copy(
        update={"backend": "vllm", "threads": threads or 1, "device": "cpu", "compile": compile}
    )
    try:
        return VLLMEngine(lm, vcfg), ""
    except Exception as e:
        return None, f"vLLM did not start: {e!r}"


def run_workload_benchmark(
    workload: str,
    model: str = "smollm2-135m",
    concurrency: int = 0,
    episodes: int = 0,
    repeats: int = 3,
    threads: int = 1,
    dtype: str = "auto",
    tool_latency: str = "none",
    hf: bool = True,
    backend: str = "local",
    vllm_compile: bool = False,
    device: str = "cpu",
    seed: int = 0,
    progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Replay ``workload`` (a workload file or a trajectory log) on every arm and return the
    JSON-able result (module docstring). ``concurrency`` 0 = the workload's own (32 when it
    does not say), ``episodes`` 0 = all of them, else the first ``episodes``."""
    say = progress or (lambda _msg: None)
    eps, header = read_workload(FIXTURE if workload == "fixture" else workload)
    eps = take(eps, episodes)
    if not eps:
        raise WorkloadError(f"{workload}: no episodes to replay")
    conc = concurrency or int(header.get("concurrency") or 32)
    counts = token_counts(eps)
    waits = tool_waits(eps, tool_latency, seed)
    if threads:
        torch.set_num_threads(threads)
    if model == "tiny-h32":
        from provrl.bench.engine import vllm_tiny_model

        lm = vllm_tiny_model()
    else:
        lm = load_model(model)
    lm.model.to(device)
    dtype = resolve_dtype(dtype, device)  # auto: the device's fast dtype, as the presets
    cfg = EngineConfig(max_seqs=conc, max_context=max(map(len, eps)) + 8, eos_stops=False,
                       dtype=dtype, device=device, threads=threads)  # type: ignore[arg-type]  # fmt: skip
    mc = LlamaShape.from_config(lm.model.config)
    mm_shape = (256, mc.hidden, 2 * mc.intermediate)  # the MLP's fused gate|up
    probes: dict[str, dict[str, list[float]]] = {"bf16": {}, "fp32": {}}

    def probe(when: str) -> None:
        say(f"matmul rate ({when})")
        for key, dt in (("bf16", torch.bfloat16), ("fp32", torch.float32)):
            probes[key][when] = matmul_rates(*mm_shape, dtype=dt, device=device)

    probe("before the engines")
    engine = LocalEngine(lm, cfg)
    shape = engine.shape
    flop = workload_flop(shape, counts)
    vllm, why_not = (None, "")
    if backend == "vllm":
        say("starting vLLM")
        vllm, why_not = _vllm(lm, cfg, threads, vllm_compile)
    lm.model.to(DTYPES[dtype])  # the floor runs in the engine's dtype
    pad = lm.tokenizer.pad_token_id if lm.tokenizer.pad_token_id is not None else 0
    say("warm-up")
    warm = [eps[0]]
    replay_on_engine(engine, warm, 1, [[0.0] * len(eps[0].turns)], tag="warm")
    arms: dict[str, Callable[[int], ArmRun]] = {
        "engine": lambda r: replay_on_engine(engine, eps, conc, waits, seed=1000 * r, tag=f"e{r}")
    }
    if hf:
        replay_on_hf(lm.model, pad, warm, 1, [[0.0] * len(eps[0].turns)])
        arms["hf"] = lambda r: replay_on_hf(lm.model, pad, eps, conc, waits)
    if vllm is not None:
        replay_on_engine(vllm, warm, 1, [[0.0] * len(eps[0].turns)], tag="warm")
        arms["vllm"] = lambda r: replay_on_engine(vllm, eps, conc, waits, seed=1000 * r, tag=f"v{r}")  # fmt: skip
    per_arm_runs: dict[str, list[ArmRun]] = {a: [] for a in arms}
    for r in range(repeats):
        probe(f"repeat {r + 1}")
        order = list(arms) if r % 2 == 0 else list(reversed(arms))
        for name in order:
            say(f"repeat {r + 1}/{repeats}: {name}")
            run = arms[name](r)
            if run.sampled != counts["action"]:
                raise WorkloadError(f"{name}: sampled {run.sampled} tokens, expected {counts['action']}")  # fmt: skip
            per_arm_runs[name].append(run)
    # the roofline is the faster matmul dtype of this device (bf16 with bf16 matrix units,
    # fp32 on a CPU without AMX: provrl/models/precision.py), at its peak over the run
    peaks = {key: roofline([x for r in rates.values() for x in r])["peak"]
             for key, rates in probes.items()}  # fmt: skip
    gflops = max(peaks.values())
    per_arm = {a: [arm_figures(run, counts, flop, gflops) for run in runs]
               for a, runs in per_arm_runs.items()}  # fmt: skip
    engine.close()
    if vllm is not None:
        vllm.close()
    result: dict[str, Any] = {
        "workload": str(workload),
        "workload_source": header.get("source", {}),
        "workload_differs_from_real": header.get("differs_from_real", []),
        "model": model,
        "backend": backend,
        "device": device,
        "dtype": dtype,
        "threads": torch.get_num_threads(),
        "concurrency": conc,
        "tool_latency": tool_latency,
        "repeats": repeats,
        "tokens": counts,
        "shape": shape_stats(eps),
        "params": shape.n_params,
        "workload_gflop": flop / 1e9,
        "gflop_per_processed_token": flop / 1e9 / counts["processed"],
        "matmul_shape": list(mm_shape),
        **{f"{key}_matmul_gflops": peaks[key] for key in probes},
        **{
            f"{key}_matmul_probes": {w: roofline(r) for w, r in rates.items()}
            for key, rates in probes.items()
        },
        "matmul_gflops": gflops,
        "matmul_fraction_of": f"the peak (p{round(100 * PEAK_QUANTILE)} of per-call rates) "
        "of the faster of bf16 and fp32 over every probe of the run: one before any engine "
        "starts, one before each repeat",
    }
    for name, rows in per_arm.items():
        result[name] = {**_medians(rows), "all": rows}
    if "hf" in per_arm:
        result["ratio_engine_vs_hf"] = statistics.median(
            e["processed_tokens_per_s"] / h["processed_tokens_per_s"]
            for e, h in zip(per_arm["engine"], per_arm["hf"], strict=True)
        )
    if "vllm" in per_arm:
        result["ratio_engine_vs_vllm"] = statistics.median(
            e["processed_tokens_per_s"] / v["processed_tokens_per_s"]
            for e, v in zip(per_arm["engine"], per_arm["vllm"], strict=True)
        )
    elif backend == "vllm":
        result["vllm_skipped"] = why_not
    return result

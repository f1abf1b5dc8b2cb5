"""``provrl bench engine`` (``benchmarks/engine.py``): the rollout engine vs HF generate.

Everything is measured in one process, interleaved, so the shared CPU's load hits the
peer and us alike; figures are medians over repeats and the headline ratio is the median
of per-repeat ratios:

* throughput: ``concurrency`` chat prompts, each sampling exactly ``new_tokens`` tokens at
  temperature 1 (EOS not a stop), through HF ``generate`` (left-padded batch, KV cache,
  same model/dtype/threads) and through :class:`~provrl.engine.LocalEngine`; wall time
  includes prefill;
* roofline: tokens/s = (measured fp32 GFLOP/s of a square matmul) / (2 · params);
* every throughput also per CPU-second of this process (``*_cpu_*``): with one thread
  this is the work done, immune to the time other users hold the shared cores;
* exactness: the engine's recorded logprobs vs a teacher-forced HF forward;
* hot-load: keep-mode swaps while every request is in flight (median pause), a plain
  in-memory copy of the same weights for scale, dropped requests, and the KV-staleness
  audit (tokens after a swap recomputed from scratch under their version).

``backend="vllm"`` (``provrl bench engine --backend vllm``, run where vLLM is installed)
adds :class:`~provrl.engine.vllm_backend.VLLMEngine` on the same model and prompts to the
same interleaved repeats (``vllm_*`` fields, ``ratio_local_vs_vllm`` = local / vLLM per
repeat), its logprob mismatch against the same teacher forcing, its keep-mode hot-load
pause while every request is in flight, one drain and one recompute swap, dropped
requests, and the fraction of tokens whose kv_min / kept_mass it knows exactly. vLLM runs
in its own process: its per-CPU-second figure counts this process and its children.

Why one module of ~540 lines: the local engine, HF generate and vLLM are measured on the
same prompts, in the same interleaved repeats, against the same teacher forcing — the
shared helpers and the three sides live together so a change to one side's measurement is
visibly a change to all.
"""

from __future__ import annotations

import contextlib
import statistics
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from provrl.engine.api import Engine, TurnOutput
from provrl.engine.config import EngineConfig
from provrl.engine.local import LocalEngine
from provrl.engine.vllm_backend import VLLMEngine
from provrl.models.chat import chat_ids
from provrl.models.loading import LoadedModel, load_model, load_tokenizer, tiny_config
from provrl.provenance import SamplingParams
from provrl.train.logprobs import token_logprobs

QUESTIONS = (
    "Which river flows through the capital of the country where the Eiffel Tower stands?",
    "Name a composer who wrote symphonies and explain what a symphony is.",
    "What is the boiling point of water at sea level, and why does it change with altitude?",
    "Who painted the Mona Lisa, and in which museum can it be seen today?",
    "Explain in simple terms how a search engine ranks documents for a query.",
    "What are the three states of matter? Give an example of each.",
    "Which planet is known as the red planet and what makes it red?",
    "Summarise the plot of a famous novel about a white whale.",
)


def bench_prompts(tokenizer: Any, n: int) -> list[list[int]]:
    """``n`` chat prompts (the model's chat template, so they share its system prompt)."""
    return [
        chat_ids(tokenizer, [{"role": "user", "content": f"({i}) {QUESTIONS[i % len(QUESTIONS)]}"}])
        for i in range(n)
    ]


def vllm_tiny_model(seed: int = 0) -> Any:
    """The built-in ``tiny`` random Llama with 2 heads of 32 dims (1 KV head) instead of 4
    of 16: vLLM's CPU attention supports head sizes 32, 64, 80, … only. Same tokenizer,
    same hidden size; a :class:`~provrl.models.LoadedModel` named ``tiny-h32``."""
    from transformers import AutoModelForCausalLM

    tok = load_tokenizer("smollm2-135m")
    cfg = tiny_config(len(tok), tok.bos_token_id, tok.eos_token_id, tok.pad_token_id)
    cfg.head_dim, cfg.num_attention_heads, cfg.num_key_value_heads = 32, 2, 1
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model: Any = AutoModelForCausalLM.from_config(cfg)
    model.config.name_or_path = "tiny-h32"
    model.eval()
    return LoadedModel(model, tok, "tiny-h32", None, f"tiny-h32-seed{seed}")


def median(xs: Sequence[float]) -> float:
    return float(statistics.median(xs))


def matmul_gflops(n: int = 2048, device: str = "cpu") -> tuple[float, float]:
    """Measured fp32 GFLOP/s of an n×n×n matmul, per wall second and per CPU second of
    this process (medians over the same calls, :func:`provrl.bench.roofline.matmul_call_seconds`)."""
    from provrl.bench.roofline import gflops, matmul_call_seconds

    flop, calls = matmul_call_seconds(n, n, n, device=device, clock=time.process_time)
    return median([gflops(flop, w) for w, _ in calls]), median([gflops(flop, c) for _, c in calls])


@torch.no_grad()
def hf_generate(lm: Any, prompts: list[list[int]], new_tokens: int) -> tuple[int, float]:
    """(tokens, seconds) of HF ``generate`` sampling exactly ``new_tokens`` per prompt."""
    tok = lm.tokenizer
    width = max(len(p) for p in prompts)
    pad = tok.pad_token_id if tok.pad_token_id is not None else 0
    dev = lm.model.device
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts], device=dev)
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=dev)
    t = time.perf_counter()
    out = lm.model.generate(
        input_ids=ids,
        attention_mask=mask,
        do_sample=True,
        temperature=1.0,
        top_k=0,
        top_p=1.0,
        max_new_tokens=new_tokens,
        min_new_tokens=new_tokens,
        pad_token_id=pad,
    )
    dt = time.perf_counter() - t
    return int((out.shape[1] - width) * out.shape[0]), dt


def hf_generate_batch(lm: Any, prompts: list[list[int]], new_tokens: int) -> tuple[int, float]:
    """(tokens, seconds) of transformers' continuous-batching manager (``generate_batch``)."""
    from transformers import GenerationConfig

    gc = GenerationConfig(
        max_new_tokens=new_tokens,
        do_sample=True,
        temperature=1.0,
        top_k=0,
        top_p=1.0,
        eos_token_id=-1,
        pad_token_id=lm.tokenizer.pad_token_id,
    )
    t = time.perf_counter()
    res = lm.model.generate_batch(prompts, generation_config=gc, max_new_tokens=new_tokens)
    dt = time.perf_counter() - t
    return sum(len(r.generated_tokens) for r in res.values()), dt


def engine_run(
    engine: Engine, prompts: list[list[int]], new_tokens: int, seed: int
) -> tuple[list[TurnOutput], float]:
    """Submit every prompt at once; (outputs, seconds until the last one finished)."""
    t = time.perf_counter()
    futs = [
        engine.submit(p, SamplingParams(temperature=1.0, max_new_tokens=new_tokens, seed=seed + i))
        for i, p in enumerate(prompts)
    ]
    outs = [f.result() for f in futs]
    dt = time.perf_counter() - t
    for o in outs:
        engine.release(o.request_id)
    return outs, dt


@torch.no_grad()
def logprob_mismatch(lm: Any, prompts: list[list[int]], outs: list[TurnOutput]) -> float:
    """max |engine logprob − teacher-forced HF logprob| over the sampled tokens."""
    worst = 0.0
    for p, o in zip(prompts, outs, strict=True):
        ids = torch.tensor([p + o.token_ids], device=lm.model.device)
        ref = token_logprobs(lm.model, ids)[0, len(p) :].cpu()
        worst = max(worst, float((ref - torch.from_numpy(o.logprob)).abs().max()))
    return worst


def perturbed(state: dict[str, torch.Tensor], rel: float, seed: int) -> dict[str, torch.Tensor]:
    """W + rel · std(W) · ε for every tensor: a small, RL-update-sized weight change.
    (A tied ``lm_head.weight`` is ignored by the engine: the embedding is the head.)"""
    g = torch.Generator().manual_seed(seed)
    return {
        k: v + rel * v.float().std() * torch.randn(v.shape, generator=g, dtype=v.dtype)
        for k, v in state.items()
    }


def copy_ms(pairs: list[tuple[torch.Tensor, torch.Tensor]], repeats: int = 5) -> float:
    """A plain in-memory copy of the same tensors into fresh buffers (median ms)."""
    bufs = [torch.empty_like(dst) for dst, _ in pairs]
    for b, (_, src) in zip(bufs, pairs, strict=True):
        b.copy_(src)
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        for b, (_, src) in zip(bufs, pairs, strict=True):
            b.copy_(src)
        times.append(time.perf_counter() - t)
    return median(times) * 1e3


def hotload_phase(
    engine: LocalEngine,
    lm: Any,
    prompts: list[list[int]],
    new_tokens: int,
    swaps: int,
    rel: float,
    audits: int,
) -> dict[str, float]:
    """Keep-mode swaps while all requests are in flight (see the module docstring)."""
    sd_a = {k: v.detach().clone() for k, v in lm.model.state_dict().items()}
    sd_b = perturbed(sd_a, rel, seed=1)
    engine.cfg.audit_fraction = min(1.0, audits / max(len(prompts), 1))
    v0 = engine.version
    futs = [
        engine.submit(
            p, SamplingParams(temperature=1.0, max_new_tokens=new_tokens, seed=10_000 + i)
        )
        for i, p in enumerate(prompts)
    ]
    pauses = []
    for k in range(1, swaps + 1):
        steps = engine.stats()["steps"]
        while engine.stats()["steps"] < steps + 2 and not all(f.done() for f in futs):
            time.sleep(0.005)
        rep = engine.load_weights(sd_b if k % 2 else sd_a, v0 + k, "keep")
        pauses.append(rep.update_ms)
    outs, errors = [], 0
    for f in futs:
        try:
            outs.append(f.result())
        except Exception:
            errors += 1
    dropped = errors + sum(o.finish_reason != "length" for o in outs)
    for o in outs:
        engine.release(o.request_id)
    engine.wait_idle()  # the queued audits run
    s = engine.stats()
    pairs = engine.weights.match(sd_a)
    mixed = sum(int((o.version > o.kv_min).sum()) for o in outs)
    return {
        "hotload_update_ms": median(pauses),
        "hotload_update_ms_all": pauses,  # type: ignore[dict-item]
        "weight_copy_ms": copy_ms(pairs),
        "hotload_swaps": float(swaps),
        "hotload_perturbation_rel": rel,
        "dropped_requests": float(dropped),
        "tokens_with_older_kv": float(mixed),
        "kv_staleness_mean_abs": s["kv_staleness_mean_abs"],
        "kv_staleness_max_abs": s["kv_staleness_max_abs"],
        "kv_staleness_samples": s["kv_staleness_samples"],
        "kv_staleness_support_misses": s["kv_staleness_support_misses"],
    }


def tree_cpu_s() -> float:
    """CPU seconds of this process and all its children (vLLM's engine process), or NaN
    without psutil."""
    try:
        import psutil
    except ImportError:
        return float("nan")
    me = psutil.Process()
    total = 0.0
    for proc in [me, *me.children(recursive=True)]:
        with contextlib.suppress(psutil.Error):
            t = proc.cpu_times()
            total += t.user + t.system
    return total


def tied_perturbation(state: dict[str, torch.Tensor], rel: float, seed: int, tied: bool) -> dict[str, torch.Tensor]:  # fmt: skip
    """:func:`perturbed`, with a tied head kept equal to the embedding (what both engines
    use), so a teacher-forced model built from it is the model the engines run."""
    sd = perturbed(state, rel, seed)
    if tied and "lm_head.weight" in sd:
        sd["lm_head.weight"] = sd["model.embed_tokens.weight"]
    return sd


def vllm_hotload_phase(
    engine: Any, lm: Any, prompts: list[list[int]], new_tokens: int, swaps: int, rel: float
) -> dict[str, Any]:
    """Keep-mode swaps on the vLLM backend while every request is in flight (a swap every
    ≈ 2 decode steps), then one drain and one recompute swap with requests in flight."""
    sd_a = {k: v.detach().clone() for k, v in lm.model.state_dict().items()}
    sd_b = tied_perturbation(sd_a, rel, seed=1, tied=engine.tied)
    seen = [0]
    lock = threading.Lock()

    def on_token(_rid: str, _tok: int) -> None:
        with lock:
            seen[0] += 1

    def submit_all(seed0: int) -> list[Any]:
        sp = [SamplingParams(temperature=1.0, max_new_tokens=new_tokens, seed=seed0 + i)
              for i in range(len(prompts))]  # fmt: skip
        return [engine.submit(p, q, on_token=on_token) for p, q in zip(prompts, sp, strict=True)]

    def wait_tokens(n: int, futs: list[Any]) -> None:
        while seen[0] < n and not all(f.done() for f in futs):
            time.sleep(0.005)

    def collect(futs: list[Any]) -> tuple[list[TurnOutput], int]:
        outs, errors = [], 0
        for f in futs:
            try:
                outs.append(f.result())
            except Exception:
                errors += 1
        for o in outs:
            engine.release(o.request_id)
        return outs, errors + sum(o.finish_reason != "length" for o in outs)

    v = engine.version
    futs = submit_all(20_000)
    pauses, reloads, waits, stage = [], [], [], []
    for k in range(1, swaps + 1):
        wait_tokens(seen[0] + 2 * len(prompts), futs)
        t = time.perf_counter()
        rep = engine.load_weights(sd_b if k % 2 else sd_a, v + k, "keep")
        total = (time.perf_counter() - t) * 1e3
        s = engine.stats()
        pauses.append(rep.update_ms)
        reloads.append(s["hotload_reload_ms"])
        waits.append(s["hotload_pause_ms"])
        stage.append(total - rep.update_ms)
    outs, dropped = collect(futs)
    v += swaps
    known = [o.kv_min >= 0 for o in outs]
    mixed = sum(int(((o.version > o.kv_min) & kn).sum()) for o, kn in zip(outs, known, strict=True))
    unknown = sum(int((~kn).sum()) for kn in known)
    result: dict[str, Any] = {
        "vllm_hotload_update_ms": median(pauses),
        "vllm_hotload_update_ms_all": pauses,
        "vllm_hotload_reload_ms": median(reloads),
        "vllm_hotload_pause_wait_ms": median(waits),
        "vllm_weight_stage_ms": median(stage),
        "vllm_hotload_swaps": float(swaps),
        "vllm_dropped_requests": float(dropped),
        "vllm_tokens_with_older_kv": float(mixed),
        "vllm_kv_unknown_tokens_after_swaps": float(unknown),
    }
    for mode in ("drain", "recompute"):
        before = engine.stats()["resubmitted"]
        futs = submit_all(30_000 if mode == "drain" else 40_000)
        wait_tokens(seen[0] + 2 * len(prompts), futs)
        v += 1
        rep = engine.load_weights(sd_b if v % 2 else sd_a, v, mode)
        outs, dropped = collect(futs)
        result[f"vllm_{mode}_ms"] = rep.update_ms
        result[f"vllm_{mode}_dropped_requests"] = float(dropped)
        if mode == "recompute":
            result["vllm_recompute_resubmitted"] = engine.stats()["resubmitted"] - before
            result["vllm_recompute_tokens"] = float(rep.recomputed_tokens)
    return result


def run_engine_benchmark(
    model: str = "smollm2-135m",
    concurrency: int = 64,
    new_tokens: int = 128,
    repeats: int = 3,
    threads: int = 0,
    swaps: int = 5,
    hotload_tokens: int = 32,
    perturb: float = 1e-3,
    audits: int = 8,
    prefix_cache: bool = True,
    hf_continuous_batching: bool = False,
    backend: str = "local",
    vllm_compile: bool = False,
    device: str = "cpu",
    progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Run the whole benchmark and return the JSON-able result (``backend="vllm"``: also
    the vLLM backend, side by side; see the module docstring)."""
    say = progress or (lambda _msg: None)
    if backend not in ("local", "vllm"):
        raise ValueError(f"backend {backend!r}: expected 'local' or 'vllm'")
    if threads:
        torch.set_num_threads(threads)
    lm = vllm_tiny_model() if model == "tiny-h32" else load_model(model)
    lm.model.to(device)
    prompts = bench_prompts(lm.tokenizer, concurrency)
    cfg = EngineConfig(
        max_seqs=concurrency,
        max_context=max(len(p) for p in prompts) + max(new_tokens, hotload_tokens) + 8,
        eos_stops=False,
        prefix_cache=prefix_cache,
        device=device,
    )
    engine = LocalEngine(lm, cfg)
    params = engine.shape.n_params  # the tied embedding counted once
    vllm: Any = None
    vllm_start_s = 0.0
    if backend == "vllm":
        say("starting vLLM (minutes on a busy CPU)")
        t = time.perf_counter()
        vcfg = cfg.model_copy(update={"backend": "vllm", "threads": threads or 1,
                                      "compile": vllm_compile})  # fmt: skip
        vllm = VLLMEngine(lm, vcfg)
        vllm_start_s = time.perf_counter() - t
    say("warm-up")
    hf_generate(lm, prompts[:4], 4)
    engine_run(engine, prompts[:4], 4, seed=0)
    if vllm is not None:
        engine_run(vllm, prompts[:4], 4, seed=0)

    eng_tps, hf_tps, ratios, gflops = [], [], [], []
    eng_cpu, hf_cpu, ratios_cpu, gflops_cpu = [], [], [], []
    first_outs: list[TurnOutput] = []
    hits = 0.0
    v_tps, v_cpu, v_ratios, v_ratios_cpu = [], [], [], []
    v_outs: list[TurnOutput] = []
    v_hits = 0.0
    for r in range(repeats):
        g_wall, g_cpu = matmul_gflops(device=device)
        gflops.append(g_wall)
        gflops_cpu.append(g_cpu)
        order: tuple[str, ...] = ("hf", "engine") if r % 2 == 0 else ("engine", "hf")
        if vllm is not None:
            order = (("vllm", *order), (*order[:1], "vllm", *order[1:]), (*order, "vllm"))[r % 3]
        res: dict[str, float] = {}
        res_cpu: dict[str, float] = {}
        for who in order:
            say(f"repeat {r + 1}/{repeats}: {who}")
            c0 = time.process_time()
            if who == "vllm":
                t0 = tree_cpu_s()
                h0 = vllm.stats()["prefix_hit_tokens"]
                outs, dt = engine_run(vllm, prompts, new_tokens, seed=1000 * r)
                n = sum(len(o.token_ids) for o in outs)
                v_hits = vllm.stats()["prefix_hit_tokens"] - h0
                v_outs = v_outs or outs
                res["vllm"] = n / dt
                v_cpu.append(n / (tree_cpu_s() - t0))
                continue
            if who == "hf":
                n, dt = hf_generate(lm, prompts, new_tokens)
            else:
                hits0 = engine.stats()["prefix_hit_tokens"]
                outs, dt = engine_run(engine, prompts, new_tokens, seed=1000 * r)
                n = sum(len(o.token_ids) for o in outs)
                hits = engine.stats()["prefix_hit_tokens"] - hits0
                first_outs = first_outs or outs
            res[who] = n / dt
            res_cpu[who] = n / (time.process_time() - c0)
        eng_tps.append(res["engine"])
        hf_tps.append(res["hf"])
        ratios.append(res["engine"] / res["hf"])
        eng_cpu.append(res_cpu["engine"])
        hf_cpu.append(res_cpu["hf"])
        ratios_cpu.append(res_cpu["engine"] / res_cpu["hf"])
        if vllm is not None:
            v_tps.append(res["vllm"])
            v_ratios.append(res["engine"] / res["vllm"])
            v_ratios_cpu.append(res_cpu["engine"] / v_cpu[-1])
    roof = median(gflops) * 1e9 / (2 * params)
    roof_cpu = median(gflops_cpu) * 1e9 / (2 * params)
    result: dict[str, Any] = {
        "model": model,
        "backend": backend,
        "device": device,
        "dtype": "float32",
        "threads": torch.get_num_threads(),
        "concurrency": concurrency,
        "new_tokens": new_tokens,
        "prompt_tokens_mean": sum(map(len, prompts)) / len(prompts),
        "prefix_cache": prefix_cache,
        "prefix_hit_fraction": hits / sum(map(len, prompts)),
        "repeats": repeats,
        "tokens_per_s": median(eng_tps),
        "hf_generate_tokens_per_s": median(hf_tps),
        "ratio_vs_hf": median(ratios),
        "params": params,
        "matmul_gflops": median(gflops),
        "roofline_tokens_per_s": roof,
        "roofline_fraction": median(eng_tps) / roof,
        "tokens_per_s_all": eng_tps,
        "hf_generate_tokens_per_s_all": hf_tps,
        "ratio_vs_hf_all": ratios,
        # The same figures per CPU-second of this process: on a shared machine the wall
        # clock also counts time the OS gave our cores to someone else.
        "tokens_per_cpu_s": median(eng_cpu),
        "hf_generate_tokens_per_cpu_s": median(hf_cpu),
        "ratio_vs_hf_cpu": median(ratios_cpu),
        "matmul_gflops_per_cpu_s": median(gflops_cpu),
        "roofline_tokens_per_cpu_s": roof_cpu,
        "roofline_fraction_cpu": median(eng_cpu) / roof_cpu,
        "ratio_vs_hf_cpu_all": ratios_cpu,
    }
    say("exactness")
    result["logprob_mismatch_max_abs"] = logprob_mismatch(lm, prompts[:8], first_outs[:8])
    if hf_continuous_batching:
        say("transformers continuous batching")
        n, dt = hf_generate_batch(lm, prompts, new_tokens)
        result["hf_continuous_batching_tokens_per_s"] = n / dt
    say("hot-load")
    result.update(hotload_phase(engine, lm, prompts, hotload_tokens, swaps, perturb, audits))
    result["hotload_vs_copy"] = result["hotload_update_ms"] / result["weight_copy_ms"]
    engine.close()
    if vllm is not None:
        n_tok = sum(len(o.token_ids) for o in v_outs)
        result.update(
            {
                "vllm_compile": vllm_compile,
                "vllm_start_s": vllm_start_s,
                "vllm_tokens_per_s": median(v_tps),
                "vllm_tokens_per_s_all": v_tps,
                "ratio_local_vs_vllm": median(v_ratios),
                "ratio_local_vs_vllm_all": v_ratios,
                "vllm_tokens_per_cpu_s": median(v_cpu),
                "ratio_local_vs_vllm_cpu": median(v_ratios_cpu),
                "ratio_local_vs_vllm_cpu_all": v_ratios_cpu,
                "vllm_prefix_hit_fraction": v_hits / sum(map(len, prompts)),
                "vllm_logprob_mismatch_max_abs": logprob_mismatch(lm, prompts[:8], v_outs[:8]),
                "vllm_kv_known_fraction": sum(int((o.kv_min >= 0).sum()) for o in v_outs) / n_tok,
                "vllm_kept_mass_known_fraction": sum(
                    int((~np.isnan(o.kept_mass)).sum()) for o in v_outs
                )
                / n_tok,
            }
        )
        say("vLLM hot-load")
        result.update(vllm_hotload_phase(vllm, lm, prompts, hotload_tokens, swaps, perturb))
        vllm.close()
    return result

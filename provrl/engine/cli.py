"""`provrl bench engine` (issue 3): the rollout engine against HF generate, same process."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer


def bench_engine(
    model: Annotated[
        str, typer.Option(help="Model name (smollm2-135m, tiny, tiny-h32 for vLLM) or HF dir.")
    ] = "smollm2-135m",
    concurrency: Annotated[int, typer.Option(help="Requests in flight at once.")] = 64,
    new_tokens: Annotated[int, typer.Option(help="Tokens sampled per request.")] = 128,
    repeats: Annotated[int, typer.Option(help="Interleaved HF/engine repeats (median).")] = 3,
    threads: Annotated[
        int, typer.Option(help="torch intra-op threads for both sides (0 = torch default).")
    ] = 1,
    swaps: Annotated[int, typer.Option(help="Keep-mode hot-loads in the hot-load phase.")] = 5,
    hotload_tokens: Annotated[
        int, typer.Option(help="Tokens per request in the hot-load phase.")
    ] = 32,
    perturb: Annotated[
        float, typer.Option(help="Relative size of the weight change each swap loads.")
    ] = 1e-3,
    audits: Annotated[int, typer.Option(help="Turns recomputed by the KV-staleness audit.")] = 8,
    prefix_cache: Annotated[
        bool, typer.Option(help="Engine prefix cache (the prompts share a system prompt).")
    ] = True,
    hf_cb: Annotated[
        bool, typer.Option(help="Also time transformers' continuous batching (generate_batch).")
    ] = False,
    backend: Annotated[
        str,
        typer.Option(
            help="'local', or 'vllm': also the vLLM backend side by side (needs vLLM; the "
            "built-in tiny has head_dim 16, use --model tiny-h32)."
        ),
    ] = "local",
    vllm_compile: Annotated[
        bool, typer.Option(help="Let vLLM torch.compile (slow start on CPU); default eager.")
    ] = False,
    device: Annotated[
        str, typer.Option(help="torch device of the model, HF and the local engine (cuda on GPU).")
    ] = "cpu",
    run_dir: Annotated[
        Path | None, typer.Option(help="Also log the figures with MetricsWriter here.")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON only.")] = False,
) -> None:
    """Throughput vs HF generate (ratio, roofline), exactness, hot-load pause, KV staleness;
    with --backend vllm also the vLLM backend in the same run (docs/engine.md §10)."""
    from provrl.engine.bench import run_engine_benchmark

    def say(msg: str) -> None:
        if not as_json:
            typer.echo(f"[bench engine] {msg}", err=True)

    result: dict[str, Any] = run_engine_benchmark(
        model=model,
        concurrency=concurrency,
        new_tokens=new_tokens,
        repeats=repeats,
        threads=threads,
        swaps=swaps,
        hotload_tokens=hotload_tokens,
        perturb=perturb,
        audits=audits,
        prefix_cache=prefix_cache,
        hf_continuous_batching=hf_cb,
        backend=backend,
        vllm_compile=vllm_compile,
        device=device,
        progress=say,
    )
    if run_dir is not None:
        from provrl.report.metrics import MetricsWriter

        w = MetricsWriter(run_dir, tensorboard=False)
        w.log(0, {k: v for k, v in result.items() if isinstance(v, int | float)}, "bench/engine")
        w.close()
    typer.echo(json.dumps(result, indent=None if as_json else 2))

"""`provrl conformance` — does an engine sample from the law it reports? (docs/conformance.md)

Builds the engine the run's factory builds (``--backend local|vllm|ray``) on ``--model``,
runs :func:`provrl.conformance.run.run_conformance` and prints one line per check (or the
report as JSON with ``--json``). Exit code 0 when every check passes, 1 when one fails, 2 on
bad input (the one top-level error handler of ``provrl.cli.entry``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer


def conformance(
    backend: Annotated[
        str, typer.Option(help="Engine backend to check: local, vllm or ray.")
    ] = "local",
    model: Annotated[
        str,
        typer.Option(
            help="Model name (tiny, smollm2-135m; tiny-h32: the tiny model with 32-wide heads, "
            "which vLLM's CPU attention needs) or HF dir."
        ),
    ] = "tiny",
    dtype: Annotated[
        str,
        typer.Option(
            help="Engine dtype: float32, bfloat16, float16, or auto (this CPU's fast one)."
        ),
    ] = "float32",
    check: Annotated[
        list[str] | None,
        typer.Option(help="Run only this check (repeatable): law, teacher, weights, stamps."),
    ] = None,
    samples: Annotated[int | None, typer.Option(help="Tested draws per law.")] = None,
    pilot: Annotated[int | None, typer.Option(help="Pilot draws per law (fix the cells).")] = None,
    alpha: Annotated[float | None, typer.Option(help="Family-wise level of the law tests.")] = None,
    seed: Annotated[int, typer.Option(help="Seeds every draw and published version.")] = 0,
    config: Annotated[
        Path | None,
        typer.Option(
            help="YAML/JSON file of ConformanceConfig fields (flags override it).", exists=True
        ),
    ] = None,
    out: Annotated[
        Path | None,
        typer.Option(help="Also write the report here, with the run record of results/README.md."),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the report as JSON only.")] = False,
) -> None:
    """Check that an engine samples from the law it reports: frequencies vs recorded q
    (G-test, Holm), recorded q vs the trainer's recompute, weight fingerprints and version
    stamps across keep / recompute / drain hot-loads. Exit 0 pass, 1 fail, 2 bad input."""
    import yaml

    from provrl.bench.engine import vllm_tiny_model
    from provrl.conformance.config import ConformanceConfig
    from provrl.conformance.run import CHECKS, run_conformance
    from provrl.engine.config import EngineConfig
    from provrl.models.loading import load_model
    from provrl.models.precision import resolve_dtype
    from provrl.pipeline.engines import make_rollout_engine
    from provrl.run_config.run import RunConfig

    if backend not in ("local", "vllm", "ray"):
        raise typer.BadParameter(f"--backend {backend!r}: expected local, vllm or ray")
    only = tuple(check) if check else CHECKS
    bad = sorted(set(only) - set(CHECKS))
    if bad:
        raise typer.BadParameter(f"--check {bad[0]!r}: expected one of {', '.join(CHECKS)}")
    fields = dict(yaml.safe_load(config.read_text()) or {}) if config else {}
    flags = {"samples": samples, "pilot": pilot, "alpha": alpha}
    fields.update({k: v for k, v in flags.items() if v is not None}, seed=seed)
    cfg = ConformanceConfig(**fields)

    lm = vllm_tiny_model() if model == "tiny-h32" else load_model(model)
    dtype = resolve_dtype(dtype, "cpu")  # the tolerance is the dtype the engine computes in
    run_cfg = RunConfig()
    n_ctx = 512 if model.startswith("tiny") else 2048
    engine_cfg = EngineConfig(
        backend=backend, dtype=dtype, max_seqs=64, max_context=n_ctx, eos_stops=False, seed=seed
    )
    run_cfg.engine = engine_cfg
    engine = make_rollout_engine(lm, run_cfg, engine_cfg, version=0)
    try:
        report = run_conformance(engine, lm, cfg, dtype, only)
    finally:
        engine.close()
    d = report.to_dict()
    d.update(backend=backend, model=model)
    if out is not None:
        from provrl.bench.results import run_record, write_result

        rec = run_record("conformance", d, config=cfg.model_dump(), seeds=[seed])
        write_result(out, rec | {"engine": engine_cfg.model_dump()})
    if as_json:
        typer.echo(json.dumps(d))
    else:
        for c in report.checks:
            typer.echo(c.line())
        verdict = "PASS" if report.passed else f"FAIL ({', '.join(report.failed())})"
        typer.echo(f"{verdict}: {backend} engine, {model}, {dtype}, {report.runtime_s:.1f} s")
    if not report.passed:
        raise typer.Exit(1)

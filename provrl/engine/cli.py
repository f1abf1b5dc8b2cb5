"""`provrl bench engine` (issue 3)."""

import typer


def bench_engine() -> None:
    """Benchmark the rollout engine against HF (not built yet: issue 3)."""
    typer.echo("provrl bench engine: not built yet (issue 3)", err=True)
    raise typer.Exit(2)

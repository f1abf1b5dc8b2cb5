"""`provrl world`, `provrl serve-search`, `provrl eval`, `provrl bench search` (issue 4)."""

import typer


def _todo(name: str) -> None:
    typer.echo(f"provrl {name}: not built yet (issue 4)", err=True)
    raise typer.Exit(2)


def world() -> None:
    """Generate the synthetic search world and its tasks (not built yet: issue 4)."""
    _todo("world")


def serve_search() -> None:
    """Serve the search index over HTTP (not built yet: issue 4)."""
    _todo("serve-search")


def eval_cmd() -> None:
    """Evaluate a policy on a task split (not built yet: issue 4)."""
    _todo("eval")


def bench_search() -> None:
    """Benchmark search backends (not built yet: issue 4)."""
    _todo("bench search")

"""`provrl trpo` — TRPO on gymnasium control (issue 5)."""

import typer


def trpo() -> None:
    """Train TRPO on a gymnasium environment (not built yet: issue 5)."""
    typer.echo("provrl trpo: not built yet (issue 5)", err=True)
    raise typer.Exit(2)

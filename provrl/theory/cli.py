"""`provrl theory …` — exact TRPO quantities on tabular MDPs (issue 6)."""

import typer

app = typer.Typer(
    help="Exact TRPO theory on tabular MDPs: bounds, MM iteration, mixed-version IS.",
    no_args_is_help=True,
)

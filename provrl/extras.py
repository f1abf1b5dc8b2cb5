"""Optional dependencies: which extra brings which package, and a one-line error without it.

The core install (``pip install provrl``) runs ``provrl run`` / ``make demo``; the extras add
what only some commands need::

    serve     fastapi, uvicorn        provrl serve-search (the /retrieve service)
    classic   gymnasium               provrl trpo (gymnasium control)
    tracking  wandb, mlflow-skinny    logging.report_to: [wandb, mlflow]
    export    pyarrow                 provrl trajectories export --format parquet
    ray       ray                     engine.backend: ray (engine replicas as Ray actors)
"""

from __future__ import annotations

import importlib.util


class MissingExtra(RuntimeError):
    """A command needs a package of an extra that is not installed."""


def require(module: str, extra: str, what: str) -> None:
    """Raise :class:`MissingExtra` naming ``what`` needs ``module`` and the pip command."""
    if importlib.util.find_spec(module) is None:
        raise MissingExtra(
            f"{what} needs {module}, which is not installed: pip install 'provrl[{extra}]'"
        )

"""The command line: every ``provrl`` command, the top layer of the tree.

``provrl.cli:main`` is the console script and ``provrl.cli:app`` the typer application, both
from :mod:`provrl.cli.entry`; ``python -m provrl.cli`` runs it too. Names load on first use.
"""

from provrl._lazy import lazy_exports

_EXPORTS = {
    "app": "provrl.cli.entry",
    "main": "provrl.cli.entry",
}
__all__ = list(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)

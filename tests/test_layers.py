"""The layer order of provrl/ (pyproject.toml, [tool.importlinter]): no upward import and no
import cycle, function-local imports counted — the check `make lint` runs, run here too."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_the_layer_contracts_hold():
    cli = pytest.importorskip("importlinter.cli")
    assert cli.lint_imports(config_filename=str(ROOT / "pyproject.toml"), no_cache=True) == 0


def test_the_import_graph_counts_function_local_imports():
    """engine.factory imports engine.local only inside make_engine (it needs torch): the
    graph the contracts are checked on still has that import."""
    grimp = pytest.importorskip("grimp")
    graph = grimp.build_graph("provrl", cache_dir=None)
    assert graph.direct_import_exists(
        importer="provrl.engine.factory", imported="provrl.engine.local"
    )
    assert not graph.find_shortest_chains(importer="provrl.env", imported="provrl.pipeline")

"""Fixtures of the environment tests: one small world, built once per session."""

from __future__ import annotations

import pytest

from provrl.env.build import build_world
from provrl.env.config import WorldConfig
from provrl.env.sqlite_index import SqliteSearch, cached_index

SMALL = WorldConfig(seed=7, entities=300, docs=800, tasks=240)


@pytest.fixture(scope="session")
def small_cfg():
    return SMALL


@pytest.fixture(scope="session")
def small_world(tmp_path_factory):
    """A built world directory (corpus, index, oracle-verified tasks)."""
    d = tmp_path_factory.mktemp("world") / "w"
    build_world(SMALL, d)
    return d


@pytest.fixture(scope="session")
def small_search(small_world):
    s = SqliteSearch(cached_index(small_world))
    yield s
    s.close()

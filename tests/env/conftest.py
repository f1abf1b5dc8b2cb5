"""Fixtures of the environment tests (the small world itself is in tests/conftest.py)."""

from __future__ import annotations

import pytest

from provrl.env.sqlite_index import SqliteSearch, cached_index


@pytest.fixture(scope="session")
def small_search(small_world):
    s = SqliteSearch(cached_index(small_world))
    yield s
    s.close()

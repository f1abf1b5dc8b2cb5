"""Shared fixtures. The tiny model is a real Llama with SmolLM2's tokenizer (random weights)."""

from __future__ import annotations

import os

import numpy as np
import pytest

# ``auto`` dtypes resolve to float32 in the suite on every CPU (provrl.models.precision: the
# verdict is forced), so CI computes alike on an AMX Xeon, a Zen 4 EPYC or a CPU without bf16;
# the bf16 paths have their own tests with explicit dtypes. PROVRL_CPU_BF16=1 runs it in bf16.
os.environ.setdefault("PROVRL_CPU_BF16", "0")


@pytest.fixture(scope="session")
def tiny():
    """The tiny random Llama (``provrl.models.load_model("tiny")``), seed 0."""
    from provrl.models import load_model

    return load_model("tiny", seed=0)


@pytest.fixture(scope="session")
def tokenizer(tiny):
    return tiny.tokenizer


@pytest.fixture
def rng():
    return np.random.default_rng(0)


SMALL_WORLD = dict(seed=7, entities=300, docs=800, tasks=240)


@pytest.fixture(scope="session")
def small_cfg():
    """The small world's generator settings (the quick preset's world)."""
    from provrl.env.config import WorldConfig

    return WorldConfig(**SMALL_WORLD)


@pytest.fixture(scope="session")
def small_world(tmp_path_factory, small_cfg):
    """A built world directory (corpus, index, oracle-verified tasks), once per session."""
    from provrl.env.build import build_world

    d = tmp_path_factory.mktemp("world") / "w"
    build_world(small_cfg, d)
    return d


@pytest.fixture(scope="session")
def small_search(small_world):
    """The small world's SQLite BM25 index, opened once per session."""
    from provrl.env.sqlite_index import SqliteSearch, cached_index

    s = SqliteSearch(cached_index(small_world))
    yield s
    s.close()

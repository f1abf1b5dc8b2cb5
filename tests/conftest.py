"""Shared fixtures. The tiny model is a real Llama with SmolLM2's tokenizer (random weights)."""

from __future__ import annotations

import numpy as np
import pytest


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

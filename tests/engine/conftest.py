"""Engine test helpers: the tiny model, engines on it, teacher-forced references."""

from __future__ import annotations

import copy
from collections.abc import Iterator

import pytest
import torch

from provrl.engine import EngineConfig, LocalEngine
from provrl.models import LoadedModel, chat_ids
from provrl.train.logprobs import token_logprobs


@pytest.fixture(autouse=True, scope="package")
def _one_thread() -> Iterator[None]:
    """One intra-op thread: on the shared 2-core machine a 2-thread barrier can wait for
    a descheduled core for tens of ms per op (docs/engine.md)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture
def make_engine(tiny):
    """``make_engine(**cfg)`` → a LocalEngine on the tiny model, closed after the test."""
    engines: list[LocalEngine] = []

    def make(lm: LoadedModel | None = None, replica: int = 0, version: int = 0, **cfg):
        cfg = {"max_seqs": 8, "max_context": 256, **cfg}
        e = LocalEngine(lm or tiny, EngineConfig(**cfg), replica=replica, version=version)
        engines.append(e)
        return e

    yield make
    for e in engines:
        e.close()


@pytest.fixture(scope="session")
def prompts(tiny) -> list[list[int]]:
    """Eight distinct chat prompts (they share SmolLM2's system prompt)."""
    qs = [
        "What is the capital of France?",
        "Name a prime number larger than ten.",
        "Who wrote Hamlet?",
        "How many legs does a spider have?",
        "What colour is the sky on a clear day?",
        "Spell the word engine backwards.",
        "Which ocean is the largest?",
        "What is two plus two?",
    ]
    return [chat_ids(tiny.tokenizer, [{"role": "user", "content": q}]) for q in qs]


@pytest.fixture(scope="session")
def teacher():
    """``teacher(model, ids, temperature=1.0)`` → teacher-forced logprobs (see below)."""
    return teacher_forced


@pytest.fixture(scope="session")
def helpers():
    """Helpers for version tests: ``perturbed(lm, scale, seed)``, ``with_state(lm, sd, name)``."""
    return type("Helpers", (), {"perturbed": staticmethod(perturbed),
                                "with_state": staticmethod(with_state)})  # fmt: skip


def teacher_forced(model, ids: list[int], temperature: float = 1.0) -> torch.Tensor:
    """log π(ids[t] | ids[:t]) for every t (0 at t = 0), by a fresh HF forward."""
    with torch.no_grad():
        return token_logprobs(model, torch.tensor([ids]), temperature=temperature)[0]


def with_state(lm: LoadedModel, state: dict[str, torch.Tensor], name: str) -> LoadedModel:
    """A copy of ``lm`` whose HF model holds ``state`` (a reference for version checks)."""
    model = copy.deepcopy(lm.model)
    model.load_state_dict(state, strict=False)
    return LoadedModel(model, lm.tokenizer, name, None, name)


def perturbed(lm: LoadedModel, scale: float, seed: int) -> dict[str, torch.Tensor]:
    """The model's state dict plus scale·std·noise on every tensor (a tied lm_head is
    left out: it is the embedding)."""
    g = torch.Generator().manual_seed(seed)
    tied = lm.model.config.tie_word_embeddings
    return {
        k: v.detach() + scale * v.detach().std() * torch.randn(v.shape, generator=g)
        for k, v in lm.model.state_dict().items()
        if not (tied and k == "lm_head.weight")
    }

"""``auto`` compute dtypes (provrl/models/precision.py): bfloat16 exactly where the device has
bf16 matrix units, resolved where the dtype is used — the engine's weights and KV cache, the
trainers' autocast — and recorded in the session's machine facts."""

from __future__ import annotations

import pytest
import torch

from provrl._sys import machine
from provrl.engine.config import EngineConfig
from provrl.engine.local import LocalEngine
from provrl.models import precision
from provrl.train.config import RLConfig, SFTConfig
from provrl.train.sft import weights_cast_once


@pytest.fixture(params=[True, False], ids=["amx", "no-amx"])
def amx(request, monkeypatch):
    """Pretend the CPU has AMX tiles (True) or only AVX512-BF16 (False)."""
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: request.param)
    return request.param


def test_auto_is_bf16_exactly_where_the_cpu_has_amx(amx):
    assert precision.bf16_is_fast("cpu") is amx
    assert precision.resolve_dtype("auto", "cpu") == ("bfloat16" if amx else "float32")
    for name in ("float32", "bfloat16", "float16"):  # a named dtype is never second-guessed
        assert precision.resolve_dtype(name, "cpu") == name


def test_autocast_computes_in_the_resolved_dtype(amx):
    a, b = torch.randn(4, 8), torch.randn(8, 3)
    with precision.autocast("auto", "cpu"):
        assert (a @ b).dtype == (torch.bfloat16 if amx else torch.float32)
    with precision.autocast("float32", "cpu"):
        assert (a @ b).dtype == torch.float32
    with precision.autocast("bfloat16", "cpu"):
        assert (a @ b).dtype == torch.bfloat16
    # a float32 context inside a bf16 one switches it off (the trainers nest contexts)
    with precision.autocast("bfloat16", "cpu"), precision.autocast("float32", "cpu"):
        assert (a @ b).dtype == torch.float32


def test_the_sft_autocast_follows_auto(amx):
    a, b = torch.randn(4, 8), torch.randn(8, 3)
    with weights_cast_once(SFTConfig(autocast="auto"), torch.device("cpu")):
        assert (a @ b).dtype == (torch.bfloat16 if amx else torch.float32)
    assert RLConfig(autocast="auto").autocast == "auto"  # kept as written: resolved at use


def test_the_engine_holds_its_weights_and_cache_in_the_resolved_dtype(tiny, amx):
    eng = LocalEngine(tiny, EngineConfig(dtype="auto", max_seqs=2, max_context=64, threads=1))
    try:
        want = torch.bfloat16 if amx else torch.float32
        assert eng.weights_dtype == want
        assert eng.weights.embed.dtype == want
    finally:
        eng.close()


def test_the_session_record_says_whether_the_cpu_has_amx(amx):
    assert machine()["cpu_amx"] is amx

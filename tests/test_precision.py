"""``auto`` compute dtypes (provrl/models/precision.py): bfloat16 exactly where it is the CPU's
fast dtype (AMX tiles, or AVX512-BF16 measured fast once and kept per CPU model), resolved
where the dtype is used — the engine's weights and KV cache, the trainers' autocast — and
recorded in the session's machine facts."""

from __future__ import annotations

import json

import pytest
import torch

from provrl._sys import machine
from provrl.engine.config import EngineConfig
from provrl.engine.local import LocalEngine
from provrl.models import precision
from provrl.train.config import RLConfig, SFTConfig
from provrl.train.sft import weights_cast_once


@pytest.fixture(autouse=True)
def _verdict_cache(tmp_path, monkeypatch):
    """Every test measures into its own cache, with no forced verdict."""
    monkeypatch.setenv("PROVRL_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("PROVRL_CPU_BF16", raising=False)
    precision.cpu_bf16_verdict.cache_clear()
    yield
    precision.cpu_bf16_verdict.cache_clear()


@pytest.fixture(params=[True, False], ids=["amx", "slow-bf16"])
def amx(request, monkeypatch):
    """Pretend the CPU has AMX tiles (True) or AVX512-BF16 that measures slow (False)."""
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: request.param)
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: True)
    monkeypatch.setattr(precision, "measure_bf16_ratio", lambda: 0.6)
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
    assert machine()["cpu_bf16"]["fast"] is amx


def test_without_amx_the_verdict_is_measured_once_per_cpu_and_kept(monkeypatch, tmp_path):
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: False)
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: True)
    calls = []

    def probe() -> float:
        calls.append(1)
        return 2.2

    monkeypatch.setattr(precision, "measure_bf16_ratio", probe)
    assert precision.cpu_bf16_verdict() == {"fast": True, "how": "measured", "ratio": 2.2}
    assert precision.resolve_dtype("auto", "cpu") == "bfloat16"
    precision.cpu_bf16_verdict.cache_clear()  # another process on the same machine
    assert precision.cpu_bf16_verdict() == {"fast": True, "how": "kept", "ratio": 2.2}
    assert len(calls) == 1  # measured once: every later run resolves alike
    kept = json.loads((tmp_path / "cache" / "cpu_bf16.json").read_text())
    assert [v["ratio"] for v in kept.values()] == [2.2]
    # a ratio under the margin is float32; a CPU without AVX512-BF16 is never measured
    precision.cpu_bf16_verdict.cache_clear()
    (tmp_path / "cache" / "cpu_bf16.json").unlink()
    monkeypatch.setattr(precision, "measure_bf16_ratio", lambda: 1.1)
    assert precision.resolve_dtype("auto", "cpu") == "float32"
    precision.cpu_bf16_verdict.cache_clear()
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: False)
    assert precision.cpu_bf16_verdict() == {"fast": False, "how": "no-avx512-bf16"}


def test_the_verdict_can_be_forced(monkeypatch):
    monkeypatch.setenv("PROVRL_CPU_BF16", "0")
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: True)
    assert precision.resolve_dtype("auto", "cpu") == "float32"
    precision.cpu_bf16_verdict.cache_clear()
    monkeypatch.setenv("PROVRL_CPU_BF16", "1")
    assert precision.cpu_bf16_verdict() == {"fast": True, "how": "env"}


def test_the_probe_measures_a_positive_ratio():
    assert precision.measure_bf16_ratio(repeats=1) > 0

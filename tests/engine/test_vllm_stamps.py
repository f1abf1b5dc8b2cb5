"""The vLLM backend's provenance arithmetic (pure functions: no vLLM needed, so these run in
the default suite): version spans, the kv_min rule, kept mass / logprob conventions, finish
reasons, and the backend switch."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest

from provrl.engine import EngineConfig, EngineError, LocalEngine
from provrl.engine.factory import make_engine as build_engine
from provrl.engine.vllm_backend import (
    behaviour_stamps,
    finish_of,
    kv_min_of,
    span_versions,
    truncates,
)
from provrl.provenance import UNKNOWN_VERSION, SamplingParams


@dataclass
class Span:  # vllm.outputs.WeightVersionSpan's fields
    version: str
    start: int
    end: int


def test_span_versions_tile_the_output():
    got = span_versions([Span("3", 0, 2), Span("4", 2, 5)], 5)
    assert got.tolist() == [3, 3, 4, 4, 4] and got.dtype == np.int32
    assert span_versions(None, 0).tolist() == []


@pytest.mark.parametrize(
    "spans",
    [
        None,
        [Span("1", 0, 2)],
        [Span("1", 0, 2), Span("2", 3, 5)],
        [Span("1", 1, 5)],
        [Span("1", 0, 6)],
    ],
)
def test_span_versions_refuse_gaps_and_overruns(spans):
    with pytest.raises(EngineError, match="request 'r'"):
        span_versions(spans, 5, "request 'r'")


def test_kv_min_exact_only_when_first_token_version_is_the_salt():
    v = np.array([2, 2, 3, 3], np.int32)  # a keep swap 2 → 3 during decode
    assert kv_min_of(2, v, preempted=False) == 2  # all KV before the swap is v2: exact
    assert kv_min_of(1, v, preempted=False) == UNKNOWN_VERSION  # prefill may span 1 → 2
    assert kv_min_of(2, v, preempted=True) == UNKNOWN_VERSION  # recomputed: maybe v3 KV
    assert kv_min_of(2, np.array([2, 2], np.int32), preempted=True) == 2  # one version only
    assert kv_min_of(2, np.array([], np.int32), preempted=False) == UNKNOWN_VERSION


def test_behaviour_stamps_follow_the_local_engine_conventions():
    lp = np.array([-0.5, -2.0])
    V = 100
    g_lp, g_m = behaviour_stamps(SamplingParams(temperature=0.0), lp, V)
    assert g_lp.tolist() == [0.0, 0.0]  # greedy: q is a point mass
    np.testing.assert_allclose(g_m, np.exp(lp), rtol=1e-6)  # m = softmax(ℓ)_a
    p_lp, p_m = behaviour_stamps(SamplingParams(temperature=0.7), lp, V)
    np.testing.assert_allclose(p_lp, lp)
    assert p_m.tolist() == [1.0, 1.0]  # nothing truncated
    t_lp, t_m = behaviour_stamps(SamplingParams(top_p=0.9), lp, V)
    np.testing.assert_allclose(t_lp, lp)
    assert np.isnan(t_m).all()  # vLLM does not return the cut mass: unknown
    assert not truncates(SamplingParams(top_k=V), V) and truncates(SamplingParams(top_k=5), V)


def test_finish_reasons():
    eos = frozenset({2})
    assert finish_of("stop", 2, 2, eos, False) == ("eos", 2)
    assert finish_of("stop", 7, 7, eos, False) == ("stop", 7)
    assert finish_of("stop", None, 2, eos, False) == ("eos", 2)
    assert finish_of("length", None, 5, eos, False) == ("length", None)
    assert finish_of("length", None, 5, eos, True) == ("context", None)
    assert finish_of("abort", None, 5, eos, False) == (None, None)
    assert finish_of("error", None, 5, eos, False) == ("error", None)


def test_make_engine_picks_the_backend(tiny):
    e = build_engine(tiny, EngineConfig(max_seqs=2, max_context=64), version=4)
    try:
        assert isinstance(e, LocalEngine) and e.version == 4
    finally:
        e.close()
    try:
        import vllm  # noqa: F401
    except ImportError:
        with pytest.raises(EngineError, match="vLLM is not installed"):
            build_engine(tiny, EngineConfig(backend="vllm"))


def test_backend_is_a_config_field():
    from provrl.config import load_config
    from provrl.run_config import RunConfig

    cfg = load_config(RunConfig, "quick", ["engine.backend=vllm", "engine.vllm.kv_cache_gb=3"])
    assert cfg.engine.backend == "vllm" and cfg.engine.vllm.kv_cache_gb == 3
    with pytest.raises(ValueError, match="backend"):
        load_config(RunConfig, "quick", ["engine.backend=sglang"])


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("device", "cpu:0"),
        ("prefix_cache_min_tokens", 4),
        ("kv_release", False),
        ("kv_huge_pages", True),
    ],
)
def test_options_vllm_ignores_are_refused_in_one_line(key, value):
    from provrl.config import ConfigError, load_config
    from provrl.run_config import RunConfig

    with pytest.raises(ConfigError) as e:
        load_config(RunConfig, "quick", ["engine.backend=vllm", f"engine.{key}={value}"])
    msg = str(e.value)
    assert f"'engine.{key}'" in msg and "vLLM backend ignores it" in msg and "\n" not in msg
    # the same value is the local engine's to read; the default is accepted with vllm
    assert getattr(load_config(RunConfig, "quick", [f"engine.{key}={value}"]).engine, key) == value
    EngineConfig(backend="vllm", **{key: EngineConfig.model_fields[key].default})

"""The search-latency model: its sampled quantiles are the quantiles its parameters give
(tolerances from the sampling error), and the presets hit the published figures they were
fitted to."""

from __future__ import annotations

import math

import numpy as np
import pytest

from provrl.config import ConfigError, load_config
from provrl.env.config import LATENCY_PRESETS, LATENCY_PUBLISHED, LatencyConfig
from provrl.env.latency import LatencyModel, cdf, fit_lognormal_pareto, quantile
from provrl.run_config import RunConfig

N = 200_000
QS = (0.1, 0.5, 0.9, 0.95, 0.99, 0.999)
CASES = {
    "lognormal": LatencyConfig(kind="lognormal", median_s=0.5, sigma=0.6, seed=3),
    "pareto": LatencyConfig(kind="pareto", median_s=0.5, sigma=0.6, tail_prob=0.1, seed=4),
    "clipped": LatencyConfig(
        kind="pareto", median_s=1.0, sigma=1.0, tail_prob=0.2, tail_alpha=1.0, max_s=8.0, seed=5
    ),
    **{name: LatencyConfig(preset=name, seed=6) for name in LATENCY_PRESETS},  # type: ignore[arg-type]
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_sampled_quantiles_are_the_parameters_quantiles(name):
    """At each analytic quantile x_q, the share of N seeded draws ≤ x_q is Binomial(N, q)/N:
    it lies within 4 standard errors √(q(1−q)/N) of q (a false alarm ≈ 6e-5 per check)."""
    cfg = CASES[name]
    x = np.sort(LatencyModel(cfg).sample(N))
    for q in QS:
        xq = quantile(cfg, q)
        se = math.sqrt(q * (1 - q) / N)
        if xq >= cfg.max_s:  # the clip: an atom at max_s holds all the mass from F(max_s⁻) on
            assert np.mean(x < cfg.max_s) < q + 4 * se
            continue
        share = np.searchsorted(x, xq, side="right") / N
        assert abs(share - q) < 4 * se, (name, q, xq, share)
        assert cdf(cfg, xq) == pytest.approx(q, abs=1e-9)


def test_the_pareto_tail_has_its_index():
    """Beyond the body (P(body > x) ≪ tail), P(L > x) ≈ p · (q95 / x)^α."""
    cfg = CASES["pareto"]
    q95 = cfg.median_s * math.exp(1.6448536269514722 * cfg.sigma)
    for k in (4.0, 10.0):
        assert 1 - cdf(cfg, k * q95) == pytest.approx(cfg.tail_prob * k**-cfg.tail_alpha, rel=1e-2)
    # and it is heavier than the log-normal body alone: more mass above 10 · median
    body = LatencyConfig(kind="lognormal", median_s=0.5, sigma=0.6)
    assert 1 - cdf(cfg, 5.0) > 100 * (1 - cdf(body, 5.0))


def test_clip_and_none():
    clipped = CASES["clipped"]
    assert quantile(clipped, 0.999) == clipped.max_s
    assert cdf(clipped, clipped.max_s) == 1.0 and cdf(clipped, -1) == 0.0
    assert quantile(LatencyConfig(), 0.5) == 0.0
    with pytest.raises(ValueError):
        quantile(clipped, 1.0)


@pytest.mark.parametrize("name", sorted(LATENCY_PRESETS))
def test_each_preset_has_the_published_p50_and_p95(name):
    p50, p95, _ = LATENCY_PUBLISHED[name]
    cfg = LatencyConfig(preset=name)  # type: ignore[arg-type]
    assert cfg.kind == "pareto"
    # 3 significant figures of (m, σ): within 0.5 % of the published figures
    assert quantile(cfg, 0.5) == pytest.approx(p50, rel=5e-3)
    assert quantile(cfg, 0.95) == pytest.approx(p95, rel=5e-3)
    m, s = fit_lognormal_pareto(p50, p95, cfg.tail_prob, cfg.tail_alpha, cfg.max_s)
    assert (float(f"{m:.3g}"), float(f"{s:.3g}")) == (cfg.median_s, cfg.sigma)


def test_a_preset_yields_to_fields_given_explicitly():
    cfg = load_config(RunConfig, None, ["env.search.latency.preset=web-serp",
                                        "env.search.latency.tail_prob=0.1"])  # fmt: skip
    lat = cfg.env.search.latency
    assert lat.median_s == LATENCY_PRESETS["web-serp"]["median_s"] and lat.tail_prob == 0.1
    with pytest.raises(ConfigError, match="preset"):
        load_config(RunConfig, None, ["env.search.latency.preset=web-slowest"])


def test_fit_refuses_an_impossible_target():
    with pytest.raises(ValueError):
        fit_lognormal_pareto(2.0, 1.0, 0.02, 1.5)


def test_time_scale_dilates_the_whole_law():
    """time_scale s: the same seeded draws times s (the clip too), F'(x) = F(x / s), and every
    quantile s times the unscaled one — so a preset's shape survives the dilation."""
    base = LatencyConfig(preset="web-ai", max_s=5.0, seed=3)  # type: ignore[call-arg]
    slow = base.model_copy(update={"time_scale": 12.5})
    a, b = LatencyModel(base).sample(1000), LatencyModel(slow).sample(1000)
    np.testing.assert_allclose(b, 12.5 * a, rtol=1e-12)
    assert b.max() <= 12.5 * base.max_s and b.max() > base.max_s
    for q in (0.5, 0.95, 0.999):
        assert quantile(slow, q) == pytest.approx(12.5 * quantile(base, q), rel=1e-9)
    for x in (0.3, 1.0, 4.0):
        assert cdf(slow, 12.5 * x) == pytest.approx(cdf(base, x), abs=1e-12)
    assert LatencyConfig(preset="web-ai").time_scale == 1.0  # type: ignore[call-arg]


def test_the_simulated_deadline_dilates_with_the_latency(small_world):
    """With time_scale N the wrapped backend's deadline is N × env.agent.tool_timeout_s: a
    dilated web search times out exactly where the undilated one would."""
    from provrl.env.build import search_backend
    from provrl.env.config import EnvConfig

    cfg = EnvConfig()
    cfg.search.latency = LatencyConfig(preset="web-ai", time_scale=13.0)  # type: ignore[call-arg]
    assert search_backend(small_world, cfg).timeout_s == 13.0 * cfg.agent.tool_timeout_s  # type: ignore[attr-defined]
    cfg.search.latency = LatencyConfig(preset="web-ai")  # type: ignore[call-arg]
    assert search_backend(small_world, cfg).timeout_s == cfg.agent.tool_timeout_s  # type: ignore[attr-defined]

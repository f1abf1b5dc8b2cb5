"""The /retrieve service (real uvicorn on a local port) and its client."""

from __future__ import annotations

import socket
import threading
import time

import httpx
import pytest
import uvicorn

from provrl.env.config import LatencyConfig
from provrl.env.http_search import HttpSearch, make_app
from provrl.env.latency import LatencyModel, WithLatency


@pytest.fixture(scope="module")
def server(small_search):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    config = uvicorn.Config(
        make_app(small_search, 3), host="127.0.0.1", port=port, log_level="error"
    )
    srv = uvicorn.Server(config)
    th = threading.Thread(target=srv.run, daemon=True)
    th.start()
    url = f"http://127.0.0.1:{port}"
    for _ in range(200):
        try:
            httpx.get(f"{url}/health", timeout=0.5)
            break
        except httpx.HTTPError:
            time.sleep(0.02)
    yield url
    srv.should_exit = True
    th.join(timeout=5)


def test_retrieve_protocol(server, small_search):
    q = ["Employees of the", "notable people born in"]
    r = httpx.post(f"{server}/retrieve", json={"queries": q, "topk": 4, "return_scores": True})
    assert r.status_code == 200
    result = r.json()["result"]
    assert len(result) == 2 and all(len(x) == 4 for x in result)
    item = result[0][0]
    assert set(item) == {"document", "score"}
    doc = item["document"]
    title, _, text = doc["contents"].partition("\n")
    want = small_search.search(q[0], 4)[0]
    assert title == f'"{want.title}"' and text == want.snippet and doc["id"] == want.passage_id
    assert item["score"] == pytest.approx(want.score)
    # without scores: the documents themselves; topk defaults to the server's
    r = httpx.post(f"{server}/retrieve", json={"queries": ["born"]})
    docs = r.json()["result"][0]
    assert len(docs) == 3 and "contents" in docs[0] and "score" not in docs[0]
    # bad requests are rejected, not crashed on
    assert httpx.post(f"{server}/retrieve", json={"queries": "x"}).status_code == 422
    assert httpx.post(f"{server}/retrieve", json={"queries": ["x"], "topk": 0}).status_code == 422


def test_client_matches_local_backend(server, small_search):
    client = HttpSearch(server)
    for q in ["born", "Employees of the", "zzzz", ""]:
        assert client.search(q, 3) == [
            type(h)(h.doc_id, h.title, h.snippet, pytest.approx(h.score), h.passage)
            for h in small_search.search(q, 3)
        ]
    hit = small_search.search("born", 1)[0]
    assert client.open(hit.doc_id) == small_search.open(hit.doc_id)
    assert client.open("nope") is None
    assert client.fingerprint().endswith(small_search.fingerprint())
    client.close()


def test_client_reports_a_dead_server():
    from provrl.env.search import SearchError

    client = HttpSearch("http://127.0.0.1:9", timeout_s=0.5)
    with pytest.raises((SearchError, TimeoutError)):
        client.search("x", 3)


def test_latency_model_quantiles_and_timeout(small_search):
    import numpy as np

    m = LatencyModel(LatencyConfig(kind="lognormal", median_s=0.5, sigma=0.6, seed=1))
    x = m.sample(20000)
    assert np.median(x) == pytest.approx(0.5, rel=0.05)
    # log-space std is sigma
    assert np.log(x).std() == pytest.approx(0.6, rel=0.05)
    p = LatencyModel(
        LatencyConfig(
            kind="pareto", median_s=0.5, sigma=0.6, tail_prob=0.1, tail_alpha=1.5, max_s=1e9, seed=1
        )
    )
    y = p.sample(20000)
    q95 = 0.5 * np.exp(1.6448536 * 0.6)
    # the Pareto tail: P(L > 4·q95) ≈ 0.1·4^-1.5 + body share (tiny)
    assert (y > 4 * q95).mean() == pytest.approx(0.1 * 4**-1.5, abs=0.006)
    assert LatencyModel(LatencyConfig()).sample() == 0.0
    slow = WithLatency(
        small_search,
        LatencyModel(LatencyConfig(kind="lognormal", median_s=0.2, sigma=0.01)),
        timeout_s=0.05,
    )
    t0 = time.perf_counter()
    with pytest.raises(TimeoutError):
        slow.search("born", 3)
    assert time.perf_counter() - t0 > 0.04  # it waited for the timeout, then gave up
    fast = WithLatency(
        small_search,
        LatencyModel(LatencyConfig(kind="lognormal", median_s=0.01, sigma=0.01)),
        timeout_s=1,
    )
    assert fast.search("born", 3) == small_search.search("born", 3)

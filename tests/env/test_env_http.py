"""The /retrieve service (real uvicorn on a local port) and its client."""

from __future__ import annotations

import json
import socket
import threading
import time

import httpx
import pytest
import uvicorn

from provrl.env.config import LatencyConfig
from provrl.env.http_search import HttpSearch, RetrieveLimits, make_app
from provrl.env.latency import LatencyModel, WithLatency


def _serve(app):
    """Run ``app`` under a real uvicorn on a free local port; yields its URL."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    srv = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="error"))
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


@pytest.fixture(scope="module")
def server(small_search):
    yield from _serve(make_app(small_search, 3))


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


# ----------------------------------------------------------------------------- hardening
LIMITS = RetrieveLimits(
    max_body_bytes=64 << 10, max_queries=8, max_topk=200, max_results=400, max_query_chars=512
)


@pytest.fixture(scope="module")
def bounded(small_search):
    yield from _serve(make_app(small_search, 3, LIMITS))


def _post(url, body, **kw):
    t0 = time.perf_counter()
    r = httpx.post(f"{url}/retrieve", timeout=30, **({"json": body} if body is not None else kw))
    return r, time.perf_counter() - t0


def test_hostile_retrieve_bodies_fail_fast_with_one_line(bounded):
    """Each used to pin a worker (an 8.9 MB query never returned and grew RSS 96 → 694 MB)
    or was refused for being legitimate (topk > 100)."""
    many_terms = " ".join(f"w{i}" for i in range(100))  # 100 terms in ~400 characters
    cases = {
        "8.9 MB query": ({"queries": ["a " * (4_450_000)]}, 413, "request body larger"),
        "query over max_query_chars": ({"queries": ["x" * 600]}, 422, "queries[0]: 600 char"),
        "too many terms": ({"queries": ["born", many_terms]}, 422, "queries[1]: query has 100"),
        "too many queries": ({"queries": ["born"] * 9}, 422, "queries: 9 queries"),
        "topk over max_topk": ({"queries": ["x"], "topk": 10**9}, 422, "topk: 1000000000"),
        "queries x topk": ({"queries": ["x"] * 4, "topk": 150}, 422, "queries × topk = 600"),
        "not a list": ({"queries": "born"}, 422, ""),
        "not strings": ({"queries": [{"$gt": 1}]}, 422, ""),
        "negative topk": ({"queries": ["x"], "topk": -1}, 422, ""),
    }
    for name, (body, status, detail) in cases.items():
        r, dt = _post(bounded, body)
        assert r.status_code == status, (name, r.status_code, r.text[:200])
        assert detail in str(r.json()["detail"]), (name, r.json())
        assert dt < 5, (name, dt)
    # invalid JSON, deep nesting and a chunked oversize body (no Content-Length)
    r, _ = _post(bounded, None, content=b"[" * 60_000, headers={"content-type": "application/json"})
    assert 400 <= r.status_code < 500
    r, _ = _post(bounded, None, content=b"{not json", headers={"content-type": "application/json"})
    assert 400 <= r.status_code < 500
    chunks = (b"x" * 8192 for _ in range(64))  # 512 KiB streamed in chunks
    r, _ = _post(bounded, None, content=chunks, headers={"content-type": "application/json"})
    assert r.status_code == 413 and "larger than 65536 bytes" in r.json()["detail"]
    # a topk over 100 is served (Search-R1 configs use such values); the server still works
    r, _ = _post(bounded, {"queries": ["born"], "topk": 150})
    assert r.status_code == 200 and len(r.json()["result"][0]) == 150
    r, _ = _post(bounded, {"queries": ["Employees of the"], "topk": 3})
    assert r.status_code == 200 and len(r.json()["result"][0]) == 3


NON_FINITE = {  # issue 28: each answered 500 (plain text) with ~40 traceback lines logged
    b'{"queries": ["born"], "topk": NaN}': "topk: NaN is not a finite JSON number",
    b'{"queries": ["born"], "topk": Infinity}': "topk: Infinity",
    b'{"queries": ["born"], "topk": 1e400}': "topk: 1e400 is not a finite JSON number",
    b'{"queries": ["born", -Infinity]}': "queries[1]: -Infinity",
    b'{"queries": ["born"], "return_scores": {"x": [NaN]}}': "return_scores.x[0]: NaN",
    b"NaN": "body: NaN",
}
REJECTED = {  # more bodies that are refused after being read whole
    **NON_FINITE,
    b'{"queries": ["born"], "topk": 1' + b"0" * 5000 + b"}": "body: an integer with more",
    b"[" * 60_000: "body: JSON nested too deeply",
    b"{not json": "body: invalid JSON at character 1",
    b'{"queries": "born"}': "queries: Input should be a valid list",
    b'{"queries": ["born"], "topk": 3.5}': "topk: Input should be a valid integer",
    b'{"queries": ["a","b","c","d","e","f","g","h","i"]}': "queries: 9 queries",
}


def test_non_finite_numbers_are_422_naming_the_field_never_500(bounded):
    for body, detail in REJECTED.items():
        r, _ = _post(bounded, None, content=body, headers={"content-type": "application/json"})
        assert r.status_code == 422, (body[:40], r.status_code, r.text[:200])
        assert r.json()["detail"].startswith(detail), (body[:40], r.json())


def test_keep_alive_connection_survives_rejected_requests(bounded):
    """After each rejected request the same connection serves a valid one (issue 28: 9 of 432
    valid requests were reset on a keep-alive connection reused after a hostile request)."""
    import http.client
    from urllib.parse import urlparse

    u = urlparse(bounded)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=30)
    good = json.dumps({"queries": ["born"], "topk": 2}).encode()
    conn.request("POST", "/retrieve", good, {"content-type": "application/json"})
    assert conn.getresponse().read() and conn.sock is not None
    sock = conn.sock
    too_big = b'{"queries": ["' + b"a" * (LIMITS.max_body_bytes + 10) + b'"]}'
    for body in [*REJECTED, too_big]:
        for payload, status in ((body, 413 if body is too_big else 422), (good, 200)):
            conn.request("POST", "/retrieve", payload, {"content-type": "application/json"})
            r = conn.getresponse()
            r.read()
            assert r.status == status, (body[:40], r.status)
            assert conn.sock is sock, f"the connection was closed after {body[:40]!r}"
    conn.close()


def test_a_body_that_never_finishes_gets_408_and_holds_nothing(small_search):
    for url in _serve(make_app(small_search, 3, RetrieveLimits(body_timeout_s=0.5))):
        port = int(url.rsplit(":", 1)[1])
        stalled = []
        for _ in range(4):  # more stalled bodies than the server has event loops
            s = socket.create_connection(("127.0.0.1", port), timeout=10)
            s.sendall(
                b"POST /retrieve HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                b'Content-Length: 1000\r\n\r\n{"queries": ['
            )
            stalled.append(s)
        r, dt = _post(url, {"queries": ["born"], "topk": 1})  # served meanwhile
        assert r.status_code == 200 and dt < 5
        for s in stalled:
            answer = b""
            while chunk := s.recv(4096):  # until the server closes the connection
                answer += chunk
            s.close()
            assert answer.startswith(b"HTTP/1.1 408"), answer[:100]
            assert b"connection: close" in answer.lower()
            assert b"not received within 0.5 s" in answer


def test_request_time_budget_stops_a_slow_request(small_search):
    slow = WithLatency(
        small_search, LatencyModel(LatencyConfig(kind="lognormal", median_s=0.05, sigma=0.01))
    )
    for url in _serve(make_app(slow, 3, RetrieveLimits(time_budget_s=0.2))):
        r, dt = _post(url, {"queries": ["born"] * 100})
        assert r.status_code == 503 and "time budget of 0.2 s after" in r.json()["detail"]
        assert dt < 2  # 100 queries would take 5 s


def test_client_url_encodes_document_ids_and_reports_refusals(bounded, small_search):
    from provrl.env.search import QueryError

    client = HttpSearch(bounded)
    hit = small_search.search("born", 1)[0]
    assert client.open(hit.doc_id) == small_search.open(hit.doc_id)
    for tricky in ("../health", "a/b", "x?y=1", "d#0", "%2e%2e", " "):
        assert client.open(tricky) is None  # never another route, never a crash
    with pytest.raises(QueryError, match="refused the query: queries\\[0\\]: 600 char"):
        client.search("x" * 600, 3)
    client.close()


def test_backend_bounds_terms_chars_and_time(small_world):
    from provrl.env.search import MAX_QUERY_TERMS, QueryError
    from provrl.env.sqlite_index import SqliteSearch, cached_index

    s = SqliteSearch(cached_index(small_world))
    ok = " ".join(f"w{i}" for i in range(MAX_QUERY_TERMS))
    assert s.search(ok, 3) == []  # at the bound: served
    with pytest.raises(QueryError, match="65 distinct terms"):
        s.search(ok + " w999", 3)
    with pytest.raises(QueryError, match="characters"):
        s.search("born " * 1000, 3)
    tight = SqliteSearch(cached_index(small_world), time_budget_s=1e-9)
    with pytest.raises(QueryError, match="time budget"):
        tight.search("people born in the city", 3)
    assert s.search("born", 2)  # the budget is per instance and per query
    s.close()
    tight.close()


def _mocked(handler, **kw) -> HttpSearch:
    """A client whose requests ``handler`` answers (no socket)."""
    client = HttpSearch("http://retriever", backoff_s=0.0, **kw)
    client._client = httpx.Client(transport=httpx.MockTransport(handler))
    return client


RESULT = {"result": [[{"document": {"id": "d1#0", "contents": '"T"\ntext'}, "score": 1.0}]]}


def test_client_retries_refused_connections_and_overloaded_answers_then_gives_up():
    from provrl.env.search import SearchError

    failures = [httpx.ConnectError("Connection refused"), 503]

    def flaky(request: httpx.Request) -> httpx.Response:
        if failures:
            f = failures.pop(0)
            if isinstance(f, Exception):
                raise f
            return httpx.Response(f, json={"detail": "busy"})
        return httpx.Response(200, json=RESULT)

    client = _mocked(flaky, retries=2)
    assert [h.doc_id for h in client.search("q", 1)] == ["d1"] and client.retried == 2
    failures[:] = [httpx.ConnectError("Connection refused")] * 2
    with pytest.raises(SearchError, match=r"/retrieve failed \(2 tries\): Connection refused"):
        _mocked(flaky, retries=1).search("q", 1)

    def slow(request: httpx.Request) -> httpx.Response:
        raise httpx.ReadTimeout("slow")

    timed_out = _mocked(slow, retries=2)
    with pytest.raises(TimeoutError):  # the query had its time: not retried
        timed_out.search("q", 1)
    assert timed_out.retried == 0


def test_preflight_names_a_dead_retriever_in_one_line_and_accepts_a_search_r1_server():
    from provrl.env.search import SearchError

    with pytest.raises(SearchError) as e:
        HttpSearch("http://127.0.0.1:9", timeout_s=0.5, retries=0).check()
    assert "search backend http://127.0.0.1:9 does not answer" in str(e.value)
    assert "env.search.url" in str(e.value) and "\n" not in str(e.value)

    def search_r1(request: httpx.Request) -> httpx.Response:  # /retrieve only, no /health
        if request.url.path == "/retrieve":
            return httpx.Response(200, json=RESULT)
        return httpx.Response(404, json={"detail": "Not Found"})

    _mocked(search_r1).check()
    with pytest.raises(SearchError, match="GET /health answered HTTP 404 and"):
        _mocked(lambda r: httpx.Response(404, json={"detail": "Not Found"})).check()


def test_tool_failures_count_failed_searches_and_opens_only():
    from types import SimpleNamespace

    from provrl.provenance import ToolCall
    from provrl.rollout.agent import CALL_LIMIT, QUERY_REFUSED, tool_failures

    calls = [
        ToolCall(0, "search", "a"),
        ToolCall(1, "search", "b", False, "service down"),
        ToolCall(2, "open", "d1", False, "timed out"),
        ToolCall(3, "search", "c", False, CALL_LIMIT),  # never reached the tool
        ToolCall(4, "invalid", "<sarch>", False, "malformed"),
        ToolCall(5, "answer", "x"),
        ToolCall(6, "search", "x" * 600, False, f"{QUERY_REFUSED}: 600 characters"),  # ran, ok
    ]
    traj = SimpleNamespace(tool_calls=calls)
    assert tool_failures([traj, traj]) == {
        "tool_calls_run": 8,
        "tool_errors": 4,
        "tool_error_rate": 4 / 8,
    }
    assert tool_failures([])["tool_error_rate"] == 0.0

"""Fuzz: the ``/retrieve`` handler (in-process, through the ASGI app and its body limit) and
the BM25 backend it calls, on arbitrary bodies and queries."""

from __future__ import annotations

import json

import pytest
from fuzz_json import JSON
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from provrl.env.search import QueryError, RetrieveLimits

LIMITS = RetrieveLimits(max_body_bytes=16 << 10, max_queries=16, max_topk=50, max_results=200)


@pytest.fixture(scope="module")
def backend(small_world):
    from provrl.env.sqlite_index import SqliteSearch, cached_index

    s = SqliteSearch(cached_index(small_world))
    yield s
    s.close()


@pytest.fixture(scope="module")
def client(backend):
    from fastapi.testclient import TestClient

    from provrl.env.http_search import make_app

    with TestClient(make_app(backend, 3, LIMITS)) as c:
        yield c


QUERY = st.text(max_size=60) | st.lists(
    st.sampled_from(["born", "the", "people", "of", "Employees", '"', "*", "NEAR", "OR", "(",
                     ")", "-", ":", "^", "\x00", "🙂", "a" * 50]), max_size=20
).map(" ".join)  # fmt: skip
BODY = st.one_of(
    JSON,
    st.fixed_dictionaries(
        {"queries": st.lists(QUERY, max_size=20) | JSON},
        optional={"topk": st.integers(-5, 10**6) | JSON, "return_scores": JSON},
    ),
)


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(BODY)
def test_retrieve_answers_every_body_without_a_server_error(client, body):
    r = client.post(
        "/retrieve", content=json.dumps(body), headers={"content-type": "application/json"}
    )
    assert r.status_code in (200, 413, 422), (r.status_code, r.text[:200])
    if r.status_code == 200:
        res = r.json()["result"]
        assert len(res) == len(body["queries"]) and all(len(x) <= LIMITS.max_topk for x in res)
    else:
        assert isinstance(r.json()["detail"], str | list)


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(st.binary(max_size=300))
def test_retrieve_survives_arbitrary_bytes(client, raw):
    r = client.post("/retrieve", content=raw, headers={"content-type": "application/json"})
    assert r.status_code in (200, 400, 413, 422), r.status_code


@settings(
    max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(QUERY, st.integers(0, 60))
def test_backend_answers_any_query_or_refuses_it(backend, query, k):
    try:
        hits = backend.search(query, k)
    except QueryError:
        return
    assert len(hits) <= k
    assert all(h.score >= 0 and h.passage_id.startswith(h.doc_id) for h in hits)
